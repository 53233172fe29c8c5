"""Old path of ``mindspeed_rl.reports.balance_report``: ``python -m mindspeed_rl.tools.balance_report`` still runs it."""
import sys

from mindspeed_rl.reports.balance_report import *  # noqa: F401,F403  (the names users imported from here)
from mindspeed_rl.reports.balance_report import main

if __name__ == "__main__":
    sys.exit(main())
