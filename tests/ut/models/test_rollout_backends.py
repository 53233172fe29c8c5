"""Backend choice, engine sizing and the drift metric (no vLLM engine started)."""
import pytest
import torch

from mindspeed_rl.plan import rollout_spec as rs
from mindspeed_rl.plan.rollout_spec import RolloutSpec, choose_backend
from mindspeed_rl.models.rollout.drift import rollout_drift
from mindspeed_rl.models.rollout.vllm_backend import cpu_bind, kv_cache_bytes


class Section:
    """A model section as the configs hold it (qwen2 unless told)."""
    def __init__(self, **kw):
        base = dict(num_layers=2, hidden_size=64, num_attention_heads=2, ffn_hidden_size=128, kv_channels=None,
                    multi_latent_attention=False, qk_layernorm=False, num_experts=None, add_qkv_bias=True)
        base.update(kw)
        self.__dict__.update(base)


@pytest.fixture
def with_vllm(monkeypatch):
    monkeypatch.setattr(rs, "vllm_version", lambda: "0.32.0")


@pytest.fixture
def without_vllm(monkeypatch):
    monkeypatch.setattr(rs, "vllm_version", lambda: None)


def test_auto_takes_vllm_when_installed_and_the_model_runs(with_vllm):
    backend, why = choose_backend("auto", Section(), "cpu")
    assert backend == "vllm" and "0.32.0" in why


def test_auto_falls_back_to_hf_and_says_why(without_vllm):
    backend, why = choose_backend("auto", Section(), "cpu")
    assert backend == "hf" and "not installed" in why and "bash scripts/install.sh vllm" in why


def test_asking_for_vllm_without_it_is_one_clear_error(without_vllm):
    with pytest.raises(ValueError, match=r"rollout_backend=vllm cannot run: vLLM is not installed; install it with `bash scripts/install.sh vllm`"):
        choose_backend("vllm", Section(), "cpu")


def test_cpu_head_size_decides(with_vllm):
    small = Section(num_attention_heads=4)  # 64 / 4 = 16: vLLM's CPU attention does not run it
    assert choose_backend("auto", small, "cpu")[0] == "hf"
    assert "head sizes" in choose_backend("auto", small, "cpu")[1]
    assert choose_backend("auto", small, "cuda")[0] == "vllm"
    with pytest.raises(ValueError, match="the model's is 16"):
        choose_backend("vllm", small, "cpu")


def test_qwen2_kv_channels_that_vllm_would_ignore_are_refused(with_vllm):
    odd = Section(num_attention_heads=4, kv_channels=32)  # HF honours head_dim=32, vLLM's Qwen2 takes 16
    with pytest.raises(ValueError, match="kv_channels=32"):
        choose_backend("vllm", odd, "cuda")


def test_hf_is_taken_as_asked_and_unknown_names_are_refused(with_vllm):
    assert choose_backend("hf", Section(), "cpu")[0] == "hf"
    with pytest.raises(ValueError, match="rollout_backend='sglang' must be one of"):
        choose_backend("sglang", Section(), "cpu")


def test_spec_reads_the_generate_config_keys(with_vllm):
    from mindspeed_rl.config_cls.generate_config import GenerateConfig
    gen = GenerateConfig({"rollout_backend": "vllm", "max_num_seqs": 7, "max_model_len": 96, "dtype": "fp32",
                          "enable_prefix_caching": True, "gpu_memory_utilization": 0.25,
                          "sampling_config": {"logprobs": 0}})
    spec = rs.rollout_spec(Section(), gen, device_type="cpu")
    assert (spec.backend, spec.max_num_seqs, spec.max_model_len, spec.dtype) == ("vllm", 7, 96, "float32")
    assert spec.enable_prefix_caching and spec.gpu_memory_utilization == 0.25 and spec.returns_log_probs
    assert "vLLM" in spec.describe() and "max_num_seqs=7" in spec.describe()
    gen.sampling_config["logprobs"] = None
    assert not rs.rollout_spec(Section(), gen, device_type="cpu").returns_log_probs
    gen.dtype = "int4"
    with pytest.raises(ValueError, match="generate_config.dtype='int4'"):
        rs.rollout_spec(Section(), gen, device_type="cpu")


def test_vllm_log_probs_add_a_rollout_column_read_by_the_train_stage(with_vllm):
    from mindspeed_rl.plan.loader import build_configs, load_config
    from mindspeed_rl.plan.stages import ROLLOUT, ROLLOUT_LOG_PROBS, TRAIN
    overrides = ["megatron_training.num_attention_heads=2", "megatron_training.num_query_groups=2",
                 "megatron_training.model_path=/tmp/none"]
    plan = build_configs(load_config("configs/grpo_tiny_cpu.yaml",
                                     overrides + ["generate_config.rollout_backend=vllm"])).plan
    assert ROLLOUT_LOG_PROBS in plan.stage(ROLLOUT.name).outputs
    assert ROLLOUT_LOG_PROBS in plan.stage(TRAIN.name).inputs
    plan = build_configs(load_config("configs/grpo_tiny_cpu.yaml",
                                     overrides + ["generate_config.rollout_backend=hf"])).plan
    assert ROLLOUT_LOG_PROBS not in plan.stage(ROLLOUT.name).outputs


def test_cpu_bind_gives_each_rank_its_own_cores():
    assert [cpu_bind(r, 2, [0, 1]) for r in range(2)] == ["0", "1"]
    assert [cpu_bind(r, 2, [0, 1, 2, 3]) for r in range(2)] == ["0,1", "2,3"]
    assert [cpu_bind(r, 4, [0, 1]) for r in range(4)] == ["0", "1", "0", "1"]  # more ranks than cores


def test_kv_cache_holds_max_num_seqs_full_sequences_within_the_memory_share():
    from transformers import Qwen2Config
    cfg = Qwen2Config(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=4)
    spec = RolloutSpec("vllm", "t", max_num_seqs=100, max_model_len=1000, gpu_memory_utilization=0.5)
    per_token = 2 * 4 * 1 * 32 * 4  # k and v, layers, kv heads, head size, fp32 bytes
    need = per_token * 100 * 1000
    assert kv_cache_bytes(cfg, spec, torch.float32, 1, 2 ** 40) >= need
    assert kv_cache_bytes(cfg, spec, torch.float32, 1, 2 ** 40) < 2 * need
    assert kv_cache_bytes(cfg, spec, torch.float32, 2, 2 * 10 ** 8) <= 5 * 10 ** 7  # 0.5 x memory / 2 ranks


def test_drift_is_zero_for_equal_log_probs_and_k3_is_positive_otherwise():
    a = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5])]
    assert rollout_drift(a, [t.clone() for t in a]) == {"actor/rollout_log_prob_abs_diff": 0.0,
                                                        "actor/rollout_log_prob_k3_kl": 0.0}
    b = [torch.tensor([-1.1, -2.0]), torch.tensor([-0.2])]
    out = rollout_drift(a, b)
    assert out["actor/rollout_log_prob_abs_diff"] == pytest.approx((0.1 + 0.0 + 0.3) / 3, rel=1e-5)
    d = torch.tensor([-0.1, 0.0, 0.3])
    assert out["actor/rollout_log_prob_k3_kl"] == pytest.approx(float((torch.expm1(d) - d).mean()), rel=1e-5)
    assert out["actor/rollout_log_prob_k3_kl"] > 0


def test_drift_names_the_row_whose_lengths_differ():
    with pytest.raises(ValueError, match="row 1 has 1 rollout log-probs and 2"):
        rollout_drift([torch.zeros(2), torch.zeros(1)], [torch.zeros(2), torch.zeros(2)])
