import pytest

from mindspeed_rl.utils.ray_utils import init_ray, shutdown_ray


@pytest.fixture(scope="session", autouse=True)
def shared_local_ray():
    """One local Ray for all system tests (each run() joins it)."""
    started = init_ray(num_cpus=2)
    yield
    if started:
        shutdown_ray()
