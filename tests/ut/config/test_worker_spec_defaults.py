"""worker_spec's default section name in its errors, and the rollout choice seeing the actor's model
section (a Qwen2 head-size mismatch keeps rollout_backend=auto on transformers)."""
import pytest

from mindspeed_rl.plan import rollout_spec as rs
from mindspeed_rl.plan import worker_spec as ws
from mindspeed_rl.config_cls.generate_config import GenerateConfig
from mindspeed_rl.config_cls.megatron_config import MegatronConfig
from mindspeed_rl.config_cls.rl_config import RLConfig


def test_errors_name_actor_config_by_default():
    actor = MegatronConfig({}, {})
    actor.lr = float("nan")
    with pytest.raises(ValueError, match=r"^actor_config\.lr=nan must be a finite number$"):
        ws.worker_spec(actor, RLConfig({}), GenerateConfig({"rollout_backend": "hf"}))


def test_rollout_choice_reads_the_actor_model_section(monkeypatch):
    monkeypatch.setattr(rs, "vllm_version", lambda: "0.0-test")  # as if vLLM were installed
    actor = MegatronConfig({"model": "m"}, {"m": {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 2,
                                                  "kv_channels": 48, "add_qkv_bias": True}})
    spec = ws.worker_spec(actor, RLConfig({}), GenerateConfig({"rollout_backend": "auto"}))
    assert spec.rollout.backend == "hf"
    assert "hidden_size / num_attention_heads = 64, the model section sets kv_channels=48" in spec.rollout.reason
