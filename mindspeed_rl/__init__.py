"""mindspeed-rl: GRPO post-training with data-parallel sequence-length balance."""
import os

# Local Ray clusters stay on this machine (must be set before ray is imported).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

__version__ = "0.1.0"
