"""The engine's defaults and settings as behaviour: the default optimizer step against a hand AdamW step,
clipping at 1.0 by default, the seed, autocast's dtype, the metrics prefix, the weights' dtype and attention,
short prompts, and the data-parallel layout a group or a mesh gives."""
import pytest
import torch
import torch.distributed as dist
from transformers import Qwen2ForCausalLM

from mindspeed_rl.models import causal_lm, sharding
from mindspeed_rl.models.causal_lm import CausalLMEngine
from mindspeed_rl.utils.token_ids import TOKEN_DTYPE
from ut.models.engine_cases import small_qwen2_dir
from ut.models.rank_threads import SerialLoads, run_ranks

PROMPT, RESPONSE = torch.tensor([5, 6, 7]), torch.tensor([8, 9, 10])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # two kv heads: tp=2 can split them (test_data_parallel_layouts_from_a_group_or_a_mesh)
    return small_qwen2_dir(tmp_path_factory, "tiny_qwen2_defaults", kv_heads=2)


def _loss(scale):
    # scale * the response's log-prob sum: a large scale gives a gradient norm far above 1
    def loss_fn(indexes, log_probs, entropies):
        return scale * sum(lp.sum() for lp in log_probs), {}
    return loss_fn


def _hand_step(model_dir, scale, clip, steps=1, **adamw):
    """``steps`` AdamW steps of a plain model on the same loss, clipped to ``clip`` (None: not clipped)."""
    model = Qwen2ForCausalLM.from_pretrained(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), **adamw)
    ids = torch.cat([PROMPT, RESPONSE])[None]
    for _ in range(steps):
        optimizer.zero_grad()
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        rows = logp[PROMPT.numel() - 1:-1].gather(-1, RESPONSE[:, None])
        (scale * rows.sum() / RESPONSE.numel()).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
    return dict(model.named_parameters())


def _engine_step(engine, scale):
    metrics = engine.train_step([PROMPT], [RESPONSE], [[0]], _loss(scale), RESPONSE.numel())
    return metrics, dict(engine.module.named_parameters())


def _assert_same(got, want):
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, atol=2e-6, rtol=1e-5, msg=name)


def test_default_step_is_adamw_lr_1e3_no_weight_decay_eps_1e8(model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"))
    _, got = _engine_step(engine, 1.0)
    want = _hand_step(model_dir, 1.0, 1.0, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    _assert_same(got, want)


def test_the_betas_given_reach_adamw(model_dir):
    # Adam's first step does not depend on the betas (bias correction); the second does
    engine = CausalLMEngine(model_dir, torch.device("cpu"), betas=(0.5, 0.9))
    _engine_step(engine, 1.0)
    _, got = _engine_step(engine, 1.0)
    _assert_same(got, _hand_step(model_dir, 1.0, 1.0, steps=2, lr=1e-3, betas=(0.5, 0.9), eps=1e-8,
                                 weight_decay=0.0))


def test_gradients_are_clipped_to_norm_one_by_default(model_dir):
    # a large Adam eps makes the step proportional to the gradient, so clipping shows in the weights
    engine = CausalLMEngine(model_dir, torch.device("cpu"), eps=10.0)
    metrics, got = _engine_step(engine, 50.0)
    assert metrics["actor/grad_norm"] > 3.0  # reported before clipping
    _assert_same(got, _hand_step(model_dir, 50.0, 1.0, lr=1e-3, eps=10.0, weight_decay=0.0))
    unclipped = _hand_step(model_dir, 50.0, None, lr=1e-3, eps=10.0, weight_decay=0.0)
    assert any(not torch.allclose(got[n], w, atol=2e-6) for n, w in unclipped.items())


def test_building_an_engine_seeds_the_process_rng(model_dir):
    CausalLMEngine(model_dir, torch.device("cpu"), trainable=False)
    assert torch.initial_seed() == 1234
    CausalLMEngine(model_dir, torch.device("cpu"), trainable=False, seed=7)
    assert torch.initial_seed() == 7


def _plain_log_probs(model, dtype=None):
    ids = torch.cat([PROMPT, RESPONSE])[None]
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        logits = model(input_ids=ids).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[PROMPT.numel() - 1:-1].gather(-1, RESPONSE[:, None]).squeeze(-1)


@pytest.mark.parametrize("autocast", [torch.float16, torch.bfloat16])
def test_autocast_runs_the_forwards_in_the_dtype_given(model_dir, autocast):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), trainable=False, autocast_dtype=autocast)
    got = engine.log_probs([PROMPT], [RESPONSE], [[0]])[0][0]
    torch.testing.assert_close(got, _plain_log_probs(engine.module, autocast), atol=1e-6, rtol=0)
    full = _plain_log_probs(engine.module)
    assert not torch.equal(got, full)  # lower precision shows in the values
    torch.testing.assert_close(got, full, atol=0.05, rtol=0)


def test_an_autocast_dtype_equal_to_the_weights_is_no_autocast(model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), trainable=False, autocast_dtype=torch.float32)
    got = engine.log_probs([PROMPT], [RESPONSE], [[0]])[0][0]
    assert torch.equal(got, _plain_log_probs(engine.module))


def test_metrics_prefix_names_the_train_step_metrics(model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), metrics_prefix="policy")
    metrics, _ = _engine_step(engine, 1.0)
    assert set(metrics) == {"policy/lr", "policy/grad_norm", "policy/skipped_steps"}


