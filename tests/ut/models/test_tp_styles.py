"""TP styles of an HF plan: what the engine applies, what stays replicated over tp, and why.

The pure checks run on meta-device models with a plan set on their config. The
TP=2 check runs 2 ranks (threads, rank_threads.py) against a single process for plans that
the installed transformers may not give: DeepSeek-V3's MLA split
(``mla_kv_a_proj``, transformers 5.25), the ``_rep`` styles, and a style the
engine has never seen (its block stays whole, the rest is split).
"""
import contextlib
import io

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from mindspeed_rl.models import sharding
from mindspeed_rl.models import causal_lm
from mindspeed_rl.models.causal_lm import CausalLMEngine
from mindspeed_rl.models.tiny_model import build_tiny_checkpoint, tiny_config
from ut.models.engine_cases import engine_data, linear_loss_fn
from ut.models.rank_threads import SerialLoads, run_ranks, serial_loads

N = 8
LLAMA = {
    "layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise",
}
# DeepSeek-V3's plan in transformers 5.25 (MLA split by heads)
DEEPSEEK_MLA = {
    "layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.q_b_proj": "colwise",
    "layers.*.self_attn.kv_a_proj_with_mqa": "mla_kv_a_proj", "layers.*.self_attn.kv_b_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.shared_experts.gate_proj": "colwise", "layers.*.mlp.shared_experts.up_proj": "colwise",
    "layers.*.mlp.shared_experts.down_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise",
}
UNKNOWN = {**LLAMA, "layers.*.self_attn.o_proj": "future_style"}
REP = {**LLAMA, "layers.*.mlp.gate_proj": "colwise_rep", "layers.*.mlp.up_proj": "colwise_rep",
       "layers.*.mlp.down_proj": "rowwise_rep"}
# Qwen3's plan: q_norm / k_norm see only the local heads, their gradients are summed over tp
QWEN3_NORMS = {**LLAMA, "layers.*.self_attn.q_norm": "replicated_with_grad_allreduce",
               "layers.*.self_attn.k_norm": "replicated_with_grad_allreduce"}
# name -> (family, plan, dp): dp=2 puts two tp groups in the world, so a collective on the wrong group shows
CASES = {"deepseek_mla": ("deepseek_v3", DEEPSEEK_MLA, 2), "rep_styles": ("llama", REP, 1),
         "unknown": ("llama", UNKNOWN, 1), "qwen3_norms": ("qwen3", QWEN3_NORMS, 2)}


def _meta(family, plan, **overrides):
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides))
    model.config.base_model_tp_plan = dict(plan)
    return model


def _layer_kinds(plan):
    # "self_attn.q_proj" -> kind, from layer 0 and (DeepSeek's MoE layer) layer 1
    return {name.split(".", 3)[3]: kind for name, kind in sorted(plan.items())}


def test_unknown_style_keeps_its_block_whole_and_is_named():
    plan = {**DEEPSEEK_MLA, "layers.*.self_attn.kv_a_proj_with_mqa": "future_mla"}
    model = _meta("deepseek_v3", plan)
    kinds = _layer_kinds(sharding.tp_plan(model))  # does not raise
    assert not any(name.startswith("self_attn.") for name in kinds)  # the attention block stays whole
    assert kinds["mlp.shared_experts.gate_proj"] == "colwise" and kinds["mlp.down_proj"] == "rowwise"
    replicated = sharding.replicated_over_tp(model)
    assert replicated[0] == ("layers.*.self_attn.kv_a_proj_with_mqa", "future_mla", "is not applied by this engine")
    assert {r.pattern for r in replicated} == {"layers.*.self_attn.kv_a_proj_with_mqa", "layers.*.self_attn.q_b_proj",
                                             "layers.*.self_attn.kv_b_proj", "layers.*.self_attn.o_proj"}
    lines = sharding.replicated_lines(model)
    assert lines[0] == ("tensor parallel: DeepseekV3 layers.*.self_attn.kv_a_proj_with_mqa style 'future_mla' is "
                        "not applied by this engine; the module stays replicated over tp")
    assert ("tensor parallel: DeepseekV3 layers.*.self_attn.o_proj style 'rowwise' is not applied: "
            "layers.*.self_attn.kv_a_proj_with_mqa in the same block has style 'future_mla', which is not "
            "applied, so the block stays whole; the module stays replicated over tp") in lines
    # the heads are not split, so a head count TP does not divide is fine
    assert not sharding.splits_attention(model)
    six_heads = _meta("deepseek_v3", plan, num_attention_heads=6, num_key_value_heads=6)
    sharding.check_tp_divides(six_heads, 4)
    with pytest.raises(ValueError, match="does not divide the model's num_attention_heads=6"):
        sharding.check_tp_divides(_meta("deepseek_v3", DEEPSEEK_MLA, num_attention_heads=6, num_key_value_heads=6), 4)


