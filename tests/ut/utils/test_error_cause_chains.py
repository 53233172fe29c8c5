"""error_cause without DCP: the cause / context chain it follows, the failures it reads, the free space it
asks for, and the words it adds."""
import errno
import shutil
import threading
from collections import namedtuple

import pytest

from mindspeed_rl.utils import error_cause

HINT = " (the model's shape differs from the checkpoint's: model_path or the model section changed?)"


def _chained(outer, inner, explicit=True):
    """``outer`` raised while ``inner`` was handled: with ``raise ... from`` (its __cause__) or without (only
    its __context__)."""
    try:
        try:
            raise inner
        except BaseException as err:  # noqa: BLE001
            if explicit:
                raise outer from err
            raise outer
    except BaseException as err:  # noqa: BLE001
        return err


def test_the_storage_os_error_is_found_through_an_explicit_or_an_implicit_chain():
    full = OSError(errno.ENOSPC, "No space left on device")
    explicit = _chained(RuntimeError("unexpected pos 64"), full)
    assert error_cause.root_exception(explicit) is full
    implicit = _chained(RuntimeError("unexpected pos 64"), OSError(errno.EDQUOT, "Disk quota exceeded"),
                        explicit=False)
    assert implicit.__cause__ is None and isinstance(implicit.__context__, OSError)
    assert error_cause.cause(implicit) == "OSError: [Errno 122] Disk quota exceeded"
    only_cause = RuntimeError("write failed")  # a __cause__ set without a __context__
    only_cause.__cause__ = OSError(errno.EROFS, "Read-only file system")
    assert only_cause.__context__ is None
    assert error_cause.cause(only_cause) == "OSError: [Errno 30] Read-only file system"
    deeper = _chained(ValueError("outer"), _chained(RuntimeError("middle"), full))
    assert error_cause.root_exception(deeper) is full


def test_an_os_error_that_is_not_the_storages_stays_behind_the_library_error():
    missing = _chained(RuntimeError("could not open the shard"), FileNotFoundError(errno.ENOENT, "No such file"))
    assert error_cause.cause(missing) == "RuntimeError: could not open the shard"
    assert error_cause.root_exception(missing) is missing
    plain = OSError(errno.ENOENT, "No such file")
    assert error_cause.root_exception(plain) is plain


def _in_thread(fn, *args):
    """``fn(*args)`` in a daemon thread, waited for at most a minute: an endless loop fails the test."""
    out = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "root_exception did not end on a chain that loops"
    return out[0]


def test_a_chain_that_loops_back_ends_with_the_error_itself():
    first, second = RuntimeError("first"), ValueError("second")
    first.__context__, second.__context__ = second, first
    assert _in_thread(error_cause.root_exception, first) is first
    storage = OSError(errno.EIO, "Input/output error")
    third = RuntimeError("third")
    third.__context__, storage.__context__ = storage, third  # the storage error is in the loop: found
    assert _in_thread(error_cause.root_exception, third) is storage


class _Failures(BaseException):
    """Like DCP's CheckpointException: a ``failures`` dict of rank -> (exception, traceback) or exception."""

    def __init__(self, failures):
        super().__init__("rank failures")
        self.failures = failures


def test_the_first_ranks_own_error_is_taken_from_the_failures():
    one, three = RuntimeError("rank 1"), RuntimeError("rank 3")
    assert error_cause.root_exception(_Failures({3: (three, "tb"), 1: (one, "tb")})) is one
    assert error_cause.root_exception(_Failures({2: one})) is one  # not wrapped in a tuple
    empty = _Failures({})
    assert error_cause.root_exception(empty) is empty
    not_an_error = _Failures({0: ("text", "tb")})
    assert error_cause.root_exception(not_an_error) is not_an_error


@pytest.fixture
def usage_of(monkeypatch):
    """shutil.disk_usage records the paths asked for; each has 5 bytes free."""
    asked = []
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: asked.append(path) or usage(10, 5, 5))
    return asked


def test_free_space_is_asked_of_the_nearest_existing_folder(tmp_path, usage_of):
    assert error_cause.free_bytes(str(tmp_path / "not" / "made")) == 5
    assert error_cause.free_bytes(str(tmp_path)) == 5
    assert error_cause.free_bytes("no_such_relative_folder/x") == 5  # nothing of it exists: the working folder
    assert usage_of == [str(tmp_path), str(tmp_path), "."]


def test_free_space_that_cannot_be_read_is_none(monkeypatch):
    def refuse(path):
        raise PermissionError(errno.EACCES, "denied", path)
    monkeypatch.setattr(shutil, "disk_usage", refuse)
    assert error_cause.free_bytes("/") is None


def test_a_low_free_space_is_named_once_and_only_below_the_limit(tmp_path, monkeypatch):
    folder = str(tmp_path)
    hidden = RuntimeError("unexpected pos 128")
    free = {folder: error_cause.LOW_SPACE_BYTES}
    monkeypatch.setattr(error_cause, "free_bytes", lambda path: free.get(path, 1 << 40))
    assert error_cause.storage_cause(folder, hidden) == "RuntimeError: unexpected pos 128"  # exactly the limit
    free[folder] = error_cause.LOW_SPACE_BYTES - 1
    assert error_cause.storage_cause(folder, hidden) == (
        f"No space left on device ({error_cause.LOW_SPACE_BYTES - 1} bytes free on the file system of {folder}); "
        f"the library said: RuntimeError: unexpected pos 128")
    said = OSError(errno.ENOSPC, "No space left on device")  # the library said it itself: not twice
    assert error_cause.storage_cause(folder, said) == "OSError: [Errno 28] No space left on device"
    assert error_cause.failure_text(folder, hidden).startswith(
        f"No space left on device ({error_cause.LOW_SPACE_BYTES - 1} bytes free on the file system of {folder})")


@pytest.mark.parametrize("words", error_cause.SHAPE_HINTS)
def test_a_shape_mismatch_gets_the_hint_word_for_word(tmp_path, words):
    err = RuntimeError(f"{words} for model.0.weight")
    assert error_cause.failure_text(str(tmp_path), err) == f"RuntimeError: {words} for model.0.weight{HINT}"
    assert error_cause.failure_text(str(tmp_path), RuntimeError("other")) == "RuntimeError: other"


def test_a_dead_node_without_an_address_is_named_by_its_id_alone():
    raw = "The actor died because its node has died. Node Id: abc123"
    assert error_cause.node_death(raw) == " with its node abc123: the node died"
    assert error_cause.node_death(raw + "\n\tip: 10.0.0.7") == " with its node abc123 (10.0.0.7): the node died"

