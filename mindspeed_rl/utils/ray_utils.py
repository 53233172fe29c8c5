"""Starting and joining Ray: a loopback-only local cluster unless RAY_ADDRESS is set."""
import logging
import os
import shutil
import tempfile
from typing import Optional

import ray


_OWN_TEMP_DIRS = []  # session folders this process made outside a run folder


def shutdown_ray() -> None:
    """``ray.shutdown()`` and remove the session folders ``init_ray`` made under /tmp."""
    ray.shutdown()
    while _OWN_TEMP_DIRS:
        shutil.rmtree(_OWN_TEMP_DIRS.pop(), ignore_errors=True)


def init_ray(temp_dir: Optional[str] = None, num_cpus: Optional[int] = None, **kwargs) -> bool:
    """Join ``RAY_ADDRESS`` if set, else start a local Ray bound to 127.0.0.1.

    ``temp_dir`` keeps Ray's session files under the run's own folder (Ray
    needs a short path for its sockets, so a long one falls back to /tmp).
    Returns True when this call started Ray (the caller shuts it down).
    """
    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], **kwargs)
        return True
    if temp_dir is None or len(os.path.abspath(temp_dir)) > 60:
        temp_dir = tempfile.mkdtemp(prefix="msrl_ray_")
        _OWN_TEMP_DIRS.append(temp_dir)
    os.makedirs(temp_dir, exist_ok=True)
    # a loopback-only cluster started here: Ray's notice about its token auth is noise on every run
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    ray.init(_node_ip_address="127.0.0.1", num_cpus=num_cpus, include_dashboard=False,
             _temp_dir=os.path.abspath(temp_dir), **kwargs)
    return True
