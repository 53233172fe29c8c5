"""The engine's training contract against a hand-written reference: the gradient scale, every train_step
argument reaching the backward, clipping switched off, skipped steps, metric averaging, set_step, and the
tp sum of the gradients of weights tensor parallel keeps whole."""
import functools
import math

import pytest
import torch
from transformers import Qwen2ForCausalLM

from mindspeed_rl.models import causal_lm, sharding
from mindspeed_rl.models.causal_lm import CausalLMEngine
from mindspeed_rl.models.tiny_model import build_tiny_checkpoint
from ut.models.engine_cases import engine_data, small_qwen2_dir
from ut.models.rank_threads import SerialLoads, run_ranks

WEIGHTS = (0.7, -0.4, 1.3, 0.2)
NORMS = ("q_norm.weight", "k_norm.weight")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # smaller than test_causal_lm's model: these tests build many engines
    return small_qwen2_dir(tmp_path_factory, "tiny_qwen2_training")


def _engine(model_dir, **kwargs):
    kwargs.setdefault("use_remove_padding", True)
    return CausalLMEngine(model_dir, torch.device("cpu"), **kwargs)


def _recording_loss(seen):
    """Loss sum_i WEIGHTS[i] * sum(log-probs of sample i); records what the engine hands to it."""
    def loss_fn(indexes, log_probs, entropies):
        seen.append((list(indexes), [lp.detach().clone() for lp in log_probs],
                     None if entropies is None else [e.detach().clone() for e in entropies]))
        total = sum(WEIGHTS[i] * lp.sum() for i, lp in zip(indexes, log_probs))
        return total, {}
    return loss_fn


@functools.lru_cache(maxsize=None)
def _unit_grads(model_dir, temperature, n):
    """Gradient of sum_i WEIGHTS[i] * sum(log-probs) over engine_data(n), one plain forward per sample."""
    prompts, responses = engine_data(n)
    return _plain_grads(model_dir, prompts, responses, temperature)


def _plain_grads(model_dir, prompts, responses, temperature):
    model = Qwen2ForCausalLM.from_pretrained(model_dir)
    total = torch.zeros(())
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids = torch.cat([p, r])[None]
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float() / temperature, dim=-1)
        rows = logp[p.numel() - 1:ids.shape[1] - 1]
        total = total + WEIGHTS[i] * rows.gather(-1, r[:, None]).sum()
    total.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _manual_grads(model_dir, temperature, scale):
    # the loss is linear in its scale: the engine's gradient is scale times the plain one
    return {n: g * scale for n, g in _unit_grads(model_dir, temperature, 3).items()}


def _norm(grads):
    return math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values()))


def _data():
    prompts, responses = engine_data(3)
    return prompts, responses, sum(r.numel() for r in responses)


def test_default_compute_grads_is_the_token_mean_of_the_loss_at_temperature_one(model_dir):
    prompts, responses, tokens = _data()
    engine = _engine(model_dir)
    seen = []
    engine.compute_grads(prompts, responses, [[2, 0], [1]], _recording_loss(seen), tokens)
    want = _manual_grads(model_dir, 1.0, 1.0 / tokens)
    got = {n: p.grad for n, p in engine.module.named_parameters()}
    for name, g in want.items():
        torch.testing.assert_close(got[name], g, atol=1e-6, rtol=1e-4, msg=name)
    # entropies are computed by default, and the log-probs given to loss_fn are the scored ones
    scored, _ = engine.log_probs(prompts, responses, [[0, 1, 2]])
    assert [s[0] for s in seen] == [[2, 0], [1]]
    for indexes, lps, ents in seen:
        assert ents is not None and all(bool((e >= 0).all()) for e in ents)
        for i, lp in zip(indexes, lps):
            torch.testing.assert_close(lp, scored[i], atol=1e-5, rtol=0)


