import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import Qwen2Config, Qwen2ForCausalLM

from mindspeed_rl.models import sharding
from mindspeed_rl.models.causal_lm import CausalLMEngine
from mindspeed_rl.utils.token_ids import TOKEN_DTYPE

EOS = 3
PAD = 0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    cfg = Qwen2Config(
        vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, tie_word_embeddings=True, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_qwen2")
    Qwen2ForCausalLM(cfg).save_pretrained(str(path))
    return str(path)


def _data(n=5, seed=7, empty_response=True):
    # prompts of 2..5 tokens and responses of 1..6 tokens (optionally one empty)
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for i in range(n):
        p = int(torch.randint(2, 6, (1,), generator=g))
        r = 0 if (empty_response and i == n - 2) else int(torch.randint(1, 7, (1,), generator=g))
        prompts.append(torch.randint(4, 32, (p,), generator=g))
        responses.append(torch.randint(4, 32, (r,), generator=g))
    return prompts, responses


def _advantages(n):
    return [0.5 - 0.3 * i for i in range(n)]


def _make_loss_fn(advantages, local_to_global=None):
    # per-token loss -A_i * logp - 0.01 * entropy, summed over the micro-batch
    def loss_fn(indexes, log_probs, entropies):
        total = torch.zeros(())
        for i, lp, ent in zip(indexes, log_probs, entropies):
            g = i if local_to_global is None else local_to_global[i]
            total = total + (-advantages[g] * lp).sum() - 0.01 * ent.sum()
        tokens = sum(lp.numel() for lp in log_probs)
        return total, {"actor/pg_loss": float(total.detach()) / max(tokens, 1), "actor/const": 2.0}

    return loss_fn


def _grads(engine):
    # replicated (DTensor) gradients hold the full values on every rank
    return {name: sharding.local(p.grad).detach().clone() for name, p in engine.module.named_parameters()}


def _assert_grads_close(a, b, atol=1e-6):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=1e-5, msg=name)


def _single_forward_log_probs(engine, prompt, response):
    ids = torch.cat([prompt, response])[None]
    with torch.no_grad():
        logp = torch.log_softmax(engine.module(input_ids=ids).logits[0].float(), dim=-1)
    p = prompt.numel()
    return torch.stack([logp[t - 1, ids[0, t]] for t in range(p, ids.shape[1])]) if response.numel() else torch.zeros(0)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_log_probs_order_and_splits(model_dir, remove_padding):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), use_remove_padding=remove_padding, trainable=False)
    prompts, responses = _data()
    want = [_single_forward_log_probs(engine, p, r) for p, r in zip(prompts, responses)]
    for split in ([[0, 1, 2, 3, 4]], [[4, 1], [0], [], [3, 2]], [[2], [4, 0, 3, 1]]):
        lps, ents = engine.log_probs(prompts, responses, split)
        assert ents is None
        for i in range(len(prompts)):
            assert lps[i].shape == (responses[i].numel(),)
            assert lps[i].device.type == "cpu" and lps[i].dtype == torch.float32
            torch.testing.assert_close(lps[i], want[i], atol=1e-5, rtol=0)


def test_log_probs_packed_equals_padded_with_entropy(model_dir):
    prompts, responses = _data(n=6, seed=11)
    split = [[5, 0, 2], [1, 4, 3]]
    padded = CausalLMEngine(model_dir, torch.device("cpu"), use_remove_padding=False, trainable=False)
    packed = CausalLMEngine(model_dir, torch.device("cpu"), use_remove_padding=True, trainable=False)
    lp_a, ent_a = padded.log_probs(prompts, responses, split, with_entropy=True)
    lp_b, ent_b = packed.log_probs(prompts, responses, split, with_entropy=True)
    for i in range(len(prompts)):
        torch.testing.assert_close(lp_a[i], lp_b[i], atol=1e-5, rtol=0)
        torch.testing.assert_close(ent_a[i], ent_b[i], atol=1e-5, rtol=0)
        assert ent_a[i].shape == (responses[i].numel(),)
        assert bool((ent_a[i] >= 0).all())


