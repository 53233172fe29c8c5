"""Failures of a save or a load end in one line naming the library's own cause: the rank's error
inside DCP's CheckpointException (a missing key), the OS error behind torch's writer (a full disk)."""
import os
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from mindspeed_rl.utils import error_cause
from mindspeed_rl.utils.checkpoint import CheckpointError
from mindspeed_rl.workers.scheduler.launcher import brief

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP in one process without a process group says so
        yield


def _failure(fn):
    try:
        fn()
    except BaseException as err:  # noqa: BLE001  (DCP's CheckpointException is a BaseException)
        return err
    raise AssertionError("no failure")


def test_missing_key_of_a_changed_model_shape_is_named_without_the_traceback(tmp_path):
    two = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    three = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    dcp.save({"model": two.state_dict()}, checkpoint_id=str(tmp_path))
    err = _failure(lambda: dcp.load({"model": three.state_dict()}, checkpoint_id=str(tmp_path)))
    assert "Traceback" in str(err)  # what a plain str() printed
    assert error_cause.cause(err) == "RuntimeError: Missing key in checkpoint state_dict: model.2.weight."
    text = error_cause.failure_text(str(tmp_path), err)
    assert text.startswith("RuntimeError: Missing key") and "the model's shape differs" in text
    assert brief(err) == "RuntimeError: Missing key in checkpoint state_dict: model.2.weight."


@needs_dev_full
def test_full_disk_under_dcp_is_named_as_the_os_error(tmp_path):
    shard = tmp_path / "dcp" / "__0_0.distcp"
    shard.parent.mkdir()
    os.symlink("/dev/full", shard)  # every write to the shard fails as on a full disk
    err = _failure(lambda: dcp.save({"w": torch.ones(1000)}, checkpoint_id=str(shard.parent)))
    assert "Traceback" in str(err)  # the rank's flattened traceback, the OS error deep inside
    assert error_cause.cause(err) == "OSError: [Errno 28] No space left on device"


@needs_dev_full
def test_a_full_disk_torch_hides_is_found_from_the_free_space(tmp_path, monkeypatch):
    os.symlink("/dev/full", tmp_path / "rank0.pt")
    err = _failure(lambda: torch.save({"a": torch.ones(3)}, str(tmp_path / "rank0.pt")))
    assert "No space left on device" not in error_cause.cause(err)
    assert "No space left" not in error_cause.storage_cause(str(tmp_path), err)  # this disk has room
    monkeypatch.setattr(error_cause, "free_bytes", lambda path: 0)
    text = error_cause.storage_cause(str(tmp_path), err)
    assert text == (f"No space left on device (0 bytes free on the file system of {tmp_path}); the library said: "
                    f"{error_cause.cause(err)}")


def test_named_failure_is_one_line_and_lets_its_own_errors_through(tmp_path):
    with pytest.raises(CheckpointError) as info:
        with error_cause.named_failure("saving checkpoint into", str(tmp_path), CheckpointError):
            raise OSError(28, "No space left on device")
    assert str(info.value) == f"saving checkpoint into '{tmp_path}' failed: OSError: [Errno 28] No space left on device"
    with pytest.raises(CheckpointError, match="^as it was$"):
        with error_cause.named_failure("x", str(tmp_path), CheckpointError):
            raise CheckpointError("as it was")
    with pytest.raises(KeyboardInterrupt):
        with error_cause.named_failure("x", str(tmp_path), CheckpointError):
            raise KeyboardInterrupt


def test_brief_cuts_in_the_middle_keeping_the_cause():
    text = brief(RuntimeError("saving into '" + "/very/long/path" * 80 + "' failed: OSError: No space left on device"))
    assert len(text) < 620 and text.endswith("No space left on device") and " ... " in text


NODE = "77f8198b174f8338edeeb965a0dfa5375cb1bf7d19b10ffcf4940dd5"


def _died_with_node(how):
    """Ray's own ActorDiedError for an actor whose node died; the GCS's words (Ray 2.60) after the node id."""
    import ray
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    text = f"The actor died because its node has died. Node Id: {NODE}"
    text += f"\n\tthe actor's node was {how}" if how else ""
    return ray.exceptions.ActorDiedError(ActorDiedErrorContext(
        class_name="IntegratedWorker", actor_id=bytes(16), pid=25881, node_ip_address="127.0.0.1",
        error_message=text))


def test_an_actor_that_died_with_its_node_names_the_node_and_how_it_ended():
    assert brief(_died_with_node("terminated expectedly: received SIGTERM")) == (
        f"actor IntegratedWorker (pid 25881) died with its node {NODE} (127.0.0.1): the node was terminated "
        f"expectedly: received SIGTERM (ActorDiedError)")
    assert brief(_died_with_node(None)) == (
        f"actor IntegratedWorker (pid 25881) died with its node {NODE} (127.0.0.1): the node died (ActorDiedError)")


def test_a_node_that_missed_the_health_checks_is_said_to_be_marked_dead():
    text = brief(_died_with_node("terminated unexpectedly: health check failed due to missing too many heartbeats"))
    assert text == (f"actor IntegratedWorker (pid 25881) died with its node {NODE} (127.0.0.1): the node was marked "
                    f"dead by Ray's health checks (terminated unexpectedly: health check failed due to missing too "
                    f"many heartbeats; a busy or stalled machine misses them) (ActorDiedError)")
    assert error_cause.node_death("The actor died unexpectedly before finishing this task.\n\tpid: 1") == ""
