import os

# keep any Ray started by tests on loopback (before anything imports ray)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
