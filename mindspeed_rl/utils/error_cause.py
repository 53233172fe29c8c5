"""The cause of a failed save or load, as the library gave it, in one line.

torch.distributed.checkpoint wraps every rank's failure in a ``CheckpointException`` whose text
is the flattened traceback of each rank; torch's C++ writer turns a full disk into
``unexpected pos ...`` and keeps the OS error only as the exception's context. ``cause`` digs out
the rank's own exception and, where one is in its chain, the OS error that started it."""
import errno
import os
import re
import shutil
from contextlib import contextmanager
from typing import Optional

# OS errors of the storage itself: reported in place of the library error they caused
STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM}
LOW_SPACE_BYTES = 1 << 20


def root_exception(err: BaseException) -> BaseException:
    """The first rank's own exception of a DCP ``CheckpointException`` (else ``err``), or the storage
    OS error in its cause / context chain."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        first = failures[min(failures)]
        inner = first[0] if isinstance(first, tuple) else first
        if isinstance(inner, BaseException):
            err = inner
    seen, link = set(), err
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, OSError) and link.errno in STORAGE_ERRNOS:
            return link
        link = link.__cause__ or link.__context__
    return err


def cause(err: BaseException) -> str:
    """``Type: message`` of ``root_exception(err)``, whitespace folded to one line."""
    root = root_exception(err)
    return " ".join(f"{type(root).__name__}: {root}".split())


def free_bytes(path: str) -> Optional[int]:
    """Bytes free for this user on the file system holding ``path`` (its nearest existing parent)."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path or ".").free
    except OSError:
        return None


def storage_cause(folder: str, err: BaseException) -> str:
    """``cause(err)``; when the library hid a full disk (torch's writer: 'unexpected pos ...'), the
    file system's free space first, then what the library said."""
    text = cause(err)
    if "No space left on device" not in text:
        free = free_bytes(folder)
        if free is not None and free < LOW_SPACE_BYTES:
            text = f"No space left on device ({free} bytes free on the file system of {folder}); the library said: {text}"
    return text


SHAPE_HINTS = ("Missing key in checkpoint", "Size mismatch", "size mismatch", "Unexpected key")


def failure_text(folder: str, err: BaseException) -> str:
    """``storage_cause``, plus a hint when the checkpoint's tensors do not fit the model."""
    text = storage_cause(folder, err)
    if any(h in text for h in SHAPE_HINTS):
        text += " (the model's shape differs from the checkpoint's: model_path or the model section changed?)"
    return text


@contextmanager
def named_failure(action: str, folder: str, error_cls=RuntimeError):
    """Turn any failure of the body into one ``error_cls`` line ``<action> <folder> failed: <cause>``
    (errors of ``error_cls`` itself pass through). DCP's CheckpointException is a BaseException."""
    try:
        yield
    except error_cls:
        raise
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # noqa: BLE001
        raise error_cls(f"{action} {folder!r} failed: {failure_text(folder, err)}") from err


BRIEF_CHARS = 600

# Ray's words (GCS) when an actor died with its node, and when the node was declared dead by health checks
_NODE_DIED = re.compile(r"its node has died\. Node Id: (\w+)\s*(?:the actor's node was (terminated[^\n]*))?")
_MISSED_HEARTBEATS = "missing too many heartbeats"


def node_death(raw: str) -> str:
    """' with its node <id> (<ip>): <how it ended>' when Ray's actor error says the actor's node died, else ''.
    A node that missed Ray's health checks is said to be marked dead (on a busy machine a live node can be)."""
    found = _NODE_DIED.search(raw)
    if not found:
        return ""
    ip = re.search(r"\bip:\s*(\S+)", raw)
    node = f"node {found.group(1)}" + (f" ({ip.group(1)})" if ip else "")
    how = " ".join((found.group(2) or "").split())
    if _MISSED_HEARTBEATS in raw:
        return (f" with its {node}: the node was marked dead by Ray's health checks ({how}; a busy or stalled "
                f"machine misses them)")
    return f" with its {node}: the node " + (f"was {how}" if how else "died")


def brief(err: BaseException) -> str:
    """A rank's error in one line: the remote exception itself, not Ray's
    traceback around it, cut to about ``BRIEF_CHARS``."""
    import ray  # a rank's errors reach the driver wrapped by Ray
    inner = getattr(err, "cause", None) if isinstance(err, ray.exceptions.RayTaskError) else None
    if isinstance(inner, BaseException):
        err = inner
    if isinstance(err, ray.exceptions.RayActorError):
        raw = str(err)
        cls, pid = re.search(r"class_name:\s*(\S+)", raw), re.search(r"\bpid:\s*(\d+)", raw)
        who = f"actor {cls.group(1)}" if cls else "a Ray actor"
        text = f"{who}{f' (pid {pid.group(1)})' if pid else ''} died{node_death(raw)} ({type(err).__name__})"
    else:
        text = cause(err)  # a DCP failure as the rank's own error, a full disk as the OS error
    text = " ".join(text.split())
    # cut in the middle: the cause is usually at the end
    return text if len(text) <= BRIEF_CHARS else text[:BRIEF_CHARS // 3] + " ... " + text[-(2 * BRIEF_CHARS // 3):]