def test_train_step_updates_weights_and_reports(model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), use_remove_padding=True, lr=1e-2)
    prompts, responses = _data()
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    tokens = sum(r.numel() for r in responses)
    metrics = engine.train_step(prompts, responses, [[0, 1], [2, 3, 4]], _make_loss_fn(_advantages(5)), tokens)
    assert metrics["actor/grad_norm"] > 0 and metrics["actor/lr"] == pytest.approx(1e-2)
    assert metrics["actor/const"] == pytest.approx(2.0)
    assert "actor/pg_loss" in metrics
    changed = [n for n, p in engine.module.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)
    assert all(p.grad is None for p in engine.module.parameters())


def test_untrainable_engine_refuses_training(model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), trainable=False)
    assert engine.optimizer is None
    with pytest.raises(RuntimeError):
        engine.train_step([torch.tensor([5, 6])], [torch.tensor([7])], [[0]], _make_loss_fn([1.0]), 1)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_gradient_invariant_to_micro_batch_split(model_dir, remove_padding):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), use_remove_padding=remove_padding)
    prompts, responses = _data(n=4, empty_response=False)
    tokens = sum(r.numel() for r in responses)
    loss_fn = _make_loss_fn(_advantages(4))
    reference = None
    for split in ([[0, 1, 2, 3]], [[0], [1, 2], [3]], [[3, 0], [], [2, 1]]):
        engine.compute_grads(prompts, responses, split, loss_fn, tokens)
        grads = _grads(engine)
        if reference is None:
            reference = grads
            assert sum(g.abs().sum() for g in grads.values()) > 0
        else:
            _assert_grads_close(grads, reference)