def test_train_step_passes_every_argument_to_the_backward(model_dir):
    prompts, responses, tokens = _data()
    seen = []
    engine = _engine(model_dir, clip_grad=0.0)
    metrics = engine.train_step(prompts, responses, [[0, 1, 2]], _recording_loss(seen), tokens, dp_size=2,
                                with_entropy=False, temperature=0.5)
    # the reported norm is the one of 2 / tokens times the loss at temperature 0.5, entropies not computed
    want = _norm(_manual_grads(model_dir, 0.5, 2.0 / tokens))
    assert metrics["actor/grad_norm"] == pytest.approx(want, rel=1e-4)
    assert seen[0][2] is None
    # the defaults: dp_size 1, temperature 1
    fresh = _engine(model_dir)
    metrics = fresh.train_step(prompts, responses, [[0, 1, 2]], _recording_loss([]), tokens)
    assert metrics["actor/grad_norm"] == pytest.approx(
        _norm(_manual_grads(model_dir, 1.0, 1.0 / tokens)), rel=1e-4)


def test_a_token_count_of_one_and_of_zero(model_dir):
    engine = _engine(model_dir)
    prompt, response = [torch.tensor([5, 6, 7])], [torch.tensor([9])]
    engine.compute_grads(prompt, response, [[0]], _recording_loss([]), 1)
    want = _plain_grads(model_dir, prompt, response, 1.0)
    for name, p in engine.module.named_parameters():
        torch.testing.assert_close(p.grad, want[name], atol=1e-6, rtol=1e-4, msg=name)
    # no response token in the whole mini-batch: zero gradients, no division by zero
    metrics = engine.compute_grads(prompt, [torch.tensor([], dtype=torch.long)], [[0]],
                                   lambda idx, lps, ents: (sum(lp.sum() for lp in lps), {"n": 1.0}), 0)
    assert metrics == {"n": 1.0}
    assert all(not bool(p.grad.any()) for p in engine.module.parameters())
    # a count of zero scales the loss by zero even where a row has tokens
    engine.compute_grads(prompt, response, [[0]], _recording_loss([]), 0)
    assert all(not bool(p.grad.any()) for p in engine.module.parameters())


def test_metrics_are_averaged_over_the_micro_batches_that_report_them(model_dir):
    prompts, responses, tokens = _data()
    engine = _engine(model_dir)
    reports = iter([{"a": torch.tensor([1.0, 3.0]), "b": 5}, {"a": torch.tensor(4.0)}])

    def loss_fn(indexes, log_probs, entropies):
        return sum(lp.sum() for lp in log_probs), next(reports)

    metrics = engine.compute_grads(prompts, responses, [[0], [], [1, 2]], loss_fn, tokens)
    # a tensor metric counts as its mean; the empty micro-batch reports nothing
    assert metrics == {"a": pytest.approx(3.0), "b": pytest.approx(5.0)}
    assert all(isinstance(v, float) for v in metrics.values())


def test_untrainable_engine_names_the_reason(model_dir):
    engine = _engine(model_dir, trainable=False)
    with pytest.raises(RuntimeError, match=r"^this engine was built with trainable=False$"):
        engine.compute_grads([torch.tensor([5, 6])], [torch.tensor([7])], [[0]], _recording_loss([]), 1)


def test_clip_grad_zero_or_none_turns_clipping_off(model_dir):
    prompts, responses, tokens = _data()

    def step(clip_grad):
        engine = _engine(model_dir, lr=1e-2, eps=1e-2, clip_grad=clip_grad)
        metrics = engine.train_step(prompts, responses, [[0, 1, 2]], _recording_loss([]), tokens)
        return metrics["actor/grad_norm"], {n: p.detach().clone() for n, p in engine.module.named_parameters()}

    norm, unclipped = step(1e9)
    assert 1e-3 < norm < 1e9
    for clip_grad in (0.0, None):
        got_norm, got = step(clip_grad)
        assert got_norm == pytest.approx(norm, rel=1e-6)  # the norm before any clipping
        for name, w in unclipped.items():
            assert torch.equal(got[name], w), (clip_grad, name)
    # (a real limit changing the step: test_causal_lm_defaults.py)