def test_weights_load_in_the_dtype_and_attention_given(model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), trainable=False, dtype=torch.bfloat16,
                            attn_implementation="eager")
    assert engine.module.dtype == torch.bfloat16 and engine.attn_implementation == "eager"
    got = engine.log_probs([PROMPT], [RESPONSE], [[0]])[0][0]
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, _plain_log_probs(Qwen2ForCausalLM.from_pretrained(model_dir)), atol=0.1, rtol=0)
    # without a choice, transformers' default (sdpa on CPU)
    assert CausalLMEngine(model_dir, torch.device("cpu"), trainable=False).attn_implementation == "sdpa"


def test_a_one_token_prompt_is_scored_and_an_empty_one_is_named(model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), trainable=False)
    prompts, responses = [PROMPT, torch.tensor([5])], [RESPONSE, torch.tensor([6, 7])]
    lps, _ = engine.log_probs(prompts, responses, [[0, 1]])
    with torch.no_grad():
        logp = torch.log_softmax(engine.module(input_ids=torch.tensor([[5, 6, 7]])).logits[0].float(), dim=-1)
    torch.testing.assert_close(lps[1], torch.stack([logp[0, 6], logp[1, 7]]), atol=1e-5, rtol=0)
    # ids stored as TOKEN_DTYPE (int32) score the same
    small = engine.log_probs([x.to(TOKEN_DTYPE) for x in prompts], [x.to(TOKEN_DTYPE) for x in responses], [[0, 1]])[0]
    assert all(torch.equal(a, b) for a, b in zip(small, lps))
    with pytest.raises(ValueError, match="sample 1 has an empty prompt"):
        engine.log_probs([PROMPT, torch.tensor([], dtype=torch.long)], responses, [[0, 1]])


def _layouts(rank, model_dir):
    group = dist.group.WORLD
    by_group = CausalLMEngine(model_dir, torch.device("cpu"), process_group=group)
    by_mesh = CausalLMEngine(model_dir, torch.device("cpu"), mesh=sharding.build_mesh("cpu", dist.get_world_size(), 1))
    frozen = CausalLMEngine(model_dir, torch.device("cpu"), process_group=group, trainable=False)
    alone = CausalLMEngine(model_dir, torch.device("cpu"))  # no group given: this rank alone
    world = dist.get_world_size()
    # untrainable engines on a mesh: TP still shards the weights, a dp-only mesh leaves them whole
    tp_frozen = CausalLMEngine(model_dir, torch.device("cpu"), trainable=False,
                               mesh=sharding.build_mesh("cpu", 1, world))
    dp_frozen = CausalLMEngine(model_dir, torch.device("cpu"), trainable=False,
                               mesh=sharding.build_mesh("cpu", world, 1))
    full = sum(p.numel() for p in frozen.module.parameters())
    return {"group": (by_group.is_ddp, by_group.fsdp, None if by_group.mesh is None else by_group.mesh.size()),
            "mesh": (by_mesh.is_ddp, by_mesh.fsdp, sharding.local_bytes(by_mesh.module.parameters()) // 4 == full),
            "frozen": (frozen.is_ddp, frozen.mesh), "alone": (alone.is_ddp, alone.mesh),
            "tp_frozen": (tp_frozen.is_ddp, sharding.local_bytes(tp_frozen.module.parameters()) // 4 < full),
            "dp_frozen": any(isinstance(p, sharding.DTensor) for p in dp_frozen.module.parameters())}


def test_data_parallel_layouts_from_a_group_or_a_mesh(model_dir, monkeypatch):
    monkeypatch.setattr(causal_lm, "AutoModelForCausalLM", SerialLoads(causal_lm.AutoModelForCausalLM))
    # two ranks: a trainable engine on a group replicates over it (DDP), so does a mesh without fsdp;
    # an untrainable one, or one given no group, is left whole; a tp-only mesh is no DDP
    for got in run_ranks(2, _layouts, model_dir):
        assert got == {"group": (True, False, 2), "mesh": (True, False, True), "frozen": (False, None),
                       "alone": (False, None), "tp_frozen": (False, True), "dp_frozen": False}
    # a one-rank group is no data parallelism
    (got,) = run_ranks(1, _layouts, model_dir)
    assert got["group"] == (False, False, None) and got["frozen"] == (False, None)


def _fsdp_bf16_log_probs(rank, model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), use_remove_padding=True, autocast_dtype=torch.bfloat16,
                            mesh=sharding.build_mesh("cpu", 2, 1), fsdp=True)
    return engine.autocast_dtype, engine.log_probs([PROMPT], [RESPONSE], [[0]])[0][0]


def test_fsdp_computes_in_the_autocast_dtype_through_its_policy(model_dir, monkeypatch):
    monkeypatch.setattr(causal_lm, "AutoModelForCausalLM", SerialLoads(causal_lm.AutoModelForCausalLM))
    full = _plain_log_probs(Qwen2ForCausalLM.from_pretrained(model_dir))
    for autocast, got in run_ranks(2, _fsdp_bf16_log_probs, model_dir):
        assert autocast is None  # FSDP's mixed-precision policy casts; no autocast on top
        assert not torch.equal(got, full)  # bf16 compute shows in the values
        torch.testing.assert_close(got, full, atol=0.05, rtol=0)
