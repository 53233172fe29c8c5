"""What a worker does with the spec's switches: the rollout seeds come from
generate_config.sampling_config.seed (else the run plan's seed), and rl_config.token_level_loss
decides whether the update divides by tokens or by sequences. Stand-in engines, no Ray."""
from pathlib import Path

import pytest
import torch

import mindspeed_rl.workers.engine_worker as engine_worker
import mindspeed_rl.workers.integrated_worker as iw
from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.data.columnar import ColumnBatch
from mindspeed_rl.workers.parallel_state import ParallelState

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"


class Engine:
    """Stands in for CausalLMEngine: train_step evaluates the worker's loss on zero log-probs."""

    def __init__(self, *args, **kwargs):
        self.steps = []

    def train_step(self, prompts, responses, parts, loss_fn, token_count, **kwargs):
        losses = []
        for idx in parts:
            log_probs = [torch.zeros(responses[i].numel(), requires_grad=True) for i in idx]
            loss, _ = loss_fn(idx, log_probs, None)
            losses.append(float(loss.detach()) / token_count)
        self.steps.append((token_count, sum(losses)))
        return {"actor/loss": sum(losses)}


class Rollout:
    def __init__(self):
        self.seeds = []

    def generate(self, prompts, sampling, seeds, eos_id, pad_id, budgets=None):
        self.seeds.append(list(seeds))
        return type("Result", (), {"responses": [torch.ones(2, dtype=torch.long) for _ in prompts],
                                   "log_probs": None})()

    def weights_changed(self):
        pass


def _worker(monkeypatch, *overrides):
    monkeypatch.setattr(iw, "CausalLMEngine", Engine)
    monkeypatch.setattr(engine_worker, "seed_all", lambda seed, deterministic: None)
    plan = build_configs(load_config(TINY, ["megatron_training.model_path=/unused", *overrides])).plan
    w = iw.IntegratedWorker(rank=0, world_size=plan.layout.world_size, run_plan=plan)
    w.parallel_state = ParallelState.from_layout(0, plan.layout)
    w.initialize("/unused", eos_id=13, pad_id=14)
    w.rollout = Rollout()
    return w, plan


def _prompts(n):
    return {"prompts": [torch.ones(3, dtype=torch.long)] * n}


def test_rollout_seeds_come_from_the_sampling_seed(monkeypatch):
    w, plan = _worker(monkeypatch, "generate_config.sampling_config.seed=9", "rl_config.seed=5")
    w.generate_sequences([_prompts(2), _prompts(1)], [[0, 1], [6]], iteration=3)
    assert w.rollout.seeds == [[iw.rollout_seed(9, 3, 0), iw.rollout_seed(9, 3, 1)], [iw.rollout_seed(9, 3, 6)]]
    assert iw.rollout_seed(9, 3, 0) != iw.rollout_seed(5, 3, 0)


def test_without_a_sampling_seed_the_run_plans_seed_is_used(monkeypatch):
    w, plan = _worker(monkeypatch, "rl_config.seed=5")
    assert plan.worker.sampling.seed is None and plan.seed == 5
    w.generate_sequences([_prompts(2)], [[4, 5]], iteration=0)
    assert w.rollout.seeds == [[iw.rollout_seed(5, 0, 4), iw.rollout_seed(5, 0, 5)]]


def test_rollout_seed_depends_on_seed_iteration_and_row_only():
    seeds = {iw.rollout_seed(b, i, r) for b in (0, 1) for i in (0, 1) for r in (0, 1)}
    assert len(seeds) == 8 and all(0 <= s < 2 ** 63 for s in seeds)
    assert iw.rollout_seed(7, 2, 3) == iw.rollout_seed(7, 2, 3)


def _train_batch():
    """Two rows with 1 and 3 response tokens, advantages 1 and 2, log-probs all zero (ratio 1)."""
    responses = [torch.ones(1, dtype=torch.long), torch.ones(3, dtype=torch.long)]
    zeros = [torch.zeros(r.numel()) for r in responses]
    return ColumnBatch({"prompts": [torch.ones(2, dtype=torch.long)] * 2, "responses": responses,
                        "prompt_length": [torch.tensor([2])] * 2,
                        "response_length": [torch.tensor([1]), torch.tensor([3])],
                        "advantages": [torch.tensor([1.0]), torch.tensor([2.0])],
                        "old_log_prob": zeros, "ref_log_prob": zeros})


@pytest.mark.parametrize("token_level, count, loss", [
    ("true", 4.0, -(1 * 1 + 2 * 3) / 4),   # every token weighs the same: -(sum of A over tokens) / tokens
    ("false", 2.0, -(1 + 2) / 2),          # every sequence weighs the same: -(mean A per sequence) / sequences
])
def test_update_divides_by_tokens_or_by_sequences(monkeypatch, token_level, count, loss):
    w, plan = _worker(monkeypatch, f"rl_config.token_level_loss={token_level}", "rl_config.epochs=1")
    assert plan.worker.loss.token_level_loss is (token_level == "true")
    w.update([_train_batch()], kl_coef=0.0)
    (token_count, total), = w.actor.steps
    assert token_count == count and total == pytest.approx(loss)
