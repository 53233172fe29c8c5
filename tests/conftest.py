import os

# keep any Ray started by tests on loopback (before anything imports ray)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


SLOW_FOLDERS = ("tests/st",)  # end-to-end jobs (Ray, real engines, many iterations)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end tests (tests/st); the fast tier for the edit-test loop "
                                       "is -m 'not slow', CI runs everything")


def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath)
    for item in items:
        where = os.path.relpath(str(item.path), root)
        if where.startswith(SLOW_FOLDERS):
            item.add_marker("slow")
