"""vLLM's import-time notices are off before vLLM is imported, unless VLLM_LOGGING_LEVEL asks for them."""
import logging
import warnings

import pytest

from mindspeed_rl.models.rollout import vllm_backend

LOGGER = "vllm.triton_utils.importing"


@pytest.fixture
def clean(monkeypatch):
    logger = logging.getLogger(LOGGER)
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        yield logger


def _reduce_op_warning_shown():
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn("`torch.distributed.reduce_op` is deprecated, please use ReduceOp", FutureWarning)
    return bool(caught)


def test_by_default_the_triton_notice_and_the_deprecation_warning_are_off(clean):
    assert _reduce_op_warning_shown()
    vllm_backend.quiet_vllm_import()
    assert clean.level == logging.ERROR
    assert not clean.isEnabledFor(logging.WARNING) and clean.isEnabledFor(logging.ERROR)
    assert not _reduce_op_warning_shown()
    import os
    assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"


@pytest.mark.parametrize("level", ["info", "WARNING", "DEBUG"])
def test_a_level_that_asks_for_notices_keeps_them(clean, monkeypatch, level):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", level)
    vllm_backend.quiet_vllm_import()
    assert clean.level == logging.NOTSET and _reduce_op_warning_shown()


def test_only_the_reduce_op_future_warning_is_silenced(clean):
    vllm_backend.quiet_vllm_import()
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn("another FutureWarning", FutureWarning)
        warnings.warn("`torch.distributed.reduce_op` is deprecated", DeprecationWarning)
    assert [type(w.message) for w in caught] == [FutureWarning, DeprecationWarning]