def _ddp_worker(rank, world, init_file, model_dir, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        prompts, responses = _data(n=4, empty_response=False)
        tokens = sum(r.numel() for r in responses)
        advantages = _advantages(4)
        engine = CausalLMEngine(
            model_dir, torch.device("cpu"), use_remove_padding=True, process_group=dist.group.WORLD
        )
        assert engine.is_ddp
        # count gradient all-reduces: only the last micro-batch of a step may sync (one group here)
        calls = []
        all_reduce = dist.all_reduce

        def counting_all_reduce(*args, **kwargs):
            calls.append(1)
            return all_reduce(*args, **kwargs)

        dist.all_reduce = counting_all_reduce
        # (samples per rank, local micro-batches per rank); same micro-batch count on both ranks
        scenarios = {
            "a": ([[0, 1, 2], [3]], [[[0, 1], [2]], [[0], []]]),
            "b": ([[0, 3], [1, 2]], [[[0, 1], []], [[0], [1]]]),
        }
        for name, (shares, micro) in scenarios.items():
            mine = shares[rank]
            engine.compute_grads(
                [prompts[i] for i in mine], [responses[i] for i in mine], micro[rank],
                _make_loss_fn(advantages, local_to_global=mine), tokens, dp_size=world,
            )
            torch.save(_grads(engine), os.path.join(out_dir, f"{name}_{rank}.pt"))
            assert len(calls) == 1, len(calls)
            calls.clear()
        # a full optimizer step with an empty micro-batch must not hang and keeps replicas equal
        engine.train_step(
            [prompts[i] for i in (0, 1)] if rank == 0 else [prompts[2]],
            [responses[i] for i in (0, 1)] if rank == 0 else [responses[2]],
            [[0], [1]] if rank == 0 else [[], [0]],
            _make_loss_fn(advantages, local_to_global=[0, 1] if rank == 0 else [2]),
            sum(responses[i].numel() for i in range(3)), dp_size=world,
        )
        torch.save(engine.state_dict_for_save(), os.path.join(out_dir, f"weights_{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_ddp_two_ranks_match_single_process(model_dir, tmp_path):
    prompts, responses = _data(n=4, empty_response=False)
    tokens = sum(r.numel() for r in responses)
    single = CausalLMEngine(model_dir, torch.device("cpu"), use_remove_padding=True)
    single.compute_grads(prompts, responses, [[0, 1, 2, 3]], _make_loss_fn(_advantages(4)), tokens)
    reference = _grads(single)

    world = 2
    mp.spawn(_ddp_worker, args=(world, str(tmp_path / "init"), model_dir, str(tmp_path)), nprocs=world, join=True)
    for name in ("a", "b"):
        for rank in range(world):
            _assert_grads_close(torch.load(tmp_path / f"{name}_{rank}.pt"), reference)
    w0, w1 = torch.load(tmp_path / "weights_0.pt"), torch.load(tmp_path / "weights_1.pt")
    for key in w0:
        assert torch.equal(w0[key], w1[key]), key


def test_generate_eos_lengths_seed_and_greedy(model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), trainable=False, pad_id=PAD)
    prompts = [torch.tensor([5, 6, 7]), torch.tensor([8]), torch.tensor([9, 10, 11, 12, 13])]
    # sampled: every response ends at its first EOS or has max_new_tokens tokens
    for seed in range(4):
        outs = engine.generate(prompts, max_new_tokens=8, temperature=1.0, eos_id=EOS, seed=seed)
        assert len(outs) == len(prompts)
        for out in outs:
            eos_at = (out == EOS).nonzero().flatten().tolist()
            assert out.dtype == TOKEN_DTYPE and 1 <= out.numel() <= 8
            assert eos_at in ([], [out.numel() - 1])
            if not eos_at:
                assert out.numel() == 8
    # same seed -> same samples; the global RNG is left untouched
    state = torch.get_rng_state()
    a = engine.generate(prompts, max_new_tokens=8, temperature=1.0, top_p=0.9, top_k=10, eos_id=EOS, seed=123)
    b = engine.generate(prompts, max_new_tokens=8, temperature=1.0, top_p=0.9, top_k=10, eos_id=EOS, seed=123)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(state, torch.get_rng_state())
    # different seeds give some different samples over a few tries
    others = [engine.generate(prompts, max_new_tokens=8, eos_id=EOS, seed=s) for s in (1, 2, 3)]
    assert any(not torch.equal(x, y) for o in others for x, y in zip(a, o))

    # greedy (temperature 0): a left-padded batch equals a hand argmax loop per prompt
    greedy = engine.generate(prompts, max_new_tokens=6, temperature=0.0, eos_id=None)
    for prompt, out in zip(prompts, greedy):
        ids = prompt.clone()
        with torch.no_grad():
            for _ in range(6):
                nxt = engine.module(input_ids=ids[None]).logits[0, -1].argmax()
                ids = torch.cat([ids, nxt[None]])
        assert torch.equal(out, ids[prompt.numel():])


def test_sampled_responses_score_like_their_sampler(model_dir):
    # generate with temperature 1 then score: log-probs are finite and well formed
    engine = CausalLMEngine(model_dir, torch.device("cpu"), trainable=False)
    prompts = [torch.tensor([5, 6, 7]), torch.tensor([8, 9])]
    responses = engine.generate(prompts, max_new_tokens=5, eos_id=EOS, seed=0)
    lps, _ = engine.log_probs(prompts, responses, [[0, 1]])
    for lp, r in zip(lps, responses):
        assert lp.shape == r.shape and bool(torch.isfinite(lp).all()) and bool((lp <= 0).all())


def test_save_round_trip(model_dir, tmp_path):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), lr=1e-2)
    prompts, responses = _data()
    tokens = sum(r.numel() for r in responses)
    engine.train_step(prompts, responses, [[0, 1, 2, 3, 4]], _make_loss_fn(_advantages(5)), tokens)
    engine.save(str(tmp_path / "saved"))
    reloaded = CausalLMEngine(str(tmp_path / "saved"), torch.device("cpu"), trainable=False)
    a, _ = engine.log_probs(prompts, responses, [[0, 1, 2, 3, 4]])
    b, _ = reloaded.log_probs(prompts, responses, [[0, 1, 2, 3, 4]])
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=0)
    state = engine.state_dict_for_save()
    assert not any(k.startswith("module.") for k in state)


