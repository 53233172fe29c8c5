"""Upstream MindSpeed-RL's own GRPO/DAPO configs (tests/data/upstream_configs, kept as shipped) load and plan."""
import os
import re
import warnings
from pathlib import Path

import pytest

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.loader import ConfigError
from mindspeed_rl.plan.run_plan import PlanError
from mindspeed_rl.reports.memory_plan import GB, plan_memory
from mindspeed_rl.utils.megatron_format import find_megatron_checkpoint

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests/data/upstream_configs"
UPSTREAM = sorted(DATA.glob("*/configs/*.yaml")) + sorted(DATA.glob("*/tests/st/configs/*.yaml"))
TINY = ROOT / "configs/grpo_tiny_cpu.yaml"


def _build(path, *overrides):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfgs = build_configs(load_config(path, list(overrides)))
    return cfgs, [str(w.message) for w in caught]


def test_all_twenty_are_here():
    names = [str(p.relative_to(DATA)) for p in UPSTREAM]
    assert len(names) == 20
    assert sum("/ppo_" in n for n in names) == 1
    assert sum(n.startswith("2f84bab/") for n in names) == 4
    assert sum("/grpo_" in n for n in names if n.startswith("05a90d7/")) == 9
    assert sum("/dapo_" in n for n in names) == 6


@pytest.mark.parametrize("path", UPSTREAM, ids=lambda p: str(p.relative_to(DATA)))
def test_upstream_config_loads_and_plans(path, capsys):
    raw = load_config(path)
    cfgs, notes = _build(path)
    actor, plan = cfgs.actor_config, cfgs.plan
    layout = plan.layout
    folded = (actor.pipeline_model_parallel_size * actor.context_parallel_size
              * actor.expert_model_parallel_size)
    assert layout.world_size == raw["rl_config"]["actor_resource"]["num_npus"]
    assert layout.dp * layout.tp == layout.world_size
    err = capsys.readouterr().err
    if folded > 1:
        assert layout.asked and layout.engine == "fsdp"
        assert [line for line in err.splitlines() if line.startswith("layout:")] == [layout.note]
    else:
        assert not layout.asked and "layout:" not in err
    memory = plan_memory(cfgs)
    assert memory.total > 0 and memory.params > 0
    # every key the file sets either does something or is named in a note
    known = ("is not implemented", "does not exist", "actor_update_dispatch_size", "below the longest possible",
             "has no effect")
    assert all(any(k in n for k in known) for n in notes), notes


def test_layout_substitution_runs_the_same_devices_and_plans_what_runs(capsys):
    path = DATA / "2f84bab/configs/grpo_qwen25_7b_A3.yaml"  # TP 2 x PP 2 on 16 devices
    cfgs, _ = _build(path)
    layout = cfgs.plan.layout
    assert (layout.world_size, layout.dp, layout.tp, layout.engine) == (16, 8, 2, "fsdp")
    assert layout.asked == "TP=2 x PP=2 x DP=4"
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("layout:")]
    assert len(lines) == 1
    assert "asks for TP=2 x PP=2 x DP=4 on 16 devices; runs DP=8 x TP=2" in lines[0]
    assert "pipeline parallelism is not implemented" in lines[0]
    # the memory plan is the one of the layout that runs: the same as asking DP 8 x TP 2 directly
    direct, _ = _build(path, "actor_config.pipeline_model_parallel_size=1")
    assert not direct.plan.layout.asked
    assert plan_memory(cfgs) == plan_memory(direct)


CONFIGS = DATA / "05a90d7/configs"
QWEN3, QWEN3_MOE, DEEPSEEK = "grpo_qwen3_8b_A3", "dapo_qwen3_30b_a3b_A3", "grpo_deepseek_r1_671b_A3"
MODEL_OF = {QWEN3: "qwen3_8b", QWEN3_MOE: "qwen3_30b_a3b", DEEPSEEK: "deepseekv3_671b"}


def _hf_splits_mla() -> bool:
    """Whether the installed transformers' DeepSeek-V3 TP plan splits MLA by heads (5.25: yes; 5.19: no)."""
    from transformers import AutoConfig

    from mindspeed_rl.models.sharding import splits_attention
    return splits_attention(AutoConfig.for_model("deepseek_v3"))


MLA_SPLIT = _hf_splits_mla()


