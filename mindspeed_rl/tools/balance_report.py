"""Old path of ``mindspeed_rl.reports.balance_report`` (a face: the same module object, named by string so this low
package imports nothing above it); ``python -m mindspeed_rl.tools.balance_report`` still runs it."""
import importlib
import sys

_home = importlib.import_module("mindspeed_rl.reports.balance_report")
if __name__ == "__main__":
    sys.exit(_home.main())
sys.modules[__name__] = _home
