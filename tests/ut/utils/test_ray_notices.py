"""The raylet's worker-death paragraph is dropped on the driver; its other messages still print."""
import inspect

import pytest
import ray._private.worker as ray_worker

from mindspeed_rl.utils import ray_notices

NOTICE = ray_notices.DEATH_NOTICE + ". To troubleshoot the problem, check the logs for the dead worker. Worker ID: ab"


@pytest.fixture
def printer(monkeypatch):
    monkeypatch.delenv("MSRL_DEBUG", raising=False)
    printed = []
    monkeypatch.setattr(ray_worker, "print_to_stdstream",
                        lambda data, ignore_prefix: printed.append((data["pid"], data["lines"], ignore_prefix)))
    return printed


def test_the_death_paragraph_is_dropped_and_other_messages_print(printer):
    assert ray_notices.drop_worker_death_notices()
    ray_worker.print_to_stdstream({"lines": [NOTICE], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert printer == []
    memory = "Task was killed due to the node running low on memory."
    ray_worker.print_to_stdstream({"lines": [NOTICE, memory], "pid": "raylet", "is_err": False},
                                  ignore_prefix=False)
    # a worker's own line that quotes the notice is not the raylet's
    ray_worker.print_to_stdstream({"lines": [NOTICE], "pid": 4242, "is_err": True}, ignore_prefix=True)
    assert printer == [("raylet", [memory], False), (4242, [NOTICE], True)]
    assert ray_notices.drop_worker_death_notices()  # a second call does not wrap twice
    ray_worker.print_to_stdstream({"lines": ["  " + NOTICE], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert len(printer) == 2


def test_debug_keeps_everything(printer, monkeypatch):
    monkeypatch.setenv("MSRL_DEBUG", "1")
    assert not ray_notices.drop_worker_death_notices()
    ray_worker.print_to_stdstream({"lines": [NOTICE], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert printer == [("raylet", [NOTICE], False)]


def test_this_rays_error_listener_prints_through_the_filtered_name():
    # the filter works because Ray looks the printer up by name for each cluster error message
    source = inspect.getsource(ray_worker.listen_error_messages)
    assert "print_to_stdstream(" in source and '"pid": "raylet"' in source