def test_config_alone_gives_the_same_patterns_without_raising():
    config = tiny_config("deepseek_v3")
    config.base_model_tp_plan = {**DEEPSEEK_MLA, "layers.*.self_attn.kv_a_proj_with_mqa": "future_mla",
                                 "norm": "sequence_parallel"}
    by_config = {(r.pattern, r.style) for r in sharding.replicated_over_tp(config)}
    model = _meta("deepseek_v3", config.base_model_tp_plan)
    # by pattern it also names q_proj, which this model lacks (q_lora_rank is set)
    assert by_config - {(r.pattern, r.style) for r in sharding.replicated_over_tp(model)} == {
        ("layers.*.self_attn.q_proj", "colwise")}
    assert ("norm", "sequence_parallel") in by_config
    assert not sharding.splits_attention(config)


def test_mla_style_is_applied_and_keeps_the_weight_whole():
    model = _meta("deepseek_v3", DEEPSEEK_MLA)
    plan = sharding.tp_plan(model)
    kinds = _layer_kinds(plan)
    assert kinds["self_attn.kv_a_proj_with_mqa"] == "mla_kv_a" and kinds["self_attn.q_b_proj"] == "colwise"
    assert sharding.replicated_over_tp(model) == []
    assert sharding.splits_attention(model)
    name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    shape = tuple(model.get_parameter(name).shape)
    assert sharding.planned_local_numel(name, shape, 1, 2, fsdp=False, plan=plan) == shape[0] * shape[1]
    # a config without qk_rope_head_dim cannot have it applied: the attention block stays whole
    llama = _meta("llama", {**LLAMA, "layers.*.self_attn.k_proj": "mla_kv_a_proj"})
    assert not any(".self_attn." in n for n in sharding.tp_plan(llama))
    assert sharding.replicated_over_tp(llama)[0] == ("layers.*.self_attn.k_proj", "mla_kv_a_proj",
                                                     "is not applied: the config has no qk_rope_head_dim")


def test_moe_expert_styles_leave_the_experts_whole_and_the_rest_split():
    # transformers 5.19's Qwen3-MoE expert entries
    plan = {**LLAMA, "layers.*.mlp.experts": "moe_tp_experts", "layers.*.mlp.experts.gate_up_proj": "packed_colwise",
            "layers.*.mlp.experts.down_proj": "rowwise"}
    model = _meta("qwen3_moe", plan)
    kinds = _layer_kinds(sharding.tp_plan(model))
    assert kinds["self_attn.o_proj"] == "rowwise" and not any(".experts" in n for n in kinds)
    reasons = {r.pattern: r.reason for r in sharding.replicated_over_tp(model)}
    assert "the MoE experts stay whole" in reasons["layers.*.mlp.experts"]
    assert reasons["layers.*.mlp.experts.down_proj"] == ("is not applied: it lies inside layers.*.mlp.experts, "
                                                         "which stays whole")


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama", "qwen3_moe", "deepseek_v3"])
def test_every_style_the_installed_transformers_gives_is_applied_or_named(family):
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_config(family))
    plan = sharding.tp_plan(model)  # never raises
    named = {(r.pattern, r.style) for r in sharding.replicated_over_tp(model)}
    names = [n for n, _ in model.model.named_modules()] + [n for n, _ in model.model.named_parameters()]
    for pattern, style in model.config.base_model_tp_plan.items():
        targets = {n for n in names if sharding._match(n, pattern)}
        if not targets:
            continue  # nothing of that name in the tiny model (e.g. DeepSeek's q_proj with q_lora_rank)
        applied = {n for n in targets if f"model.{n}" in plan}
        # each (pattern, style) is applied everywhere, or named as replicated
        assert applied == targets or (pattern, style) in named, (pattern, style)


# ---------------------------------------------------------------- against one process, TP=2


def _engine(model_dir, mesh=None):
    return CausalLMEngine(model_dir, torch.device("cpu"), use_remove_padding=True, lr=1e-2, eps=1e-2, seed=0,
                          mesh=mesh)


def _full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _run(engine, dp=1, dp_rank=0):
    # this DP rank's share of the rows (all of them in one process); the gradients are the full batch's
    prompts, responses = engine_data(N)
    tokens, mine = sum(r.numel() for r in responses), list(range(dp_rank, N, dp))
    p_local, r_local = [prompts[i] for i in mine], [responses[i] for i in mine]
    micro = [[0, 1, 2], list(range(3, N))] if dp == 1 else [[0, 1], list(range(2, len(mine)))]
    engine.compute_grads(p_local, r_local, micro, linear_loss_fn(mine), tokens, dp_size=dp, with_entropy=False)
    grads = {n: _full(p.grad) for n, p in engine.module.named_parameters()}
    engine.train_step(p_local, r_local, micro, linear_loss_fn(mine), tokens, dp_size=dp, with_entropy=False)
    log_probs, _ = engine.log_probs(prompts, responses, [list(range(N))])
    weights = {n: _full(p) for n, p in engine.module.named_parameters()}
    return {"grads": grads, "weights": weights, "log_probs": log_probs}


