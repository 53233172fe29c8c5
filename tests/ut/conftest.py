import pytest

from mindspeed_rl.utils.ray_utils import init_ray, shutdown_ray


@pytest.fixture(scope="module")
def local_ray():
    """A loopback-only local Ray for one test module (joined if one is running)."""
    started = init_ray(num_cpus=2)
    yield
    if started:
        shutdown_ray()
