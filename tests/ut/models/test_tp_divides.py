"""Which modules tensor parallel splits (the HF plan, or the fallback by name), what it refuses before it splits
anything, and how it names a family (meta-device models)."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from mindspeed_rl.models import sharding
from mindspeed_rl.models.tiny_model import tiny_config
from ut.models.test_tp_styles import LLAMA, QWEN3_NORMS


class PlanError(Exception):
    pass


class PlanOnly:  # a config object whose class name does not end in "Config"
    base_model_tp_plan = {"norm": "sequence_parallel"}


class NoPlan:  # no HF plan at all: the fallback plan splits the attention
    num_attention_heads = 4


def _meta(family, plan, **overrides):
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides))
    model.config.base_model_tp_plan = dict(plan)
    return model


def test_a_split_linear_tp_does_not_divide_is_named_by_module_and_side():
    # colwise splits a linear's outputs, rowwise its inputs; the first split module in plan order is named
    odd_mlp = _meta("llama", LLAMA, intermediate_size=130, num_key_value_heads=4)
    with pytest.raises(PlanError, match=r"^tensor_model_parallel_size=4 does not divide "
                                        r"model\.layers\.0\.mlp\.gate_proj\.out_features=130$"):
        sharding.check_tp_divides(odd_mlp, 4, error_cls=PlanError)
    rows_only = _meta("llama", {"layers.*.mlp.down_proj": "rowwise"}, intermediate_size=130)
    with pytest.raises(PlanError, match=r"^tensor_model_parallel_size=4 does not divide "
                                        r"model\.layers\.0\.mlp\.down_proj\.in_features=130$"):
        sharding.check_tp_divides(rows_only, 4, error_cls=PlanError)
    sharding.check_tp_divides(odd_mlp, 2, error_cls=PlanError)  # 130 splits in two
    sharding.check_tp_divides(odd_mlp, 1, error_cls=PlanError)  # no split, nothing to divide


def test_split_heads_are_checked_and_weights_kept_whole_are_not():
    six_heads = _meta("llama", LLAMA, num_attention_heads=6, num_key_value_heads=6, hidden_size=96)
    with pytest.raises(ValueError, match=r"^tensor_model_parallel_size=4 does not divide the model's "
                                         r"num_attention_heads=6$"):
        sharding.check_tp_divides(six_heads, 4)
    # Qwen3's q_norm / k_norm stay whole on every tp rank: they have no features to divide
    sharding.check_tp_divides(_meta("qwen3", QWEN3_NORMS), 2)


def test_a_config_alone_checks_heads_and_the_mlp_width():
    with pytest.raises(ValueError, match=r"^tensor_model_parallel_size=4 does not divide the model's "
                                         r"num_key_value_heads=2$"):
        sharding.check_tp_divides(tiny_config("llama"), 4)
    with pytest.raises(ValueError, match=r"^tensor_model_parallel_size=2 does not divide the model's "
                                         r"intermediate_size=129$"):
        sharding.check_tp_divides(tiny_config("llama", intermediate_size=129), 2)
    sharding.check_tp_divides(PlanOnly(), 2)  # a config without head or width fields has nothing to check


def test_splits_attention_by_the_plan_or_by_default():
    assert sharding.splits_attention(_meta("llama", LLAMA))
    assert sharding.splits_attention(NoPlan())
    assert not sharding.splits_attention(_meta("llama", {"layers.*.mlp.down_proj": "rowwise"}))


def test_a_family_is_the_config_class_without_its_config_suffix():
    assert sharding.replicated_lines(PlanOnly()) == [
        "tensor parallel: PlanOnly norm style 'sequence_parallel' is not applied: this engine splits decoder "
        "layers only; the module stays replicated over tp"]
    assert sharding.replicated_lines(_meta("llama", {**LLAMA, "norm": "sequence_parallel"}))[0].startswith(
        "tensor parallel: Llama norm style")


def test_without_an_hf_plan_the_fallback_splits_each_layers_linears_by_name():
    model = _meta("llama", {})  # an empty HF plan: TP_PLAN by module name
    model.model.layers[1].mlp.up_proj = torch.nn.Identity()  # named like a split module, but no nn.Linear
    want = {f"model.layers.{i}.{name}": kind for i in range(2) for name, kind in sharding.TP_PLAN.items()}
    del want["model.layers.1.mlp.up_proj"]
    assert sharding.tp_plan(model) == want
    model.config = NoPlan()  # a config object without the attribute at all
    assert sharding.tp_plan(model) == want
    assert sharding.replicated_over_tp(NoPlan()) == [] and sharding.replicated_lines(NoPlan()) == []


def test_a_weight_kept_whole_does_not_end_the_check_of_the_modules_after_it():
    model = _meta("qwen3", QWEN3_NORMS, intermediate_size=130)
    plan = {"model.layers.0.self_attn.q_norm": "grad_sum", "model.layers.0.mlp.gate_proj": "colwise"}
    with pytest.raises(ValueError, match=r"gate_proj\.out_features=130$"):
        sharding.check_tp_divides(model, 4, plan=plan)


def test_fsdp_without_a_data_parallel_dimension_is_refused():
    with pytest.raises(ValueError, match=r"^FSDP needs a data-parallel size above 1 in the mesh's 'dp' dimension$"):
        sharding.parallelize(torch.nn.Linear(2, 2), None, sharding.ParallelSpec(fsdp=True))


def test_the_first_pattern_naming_a_module_decides_and_the_later_patterns_still_count():
    model = _meta("llama", {"layers.*.self_attn.q_proj": "colwise", "layers.0.self_attn.q_proj": "rowwise",
                            "layers.*.mlp.down_proj": "rowwise"})
    assert sharding.tp_plan(model) == {
        "model.layers.0.self_attn.q_proj": "colwise", "model.layers.1.self_attn.q_proj": "colwise",
        "model.layers.0.mlp.down_proj": "rowwise", "model.layers.1.mlp.down_proj": "rowwise"}


class ExpertPlan:
    base_model_tp_plan = {"layers.*.mlp.experts": "moe_tp_experts"}


def test_moe_experts_stay_whole_and_say_why():
    assert sharding.replicated_over_tp(ExpertPlan()) == [sharding.ReplicatedOverTP(
        "layers.*.mlp.experts", "moe_tp_experts",
        "is not applied by this engine: the MoE experts stay whole (FSDP shards them over dp)")]


class ExpertsAndShared:  # MoE experts kept whole do not keep the rest of their block whole
    base_model_tp_plan = {"layers.*.mlp.experts": "moe_tp_experts", "layers.*.mlp.shared_experts.up_proj": "colwise"}


def test_experts_left_whole_leave_the_shared_linears_of_their_block_split():
    assert [(r.pattern, r.style) for r in sharding.replicated_over_tp(ExpertsAndShared())] == [
        ("layers.*.mlp.experts", "moe_tp_experts")]


def test_a_plan_naming_a_parameter_or_a_norm_says_why_it_is_not_applied():
    model = _meta("llama", {"layers.*.self_attn.q_proj.weight": "colwise", "layers.*.input_layernorm": "rowwise",
                            "layers.*.mlp.down_proj": "rowwise"})
    assert {r.pattern: r.reason for r in sharding.replicated_over_tp(model)} == {
        "layers.*.self_attn.q_proj.weight": "is not applied: it names a parameter, not a module",
        "layers.*.input_layernorm": "is not applied: LlamaRMSNorm is not an nn.Linear"}
    assert set(sharding.tp_plan(model)) == {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"}