def _sum_log_prob_loss(idx, log_probs, entropy):
    return -sum(lp.sum() for lp in log_probs), {}


def test_bf16_autocast_keeps_small_updates_in_fp32_master_weights(model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), dtype=torch.float32, lr=1e-6,
                            autocast_dtype=torch.bfloat16, use_remove_padding=True)
    before = [p.detach().clone() for p in engine.module.parameters()]
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4, 5])]
    responses = [torch.tensor([6, 7]), torch.tensor([8, 9, 10])]
    for _ in range(3):
        engine.train_step(prompts, responses, [[0, 1]], _sum_log_prob_loss, token_count=5.0)
    changed = [not torch.equal(a, b) for a, b in zip(before, engine.module.parameters())]
    assert all(p.dtype == torch.float32 for p in engine.module.parameters())
    assert sum(changed) / len(changed) > 0.9  # bf16 weights would round most 1e-6 steps away


def test_lr_schedule_applies_per_optimizer_step(model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), lr_schedule=lambda step: 0.1 / (step + 1))
    lrs = [engine.train_step([torch.tensor([1, 2])], [torch.tensor([3])], [[0]], _sum_log_prob_loss,
                             1.0)["actor/lr"] for _ in range(3)]
    assert lrs == pytest.approx([0.1, 0.05, 0.1 / 3])


def test_log_probs_honour_the_temperature_given(model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), trainable=False, use_remove_padding=True)
    prompt, response = torch.tensor([5, 6, 7]), torch.tensor([8, 9, 10])
    with torch.no_grad():
        logits = engine.module(input_ids=torch.cat([prompt, response])[None]).logits[0].float()
    rows = logits[prompt.numel() - 1:-1]
    for temperature in (1.0, 0.5, 2.0):
        lps, _ = engine.log_probs([prompt], [response], [[0]], temperature=temperature)
        want = torch.log_softmax(rows / temperature, dim=-1).gather(-1, response[:, None]).squeeze(-1)
        torch.testing.assert_close(lps[0], want, atol=1e-5, rtol=1e-5)
    hot, _ = engine.log_probs([prompt], [response], [[0]], temperature=2.0)
    cold, _ = engine.log_probs([prompt], [response], [[0]], temperature=0.5)
    assert not torch.allclose(hot[0], cold[0], atol=1e-3)


def test_no_optimizer_step_on_a_non_finite_grad_norm(model_dir):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), lr=1e-2)
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    prompts, responses = [torch.tensor([1, 2, 3])], [torch.tensor([4, 5])]

    def nan_loss(idx, log_probs, entropy):
        return -sum(lp.sum() for lp in log_probs) * float("nan"), {}

    metrics = engine.train_step(prompts, responses, [[0]], nan_loss, token_count=2.0)
    assert not math.isfinite(metrics["actor/grad_norm"])
    assert metrics["actor/skipped_steps"] == 1.0
    for n, p in engine.module.named_parameters():
        assert torch.equal(p.detach(), before[n]), n
    assert not engine.optimizer.state  # Adam's moments untouched too
    # a finite step afterwards updates, and the count stays
    metrics = engine.train_step(prompts, responses, [[0]], _sum_log_prob_loss, token_count=2.0)
    assert metrics["actor/skipped_steps"] == 1.0 and math.isfinite(metrics["actor/grad_norm"])
    assert any(not torch.equal(p.detach(), before[n]) for n, p in engine.module.named_parameters())