@pytest.mark.parametrize("config,sizes,refused", [
    (QWEN3, {"ffn_hidden_size": 12289}, "ffn_hidden_size=12289"),
    (QWEN3, {"num_query_groups": 3}, "num_query_groups=3"),
    # Qwen3-MoE: every layer is MoE and experts are not split over TP, so neither MLP width matters
    (QWEN3_MOE, {"ffn_hidden_size": 8193, "moe_ffn_hidden_size": 769}, None),
    (QWEN3_MOE, {"num_attention_heads": 33}, "num_attention_heads=33"),
    # DeepSeek-V3: MLA is whole on TP peers where the HF plan leaves it whole, split by heads where it splits
    # it (mla_kv_a_proj); the first_k_dense_replace dense MLPs and the shared experts split
    (DEEPSEEK, {"num_attention_heads": 127}, "num_attention_heads=127" if MLA_SPLIT else None),
    (DEEPSEEK, {"ffn_hidden_size": 18433}, "ffn_hidden_size=18433"),
    (DEEPSEEK, {"ffn_hidden_size": 18433, "first_k_dense_replace": 0}, None),
    (DEEPSEEK, {"moe_ffn_hidden_size": 2049}, "moe_ffn_hidden_size * n_shared_experts (shared experts)=2049"),
    (DEEPSEEK, {"moe_ffn_hidden_size": 2049, "n_shared_experts": 2}, None),
])
def test_tp_divisibility_is_what_the_engine_splits_per_family(config, sizes, refused):
    from mindspeed_rl.models.sharding import check_tp_divides
    from mindspeed_rl.reports.memory_plan import meta_model
    model = MODEL_OF[config]
    path = CONFIGS / f"{config}.yaml"
    # fewer layers for a quick meta model (DeepSeek keeps its 61: its num_layer_list names them)
    shape = [] if config == DEEPSEEK else [f"model.{model}.num_layers=2"]
    shape += [f"model.{model}.{k}={v}" for k, v in sizes.items()]
    tp2 = shape + ["actor_config.tensor_model_parallel_size=2"]
    # the engine's own check, on the model of the section with the installed family's HF TP plan
    actor = _build(path, *shape, "actor_config.tensor_model_parallel_size=1")[0].actor_config
    if refused:
        with pytest.raises(ValueError, match="tensor_model_parallel_size=2 does not divide"):
            check_tp_divides(meta_model(actor), 2)
    else:
        check_tp_divides(meta_model(actor), 2)
    # the config's check agrees
    if refused:
        try:
            _build(path, *tp2)
        except PlanError as err:
            assert re.search("tensor_model_parallel_size=2 does not divide the model's " + re.escape(refused),
                             str(err)), str(err)
        else:
            pytest.fail("the config's TP check let through a layout the engine refuses")
    else:
        assert _build(path, *tp2)[0].plan.layout.tp == 2


def test_whole_batch_mini_batch_and_dispatch_sizes_as_upstream():
    cfgs, notes = _build(DATA / "2f84bab/tests/st/configs/test_grpo_trainer_qwen25_7b_integrated.yaml")
    assert cfgs.plan.mini_batch_rows == cfgs.plan.rows_per_round == 4 * 8
    cfgs, notes = _build(DATA / "2f84bab/configs/grpo_qwen25_32b_A2.yaml")  # actor_update_dispatch_size: 64
    assert cfgs.plan.stage("actor_train").rows_per_share == 64 * 16 // 2
    assert any("actor_update_dispatch_size=64 only sizes upstream's update fetches" in n for n in notes)
    # a size that would cut upstream's mini-batches unevenly is refused, naming the multiple to give
    with pytest.raises(ValueError, match="not a multiple of the rows a rank trains per optimizer step"):
        _build(TINY, "rl_config.actor_update_dispatch_size=12")


def test_noop_layers_and_num_layer_list():
    # as upstream's 235B config: 96 = 94 layers + 2 identity layers that pad the pipeline stages
    cfgs, _ = _build(TINY, "actor_config.num_layers=4", "megatron_training.noop_layers='0,3'",
                     "actor_config.pipeline_model_parallel_size=2", "actor_config.num_layer_list='2,2'")
    base, _ = _build(TINY)
    assert cfgs.actor_config.num_layers == base.actor_config.num_layers == 2
    with pytest.raises(ConfigError, match="num_layer_list='3,3' must give pipeline_model_parallel_size=2"):
        _build(TINY, "actor_config.pipeline_model_parallel_size=2", "actor_config.num_layer_list='3,3'")


def test_dapo_and_unused_keys_warn_with_what_runs():
    _, notes = _build(TINY, "rl_config.clip_higher_enable=true", "rl_config.actor_max_packing_token_size=300",
                      "megatron_training.recompute_granularity=full")
    assert not any(n.startswith("rl_config.clip_higher_enable") for n in notes)  # DAPO keys are carried out
    assert any("recompute_granularity='full' is not implemented: no activation recomputation" in n for n in notes)
    cfgs, _ = _build(TINY, "rl_config.use_dynamic_bsz=true", "rl_config.max_packing_token_size=9000",
                     "rl_config.actor_max_packing_token_size=5000", "rl_config.update_max_packing_token_size=7000")
    assert cfgs.rl_config.max_packing_token_size == 5000  # one budget for every pass: the smallest


