"""Ray's notices on the driver that the run's own error line says better.

When a worker process dies, the raylet sends every driver a paragraph ("A worker died or was killed while
executing a task by an unexpected system error ...") that lands before the run's one-line error naming the
rank, its pid and the stage. The driver drops that paragraph; every other raylet message (out of memory,
nodes lost) still prints. MSRL_DEBUG=1 keeps everything."""
import os

DEATH_NOTICE = "A worker died or was killed while executing a task by an unexpected system error"


def _without_death_notices(data: dict) -> dict:
    """``data`` (Ray's record of lines to print) less the raylet's worker-death paragraphs."""
    if data.get("pid") != "raylet":
        return data
    return dict(data, lines=[line for line in data.get("lines", []) if not line.lstrip().startswith(DEATH_NOTICE)])


def drop_worker_death_notices() -> bool:
    """Filter the driver's printer of cluster error messages (Ray's ``print_to_stdstream``, looked up by
    name when each message arrives). False where this Ray has no such printer or MSRL_DEBUG=1."""
    if os.environ.get("MSRL_DEBUG") == "1":
        return False
    import ray._private.worker as ray_worker
    printer = getattr(ray_worker, "print_to_stdstream", None)
    if printer is None:
        return False
    if getattr(printer, "drops_death_notices", False):
        return True

    def filtered(data, ignore_prefix):
        data = _without_death_notices(data)
        if data.get("lines"):
            printer(data, ignore_prefix=ignore_prefix)
    filtered.drops_death_notices = True
    ray_worker.print_to_stdstream = filtered
    return True
