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


def pin_groups(groups, plan) -> Dict[str, List[int]]:
    """Pin every group's ranks when ``MSRL_PIN_CORES=1`` (else nothing); returns the cores by role."""
    if os.environ.get(ENV, "0") != "1":
        return {}
    cores = core_plan(plan, sorted(os.sched_getaffinity(0)))
    for role, ranks in cores.items():
        group = groups[role]
        group.wait([a.pin_cores.remote([c]) for a, c in zip(group.actors, ranks)], "pin_cores")
    return cores
