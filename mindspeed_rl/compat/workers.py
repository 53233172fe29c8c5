"""Upstream's rank-side dock path (mindspeed_rl.workers.upstream_io), under the compat package's names."""
from mindspeed_rl.workers.upstream_io import UpstreamGroupIO, UpstreamWorkerIO  # noqa: F401