def test_tokenizer_folder_is_the_weights_and_a_missing_weights_only_load_loads_nothing(tmp_path):
    hf = tmp_path / "Qwen-HF"
    hf.mkdir()
    cfgs, _ = _build(TINY, f"megatron_training.tokenizer_name_or_path={hf}")
    assert cfgs.actor_config.model_path == str(hf)
    cfgs, notes = _build(TINY, f"megatron_training.tokenizer_name_or_path={hf}",
                         f"megatron_training.load={tmp_path / 'tp2-pp2'}", "megatron_training.no_load_optim=true",
                         "megatron_training.no_load_rng=true")
    assert cfgs.actor_config.model_path == str(hf) and cfgs.actor_config.load is None
    assert any("does not exist: nothing is loaded from it" in n for n in notes)


def _touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").close()


@pytest.mark.parametrize("files,root", [
    (["release/mp_rank_00/model_optim_rng.pt", "latest_checkpointed_iteration.txt"], ""),
    (["iter_0000100/mp_rank_00_000/model_optim_rng.pt", "iter_0000100/mp_rank_01_000/model_optim_rng.pt"], ""),
    (["iter_0000100/mp_rank_00_000_003/model_optim_rng.pt"], "iter_0000100"),
    (["iter_0000002/common.pt", "iter_0000002/metadata.json", "iter_0000002/__0_0.distcp"], ""),
])
def test_megatron_checkpoint_is_named_with_the_key_to_give(tmp_path, files, root):
    for name in files:
        _touch(tmp_path / name)
    if "latest_checkpointed_iteration.txt" in files:
        (tmp_path / "latest_checkpointed_iteration.txt").write_text("release\n")
    load = tmp_path / root if root else tmp_path
    assert find_megatron_checkpoint(str(load)) is not None
    with pytest.raises(ConfigError) as err:
        _build(TINY, f"megatron_training.load={load}", "megatron_training.finetune=true",
               "megatron_training.tokenizer_name_or_path=./Qwen2.5-7B")
    text = str(err.value)
    assert "\n" not in text and "is a Megatron-format checkpoint" in text
    assert "megatron_training.model_path" in text and "'./Qwen2.5-7B'" in text


def test_our_checkpoints_and_hf_folders_are_not_megatron(tmp_path):
    _touch(tmp_path / "ours/iter_0000004/dcp/.metadata")
    _touch(tmp_path / "ours/iter_0000004/rng/rank0.pt")
    (tmp_path / "ours/latest_checkpointed_iteration.txt").write_text("4\n")
    _touch(tmp_path / "hf/config.json")
    _touch(tmp_path / "hf/model.safetensors")
    for folder in ("ours", "ours/iter_0000004", "hf", "missing"):
        assert find_megatron_checkpoint(str(tmp_path / folder)) is None


@pytest.mark.parametrize("override,message", [
    ("rl_config.use_dp_batch_balanse=true",
     "rl_config: unknown key 'use_dp_batch_balanse'; did you mean 'use_dp_batch_balance'?"),
    ("actor_config.tensor_model_paralel_size=1",
     "actor_config: unknown key 'tensor_model_paralel_size'; did you mean 'tensor_model_parallel_size'?"),
    ("generate_config.sampling_config.temprature=1.0",
     "generate_config.sampling_config: unknown key 'temprature'; did you mean 'temperature'?"),
    ("model.tiny_qwen2.num_layer=2", "model tiny_qwen2: unknown key 'num_layer'; did you mean 'num_layers'?"),
    ("rl_config.verifier_function=['base_ac']",
     "rl_config.verifier_function: unknown verifier 'base_ac' (did you mean 'base_acc'"),
])
def test_typos_name_the_section_and_the_closest_key(override, message):
    with pytest.raises(ConfigError) as err:
        _build(TINY, override)
    assert message in str(err.value)


def test_a_tp_style_never_seen_loads_plans_and_is_named(monkeypatch):
    from transformers import AutoConfig
    cls = type(AutoConfig.for_model("deepseek_v3"))
    plan = {**cls.base_model_tp_plan, "layers.*.self_attn.kv_a_proj_with_mqa": "style_from_the_future"}
    monkeypatch.setattr(cls, "base_model_tp_plan", plan)
    cfgs, _ = _build(CONFIGS / f"{DEEPSEEK}.yaml")  # no error
    assert cfgs.plan.layout.tp > 1
    memory = plan_memory(cfgs)
    assert ("tensor parallel: DeepseekV3 layers.*.self_attn.kv_a_proj_with_mqa style 'style_from_the_future' is "
            "not applied by this engine; the module stays replicated over tp") in memory.replicated