def test_skipped_steps_accumulate(model_dir):
    engine = _engine(model_dir, lr=1e-2)
    prompts, responses = [torch.tensor([1, 2, 3])], [torch.tensor([4, 5])]

    def nan_loss(idx, log_probs, entropy):
        return sum(lp.sum() for lp in log_probs) * float("nan"), {}

    counts = [engine.train_step(prompts, responses, [[0]], nan_loss, 2.0)["actor/skipped_steps"] for _ in range(3)]
    assert counts == [1.0, 2.0, 3.0]
    assert engine.steps == 3  # a skipped step still advances the schedule
    finite = engine.train_step(prompts, responses, [[0]], _recording_loss([]), 2.0)
    assert finite["actor/skipped_steps"] == 3.0


def test_set_step_resumes_the_lr_schedule(model_dir):
    schedule = lambda step: 0.1 / (step + 1)  # noqa: E731
    engine = _engine(model_dir, lr_schedule=schedule)
    engine.set_step(4)
    assert engine.steps == 4
    assert engine.optimizer.param_groups[0]["lr"] == pytest.approx(0.02)
    lrs = [engine.train_step([torch.tensor([1, 2])], [torch.tensor([3])], [[0]], _recording_loss([]), 1.0)
           ["actor/lr"] for _ in range(2)]
    assert lrs == pytest.approx([0.02, 0.1 / 6]) and engine.steps == 6
    # a numpy-like step count is taken as an int
    engine.set_step(2.0)
    assert engine.steps == 2 and isinstance(engine.steps, int)
    # without a schedule the rate stays; without an optimizer only the count moves
    plain = _engine(model_dir, lr=3e-3)
    plain.set_step(9)
    assert plain.steps == 9 and plain.optimizer.param_groups[0]["lr"] == pytest.approx(3e-3)
    frozen = _engine(model_dir, trainable=False, lr_schedule=schedule)
    frozen.set_step(5)
    assert frozen.steps == 5 and frozen.optimizer is None


def _full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _norm_grads(rank, path):
    engine = CausalLMEngine(path, torch.device("cpu"), use_remove_padding=True,
                            mesh=sharding.build_mesh("cpu", 1, 2))
    prompts, responses, tokens = _data()
    engine.compute_grads(prompts, responses, [[0, 1, 2]], _recording_loss([]), tokens, with_entropy=False)
    return {n: _full(p.grad) for n, p in engine.module.named_parameters() if n.endswith(NORMS)}


def test_tp_sums_the_gradients_of_weights_it_keeps_whole(tmp_path, monkeypatch):
    # Qwen3's q_norm / k_norm stay whole on every tp rank ("replicated_with_grad_allreduce"): each rank
    # sees part of the heads, so their gradients are summed over tp after the backward
    path = build_tiny_checkpoint(tmp_path / "qwen3", model_type="qwen3")
    single = CausalLMEngine(path, torch.device("cpu"), use_remove_padding=True)
    prompts, responses, tokens = _data()
    single.compute_grads(prompts, responses, [[0, 1, 2]], _recording_loss([]), tokens, with_entropy=False)
    want = {n: p.grad for n, p in single.module.named_parameters() if n.endswith(NORMS)}
    assert want and all(bool(g.any()) for g in want.values())
    monkeypatch.setattr(causal_lm, "AutoModelForCausalLM", SerialLoads(causal_lm.AutoModelForCausalLM))
    for got in run_ranks(2, _norm_grads, path):
        assert got.keys() == want.keys()
        for name, g in want.items():
            torch.testing.assert_close(got[name], g, atol=1e-6, rtol=1e-4, msg=name)