@contextlib.contextmanager
def _plan_of(family, plan):
    cls = type(AutoConfig.for_model(family))
    own = "base_model_tp_plan" in cls.__dict__
    saved = cls.__dict__.get("base_model_tp_plan")
    cls.base_model_tp_plan = plan
    try:
        yield
    finally:
        if own:
            cls.base_model_tp_plan = saved
        else:
            del cls.base_model_tp_plan


def _case(rank, family, plan, dp, model_dir):
    engine = _engine(model_dir, sharding.build_mesh("cpu", dp, 2))
    with serial_loads():
        meta = _meta(family, plan)
    out = {"tp2": _run(engine, dp, rank // 2), "params": sharding.local_bytes(engine.module.parameters())}
    out["planned"] = 4 * sum(sharding.planned_local_numel(n, tuple(p.shape), dp, 2, rank // 2, rank % 2, False,
                                                          plan=sharding.tp_plan(meta))
                             for n, p in meta.named_parameters())
    return out


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp_styles")
    return {f: build_tiny_checkpoint(root / f, seed=0, model_type=f) for f in ("llama", "deepseek_v3", "qwen3")}


@pytest.fixture(scope="module", params=list(CASES))
def tp2(request, model_dirs):
    """One case on 2 TP ranks (x dp; threads of this process, rank_threads.py) and on one process;
    what rank 0 said on stderr about the styles left whole."""
    name = request.param
    family, plan, dp = CASES[name]
    with pytest.MonkeyPatch.context() as mp_:
        mp_.setattr(causal_lm, "AutoModelForCausalLM", SerialLoads(causal_lm.AutoModelForCausalLM))
        single = _run(_engine(model_dirs[family]))
        mp_.setattr(sharding, "_SAID", set())  # the case says its lines afresh
        err = io.StringIO()
        with _plan_of(family, plan), contextlib.redirect_stderr(err):
            ranks = run_ranks(2 * dp, _case, family, plan, dp, model_dirs[family])
    return {"case": name, "single": single, "ranks": ranks, "said": err.getvalue()}


def test_only_global_rank_zero_says_what_stays_replicated(monkeypatch, capsys):
    model = _meta("llama", UNKNOWN)
    monkeypatch.setattr(sharding, "_SAID", set())
    monkeypatch.setattr(sharding.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(sharding.dist, "get_rank", lambda: 1)
    sharding._say_replicated(model)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sharding.dist, "get_rank", lambda: 0)
    sharding._say_replicated(model)
    sharding._say_replicated(model)  # once per process
    assert capsys.readouterr().err == "".join(f"{line}\n" for line in sharding.replicated_lines(model))


def test_tp2_matches_single_process(tp2):
    case, ranks, ref = tp2["case"], tp2["ranks"], tp2["single"]
    for rank, got in enumerate(ranks):
        res = got["tp2"]
        for kind in ("grads", "weights"):
            for name, t in ref[kind].items():
                torch.testing.assert_close(res[kind][name], t, atol=1e-5, rtol=1e-5, msg=f"{case} {kind} {name}")
        for a, b in zip(res["log_probs"], ref["log_probs"]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert got["params"] == got["planned"], (case, rank)  # the memory plan's count is what is held
    family, plan, _ = CASES[case]
    meta = _meta(family, plan)
    sharded = sharding.tp_plan(meta)
    # what stays replicated was said, each line once (stderr also has transformers' progress bars)
    said = [line for line in tp2["said"].splitlines() if line.startswith("tensor parallel:")]
    assert len(said) == len(set(said)) and set(sharding.replicated_lines(meta)) <= set(said)
    if case == "unknown":
        # the engine named what it left whole, once, and split the MLP
        line = ("tensor parallel: Llama layers.*.self_attn.o_proj style 'future_style' is not applied by this "
                "engine; the module stays replicated over tp")
        assert line in said
        assert not any(".self_attn." in n for n in sharded) and any(".mlp." in n for n in sharded)
    else:
        assert any(".self_attn." in n for n in sharded) and any(".mlp." in n for n in sharded)
    if case == "deepseek_mla":
        assert "mla_kv_a" in sharded.values()
    if case == "qwen3_norms":
        assert "grad_sum" in sharded.values()
    if case == "rep_styles":
        assert {"colwise_rep", "rowwise_rep"} <= set(sharded.values())
