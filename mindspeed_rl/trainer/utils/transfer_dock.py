"""Upstream's module path of the transfer dock: our driver dock (mindspeed_rl.data.driver_dock), and upstream's
pull API (mindspeed_rl.compat.transfer_dock) imported on first use."""
from mindspeed_rl._lazy import lazy_exports
from mindspeed_rl.data.driver_dock import (LENGTH_COLUMNS, PROMPT_COLUMNS, DriverDock, QueueRound,  # noqa: F401
                                           group_rows, plan_columns)
from mindspeed_rl.data.row_lists import column_parts, trans_input_to_experience  # noqa: F401

_COMPAT = "mindspeed_rl.compat.transfer_dock"
__getattr__, __dir__ = lazy_exports(__name__, {"TransferDock": _COMPAT, "PullDock": _COMPAT,
                                               "GRPOTransferDock": _COMPAT})
