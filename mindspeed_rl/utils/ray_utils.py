"""Starting and joining Ray: a loopback-only local cluster unless RAY_ADDRESS is set."""
import os
import tempfile
from typing import Optional

import ray


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
    os.makedirs(temp_dir, exist_ok=True)
    ray.init(_node_ip_address="127.0.0.1", num_cpus=num_cpus, include_dashboard=False,
             _temp_dir=os.path.abspath(temp_dir), **kwargs)
    return True
