"""IntegratedWorker under rollout correction and partial rollout (stand-in engines, no Ray): the update reads
each token's IS weight and keep flag, the token count leaves rejected tokens out, bypass mode takes the
engine's log-probs as the old ones, and the rollout passes each row's budget to the backend."""
import pytest
import torch

import mindspeed_rl.workers.integrated_worker as iw
from mindspeed_rl.data.columnar import ColumnBatch
from ut.workers.test_integrated_worker_paths import POLICY_LP, _train_batch, _worker


def _with(batch, **columns):
    data = {k: list(batch[k]) for k in batch}
    data.update(columns)
    return ColumnBatch(data)


def test_weights_and_kept_tokens_reach_the_loss_and_the_token_count(monkeypatch):
    reduced = []
    monkeypatch.setattr("mindspeed_rl.workers.engine_worker.all_reduce_scalar", lambda value, op, group: reduced.append(value) or value)
    w, plan, _ = _worker(monkeypatch, "rl_config.init_kl_coef=0", "rl_config.rollout_correction={rollout_is: token}")
    base = _train_batch(old=POLICY_LP)  # rows of 1 and 3 tokens, advantages 1 and 2, ratio 1
    weights = [torch.tensor([0.5]), torch.tensor([1.0, 2.0, 3.0])]
    keep = [torch.tensor([True]), torch.tensor([True, False, True])]
    w.update([_with(base, rollout_is_weights=weights, response_mask=keep)], kl_coef=0.0)
    # -(A * w) over kept tokens: row 0: 1 * 0.5; row 1: 2 * (1.0 + 3.0)
    assert sum(w.actor.losses[0]) == pytest.approx(-(0.5 + 2 * 4.0))
    assert reduced == [3.0]  # the rejected token is not counted
    w.update([base], kl_coef=0.0)  # without the columns: every token, weight 1
    assert sum(w.actor.losses[1]) == pytest.approx(-(1 + 2 * 3))


def test_a_sequence_mean_loss_counts_rows_with_a_kept_token(monkeypatch):
    reduced = []
    monkeypatch.setattr("mindspeed_rl.workers.engine_worker.all_reduce_scalar", lambda value, op, group: reduced.append(value) or value)
    w, _, _ = _worker(monkeypatch, "rl_config.init_kl_coef=0", "rl_config.token_level_loss=false")
    base = _train_batch(old=POLICY_LP)
    keep = [torch.tensor([False]), torch.tensor([True, True, False])]
    w.update([_with(base, response_mask=keep)], kl_coef=0.0)
    assert reduced == [1.0]  # row 0 has no kept token


def test_bypass_mode_takes_the_engines_log_probs_as_the_old_ones(monkeypatch):
    w, plan, _ = _worker(monkeypatch, "rl_config.init_kl_coef=0", "rl_config.rollout_correction={bypass_mode: true}",
                         drift=True)
    assert plan.features.bypass and not plan.computes_old_log_prob
    # stored old log-probs say ratio 1; the engine's (-1.5) say e: bypass clips at 1 + clip_ratio
    w.update([_train_batch(old=POLICY_LP, drift=-1.5)], kl_coef=0.0)
    assert sum(w.actor.losses[0]) == pytest.approx(1.2 * -(1 + 2 * 3))


def test_the_rollout_gives_each_row_its_budget(monkeypatch):
    w, _, _ = _worker(monkeypatch)
    seen = []
    generate = w.rollout.generate

    def recording(prompts, sampling, seeds, eos_id, pad_id, budgets=None):
        seen.append(budgets)
        return generate(prompts, sampling, seeds, eos_id, pad_id, budgets)
    w.rollout.generate = recording
    batch = {"prompts": [torch.tensor([1]), torch.tensor([2])],
             "rollout_budget": [torch.tensor([4], dtype=torch.int32), torch.tensor([2], dtype=torch.int32)]}
    w.generate_sequences([batch], [[0, 1]])
    w.generate_sequences([{"prompts": [torch.tensor([1])]}], [[0]])
    assert seen == [[4, 2], None]


def test_tool_tokens_leave_the_loss_and_the_token_count(monkeypatch):
    # multi-turn: the rollout's loss_mask is 0 on tool answers; alone, or with rollout correction's keep flags
    reduced = []
    monkeypatch.setattr("mindspeed_rl.workers.engine_worker.all_reduce_scalar",
                        lambda value, op, group: reduced.append(value) or value)
    w, _, _ = _worker(monkeypatch, "rl_config.init_kl_coef=0")
    base = _train_batch(old=POLICY_LP)  # rows of 1 and 3 tokens, advantages 1 and 2, ratio 1
    tools = [torch.tensor([1], dtype=torch.int8), torch.tensor([1, 0, 1], dtype=torch.int8)]
    w.update([_with(base, loss_mask=tools)], kl_coef=0.0)
    assert sum(w.actor.losses[0]) == pytest.approx(-(1 + 2 * 2))  # the middle token of row 1 is a tool's
    assert reduced == [3.0]
    keep = [torch.tensor([True]), torch.tensor([True, False, False])]  # the correction's flags (over model tokens)
    w.update([_with(base, loss_mask=tools, response_mask=keep)], kl_coef=0.0)
    assert sum(w.actor.losses[1]) == pytest.approx(-(1 + 2 * 1))
