"""Rollout backends register themselves by name: the names come from the backend modules' files, a new module
is a new backend (no other file changes), an unknown or unregistered name is one error."""
import sys
from types import SimpleNamespace

import pytest

from mindspeed_rl.models.rollout import registry
from mindspeed_rl.models.rollout.hf_backend import HFRollout
from mindspeed_rl.plan.rollout_spec import BACKENDS


def test_the_shipped_backends_and_the_plan_know_the_same_names():
    assert registry.backend_names() == ("hf", "vllm")
    assert BACKENDS == ("auto", "hf", "vllm")


def test_the_hf_backend_is_built_by_name():
    actor = object()
    backend = registry.make_backend(SimpleNamespace(backend="hf", returns_log_probs=True), actor, "m", "cpu", 0, 1, 7)
    assert isinstance(backend, HFRollout) and backend.actor is actor and backend.log_probs is True


@pytest.fixture
def backends_folder(tmp_path, monkeypatch):
    """A package of backend modules of our own, scanned instead of models/rollout/."""
    pkg = tmp_path / "fake_backends"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_FOLDER", str(pkg))
    monkeypatch.setattr(registry, "_PACKAGE", "fake_backends")
    monkeypatch.setattr(registry, "_FACTORIES", {})
    yield pkg
    for name in [m for m in sys.modules if m.startswith("fake_backends")]:
        del sys.modules[name]


def test_a_new_module_is_a_new_backend(backends_folder):
    (backends_folder / "echo_backend.py").write_text(
        "from mindspeed_rl.models.rollout.registry import register_backend\n"
        "@register_backend('echo')\n"
        "def make(spec, actor, model_path, device, rank, world_size, seed, trust_remote_code):\n"
        "    return ('echo', actor, model_path, device, rank, world_size, seed, trust_remote_code)\n")
    (backends_folder / "helpers.py").write_text("")  # not a backend: no _backend suffix
    assert registry.backend_names() == ("echo",)
    assert registry.make_backend(SimpleNamespace(backend="echo"), "A", "m", "cpu", 1, 2, 3, True) == (
        "echo", "A", "m", "cpu", 1, 2, 3, True)
    # remote code is trusted only when asked
    assert registry.make_backend(SimpleNamespace(backend="echo"), "A", "m", "npu", 0, 1, 0)[-2:] == (0, False)


def test_unknown_and_unregistered_names_are_one_error(backends_folder):
    (backends_folder / "mute_backend.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match=r"unknown rollout backend 'nope'; known: \['mute'\]"):
        registry.make_backend(SimpleNamespace(backend="nope"), None, "m", "cpu", 0, 1, 0)
    with pytest.raises(ValueError, match=r"fake_backends.mute_backend registers no rollout backend named 'mute'"):
        registry.make_backend(SimpleNamespace(backend="mute"), None, "m", "cpu", 0, 1, 0)


def test_a_name_registered_twice_is_refused(backends_folder):
    registry.register_backend("twice")(lambda *a: 1)
    with pytest.raises(ValueError, match="rollout backend 'twice' is registered twice"):
        registry.register_backend("twice")(lambda *a: 2)
