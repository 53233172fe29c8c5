"""``MSRL_PIN_CORES=1``: every worker rank runs on a CPU core of its own, as every rank has a device of its own on
accelerators (benchmarks: an idle rank's core is not lent to another). The actor ranks take the first cores, then
the critic's, then the rollout engines' (colocate_async: each engine on its trainer rank's core)."""
import os
from typing import Dict, List

ENV = "MSRL_PIN_CORES"


def core_plan(plan, cores: List[int]) -> Dict[str, List[int]]:
    """role -> the core of each rank; ValueError (one line) when the ranks outnumber the cores."""
    out, used = {}, 0
    spec = plan.asynchronous
    for role in plan.roles:
        size = plan.for_group(role).layout.world_size
        if role == "rollout" and spec is not None and spec.colocated:
            out[role] = list(out["actor"])
            continue
        out[role] = [cores[i] for i in range(used, used + size) if i < len(cores)]
        if len(out[role]) < size:
            raise ValueError(f"{ENV}=1: the run's {sum(plan.for_group(r).layout.world_size for r in plan.roles)} "
                             f"worker ranks need as many cores; this machine lets the run use {len(cores)}")
        used += size
    return out


def placement_cores(placement: str, ranks: int, cores: List[int]) -> List[List[int]]:
    """The cores of each of ``ranks`` processes: 'pinned' one of ``cores`` each, in order (as ``core_plan``;
    ValueError when too few), 'shared' all of them each (a rank that idles lends its cores to the others)."""
    cores = sorted(int(c) for c in cores)
    if placement == "shared":
        return [list(cores) for _ in range(ranks)]
    if placement != "pinned":
        raise ValueError(f"placement must be 'pinned' or 'shared', got {placement!r}")
    if ranks > len(cores):
        raise ValueError(f"{ENV}=1: {ranks} ranks need as many cores; this machine lets the run use {len(cores)}")
    return [[c] for c in cores[:ranks]]


def pin_process(cores) -> List[int]:
    """Run this process on ``cores`` alone with as many torch threads (a worker rank's ``pin_cores``, a benchmark's
    engine); returns the cores it runs on."""
    import torch
    os.sched_setaffinity(0, set(int(c) for c in cores))
    torch.set_num_threads(len(cores))
    return sorted(os.sched_getaffinity(0))


def pin_groups(groups, plan) -> Dict[str, List[int]]:
    """Pin every group's ranks when ``MSRL_PIN_CORES=1`` (else nothing); returns the cores by role."""
    if os.environ.get(ENV, "0") != "1":
        return {}
    cores = core_plan(plan, sorted(os.sched_getaffinity(0)))
    for role, ranks in cores.items():
        group = groups[role]
        group.wait([a.pin_cores.remote([c]) for a, c in zip(group.actors, ranks)], "pin_cores")
    return cores
