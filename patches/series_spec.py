"""What goes into each upstream patch series (read by build_series.py).

Each step is one patch file. Its files are either package-sourced (the file
of our package, with the declared adaptations applied in order) or the
upstream edits stored under patches/src/<commit>/<step>/<path>.diff.
"""
from dataclasses import dataclass
from typing import Dict, List, Tuple


@dataclass(frozen=True)
class Replace:
    """Replace ``old`` by ``new``; ``old`` must occur exactly once."""
    old: str
    new: str
    why: str


@dataclass(frozen=True)
class Rehome:
    """Replace every ``old`` (at least one) by ``new``: our module paths to upstream's."""
    old: str
    new: str
    why: str


@dataclass(frozen=True)
class Append:
    """Append our own ``text`` (top-level code) at the end of the file."""
    text: str
    why: str


@dataclass(frozen=True)
class KeepUpstream:
    """Append upstream's own top-level functions ``names``, taken from the
    upstream original of the same file (never stored here)."""
    names: Tuple[str, ...]
    why: str


@dataclass(frozen=True)
class UpstreamFirstLine:
    """Put upstream's first line (its copyright comment) on top."""
    why: str


@dataclass(frozen=True)
class Package:
    path: str                 # relative to the repository root, same in both trees
    adaptations: tuple = ()
    upstream_has: bool = False  # True: one whole-file hunk over upstream's file
    dest: str = ""            # path in the upstream tree when it differs from ``path``

    @property
    def target(self) -> str:
        return self.dest or self.path


@dataclass(frozen=True)
class Step:
    name: str                 # patch file name without .patch
    package: Tuple[Package, ...] = ()


HOME = "mindspeed_rl/balance"          # the balancer's home in our package
SB = f"{HOME}/seqlen_balancing.py"
UPSTREAM_SB = "mindspeed_rl/utils/seqlen_balancing.py"

# our balance package is upstream's utils package in the patched tree
_REHOME = Rehome("mindspeed_rl.balance.", "mindspeed_rl.utils.", "the balancer's modules sit in upstream's utils")

_DOC_SYNC = Replace(
    "array or torch tensor; lists of item indices come out. Nothing here talks to\n"
    "torch.distributed; syncing counts across ranks lives in ``dist_sync``.\n",
    "array or torch tensor; lists of item indices come out. The micro-batch count\n"
    "of ``rearrange_micro_batches`` is synced over ranks through ``dist_sync``.\n",
    "upstream's rearrange_micro_batches syncs the count; the docstring says so")

_RENAME_PACK = Replace(
    "def rearrange_micro_batches(seqlen_list, max_token_len: int,\n"
    "                            min_num_micro_batches",
    "def _pack_micro_batches(seqlen_list, max_token_len: int,\n"
    "                        min_num_micro_batches",
    "our local packing keeps its body; the public name gets upstream's signature")

_COPYRIGHT = UpstreamFirstLine("upstream's files open with its copyright line")

_REVERSE_IDX = KeepUpstream(("get_reverse_idx",), "upstream callers import it from this module")

# upstream at 7466375: rearrange_micro_batches(seqlen_list, max_token_len, dp_group=None)
_WRAP_7466375 = '''

def rearrange_micro_batches(seqlen_list, max_token_len: int, dp_group=None,
                            min_num_micro_batches: Optional[int] = None) -> List[List[int]]:
    """Capped micro-batches, the same count on every rank of ``dp_group``
    (the default group when None): the largest count any rank needs."""
    parts = _pack_micro_batches(seqlen_list, max_token_len, min_num_micro_batches)
    count = sync_micro_batch_count(len(parts), dp_group)
    if count > len(parts):
        parts = _pack_micro_batches(seqlen_list, max_token_len, count)
    return parts
'''

# upstream head: rearrange_micro_batches(seqlen_list, max_token_len, dynamic_max_batch_size, dp_group)
_WRAP_05A90D7 = '''

def rearrange_micro_batches(seqlen_list: List[int], max_token_len: int, dynamic_max_batch_size: int = None,
                            dp_group=None):
    """Capped micro-batches, at least ceil(n / dynamic_max_batch_size) of them
    and the same count on every rank of ``dp_group``. Multimodal batches keep
    upstream's bin packing (their cap is per modality)."""
    if is_multimodal():
        return balanced_bin_packing(seqlen_list=seqlen_list, max_capacity=max_token_len)
    min_count = -(-len(seqlen_list) // dynamic_max_batch_size) if dynamic_max_batch_size else None
    partitions = _pack_micro_batches(seqlen_list, max_token_len, min_count)
    count = sync_micro_batch_count(len(partitions), dp_group)
    if count > len(partitions):
        partitions = _pack_micro_batches(seqlen_list, max_token_len, count)
    return partitions
'''

