"""Old path of ``mindspeed_rl.reports.memory_plan``: ``python -m mindspeed_rl.tools.memory_plan`` still runs it."""
import sys

from mindspeed_rl.reports.memory_plan import *  # noqa: F401,F403  (the names users imported from here)
from mindspeed_rl.reports.memory_plan import main

if __name__ == "__main__":
    sys.exit(main())