_IMPORTS = ("import heapq\n", "from mindspeed_rl.utils.partition_exact import exact_equal_partition\n")

SEQLEN_7466375 = Package(SB, upstream_has=True, dest=UPSTREAM_SB, adaptations=(
    _REHOME,
    _COPYRIGHT,
    _DOC_SYNC,
    Replace(_IMPORTS[0], "import copy\n" + _IMPORTS[0], "get_reverse_idx uses copy"),
    Replace(_IMPORTS[1], "from mindspeed_rl.utils.dist_sync import sync_micro_batch_count\n" + _IMPORTS[1],
            "the count sync of upstream's signature"),
    _RENAME_PACK,
    Append(_WRAP_7466375, "upstream's signature with dp_group"),
    _REVERSE_IDX,
))

SEQLEN_05A90D7 = Package(SB, upstream_has=True, dest=UPSTREAM_SB, adaptations=(
    _REHOME,
    _COPYRIGHT,
    _DOC_SYNC,
    Replace(_IMPORTS[0], "import copy\n" + _IMPORTS[0], "get_reverse_idx uses copy"),
    Replace(_IMPORTS[1], "from mindspeed_rl.utils import is_multimodal\n"
                         "from mindspeed_rl.utils.dist_sync import sync_micro_batch_count\n" + _IMPORTS[1],
            "the count sync and the multimodal branch of upstream's signature"),
    _RENAME_PACK,
    KeepUpstream(("balanced_bin_packing", "_balance_bins", "heapq_partition_with_max"),
                 "upstream's public names (multimodal packing) stay"),
    Append(_WRAP_05A90D7, "upstream's signature with dynamic_max_batch_size and dp_group"),
    _REVERSE_IDX,
))

# new files, taken from the package unchanged
BALANCER_FILES = tuple(Package(f"{HOME}/{name}.py", dest=f"mindspeed_rl/utils/{name}.py")
                       for name in ("partition_refine", "partition_exact", "workload")) + (
    Package("mindspeed_rl/utils/dist_sync.py"),)
PLAN = Package(f"{HOME}/balance_plan.py", dest="mindspeed_rl/trainer/utils/balance_plan.py", adaptations=(_REHOME,))

SERIES: Dict[str, List[Step]] = {
    "7466375": [
        Step("0001-DP-balance-near-optimal-sequence-length-balancer", BALANCER_FILES + (SEQLEN_7466375,)),
        Step("0002-DP-balance-per-round-balance-plan-in-the-transfer-do", (PLAN,)),
        Step("0003-DP-balance-config-trainer-and-worker-plumbing"),
        Step("0004-docs-DP-batch-balance-section-in-the-remove-padding-"),
    ],
    "05a90d7": [
        Step("0001-DP-balance-near-optimal-sequence-length-balancer", BALANCER_FILES + (SEQLEN_05A90D7,)),
        Step("0002-DP-balance-per-round-balance-plan-in-the-transfer-do", (PLAN,)),
        Step("0003-DP-balance-per-round-balance-plan-in-the-transfer-qu"),
        Step("0004-DP-balance-balance-settings-from-rl_config-to-the-tr"),
        Step("0005-docs-describe-the-DP-batch-balance-plan-and-balancer"),
    ],
}


# ---------------------------------------------------------------- verl
# Series for verl releases (patches/verl/<version>/), built by the same
# machinery. Package files land under verl/utils/ (``dest``); verl's own files
# are changed by the stored edits under patches/src/verl/<version>/<step>/.

_VERL_IMPORTS = Replace(
    "from mindspeed_rl.utils.partition_exact import exact_equal_partition\n"
    "from mindspeed_rl.utils.partition_refine import ",
    "from verl.utils.partition_exact import exact_equal_partition\n"
    "from verl.utils.partition_refine import ",
    "the helpers sit in verl.utils")

_VERL_DOC = Replace(
    '"""Sequence-length balancing: split item workloads into partitions of equal load.\n',
    '"""Balanced partitions behind verl.utils.seqlen_balancing (from MindSpeed-RL\'s balancer).\n'
    "\n"
    "Split item workloads into partitions of equal load.\n",
    "say which verl module calls it")

VERL_BALANCER_FILES = tuple(
    Package(f"{HOME}/{name}.py", dest=f"verl/utils/{name}.py")
    for name in ("partition_refine", "partition_exact", "workload")
) + (Package(SB, dest="verl/utils/balanced_partitions.py", adaptations=(_REHOME, _VERL_DOC, _VERL_IMPORTS)),)

VERL_SERIES: Dict[str, List[Step]] = {
    "0.9.1": [
        Step("0001-DP-balance-refined-partitioner-and-workload-model", VERL_BALANCER_FILES),
        Step("0002-DP-balance-seqlen_balancing-uses-the-refined-partit"),
        Step("0003-DP-balance-trainer.balance_batch_partitioner-switch"),
    ],
}
