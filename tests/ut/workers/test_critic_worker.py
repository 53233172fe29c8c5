"""PPO's critic worker in this process over a recording engine: its values stage, and its update's loss
(divided by the token count of every DP rank together, ``epochs`` passes, ``token_level_loss`` honoured)."""
from pathlib import Path

import pytest
import torch

import mindspeed_rl.workers.critic_worker as cw
from mindspeed_rl.config_cls import build_configs, load_config
from mindspeed_rl.config_cls.stages import CRITIC_TRAIN, VALUES
from mindspeed_rl.models.loss.value_loss import value_loss
from mindspeed_rl.trainer.utils.columnar import ColumnBatch
from mindspeed_rl.workers.parallel_state import ParallelState

TINY = Path(__file__).resolve().parents[3] / "configs" / "ppo_tiny_cpu.yaml"


class ValueEngine:
    """Stands in for CausalLMEngine(head="value"): values are 0.1 x the response token; records train steps."""

    def __init__(self, *args, **kwargs):
        self.kwargs, self.steps = kwargs, []

    def values(self, prompts, responses, micro_batches):
        return [0.1 * r.float() for r in responses]

    def train_step(self, prompts, responses, micro_batches, loss_fn, token_count, dp_size=1, with_entropy=True):
        losses = [loss_fn(idx, [0.1 * responses[i].float() + 0.05 for i in idx], None) for idx in micro_batches]
        self.steps.append({"token_count": token_count, "dp_size": dp_size, "with_entropy": with_entropy,
                           "rows": sorted(i for idx in micro_batches for i in idx),
                           "loss": sum(float(loss) for loss, _ in losses)})
        return {"critic/vf_loss": self.steps[-1]["loss"]}


@pytest.fixture
def critic(monkeypatch):
    monkeypatch.setattr(cw, "CausalLMEngine", ValueEngine)

    def make(*overrides, dp_tokens=0.0):
        cfgs = build_configs(load_config(TINY, ["megatron_training.model_path=/unused", *overrides]))
        plan = cfgs.plan.for_group("critic")
        # the other DP ranks' tokens (or rows), as the all-reduce over the critic's DP group adds them
        monkeypatch.setattr(cw, "all_reduce_scalar", lambda value, op, group: value + dp_tokens)
        worker = cw.CriticWorker(rank=0, world_size=plan.layout.world_size, run_plan=plan)
        worker.parallel_state = ParallelState.from_layout(0, plan.layout)
        worker.initialize("/unused", eos_id=13, pad_id=14)
        return plan, worker
    return make


def _batch(lengths, returns=0.7):
    responses = [torch.arange(1, n + 1, dtype=torch.int32) for n in lengths]
    return ColumnBatch({"prompts": [torch.tensor([1, 2])] * len(lengths), "responses": responses,
                        "prompt_length": [torch.tensor([2])] * len(lengths),
                        "response_length": [torch.tensor([n]) for n in lengths],
                        "values": [0.1 * r.float() for r in responses],
                        "returns": [torch.full((n,), returns) for n in lengths]})


def test_values_are_the_engines_per_token_values(critic):
    _, worker = critic()
    metrics, out = worker.compute_values([_batch([2, 3])])
    assert [v.tolist() for v in out[VALUES.outputs[0]]] == [pytest.approx([0.1, 0.2]), pytest.approx([0.1, 0.2, 0.3])]
    assert metrics[f"tokens/{VALUES.name}"] == 2 * 2 + 5.0


@pytest.mark.parametrize("token_level", [True, False])
def test_the_update_divides_by_every_ranks_count_and_runs_epochs_passes(critic, token_level):
    plan, worker = critic(f"rl_config.token_level_loss={str(token_level).lower()}", "rl_config.epochs=2",
                          dp_tokens=7.0)
    batch = _batch([2, 3])
    metrics, out = worker.update([batch])
    assert out is None and len(worker.critic.steps) == 2  # two epochs, one share each
    # the engine divides the loss by the mini-batch's count over all DP ranks: this rank's plus the others'
    local = 5.0 if token_level else 2.0
    assert [s["token_count"] for s in worker.critic.steps] == [local + 7.0] * 2
    assert all(s["with_entropy"] is False and s["rows"] == [0, 1] for s in worker.critic.steps)
    # the loss is the clipped value loss of the batch, summed as the worker's settings say
    pred = torch.nn.utils.rnn.pad_sequence([0.1 * r.float() + 0.05 for r in batch["responses"]], batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones(n) for n in (2, 3)], batch_first=True)
    old = torch.nn.utils.rnn.pad_sequence(list(batch["values"]), batch_first=True)
    ret = torch.nn.utils.rnn.pad_sequence(list(batch["returns"]), batch_first=True)
    want, _ = value_loss(pred, old, ret, mask, plan.worker.loss.cliprange_value, token_level=token_level)
    assert worker.critic.steps[0]["loss"] == pytest.approx(float(want))
    other, _ = value_loss(pred, old, ret, mask, plan.worker.loss.cliprange_value, token_level=not token_level)
    assert float(other) != pytest.approx(float(want))  # the setting matters for this batch
    assert metrics[f"tokens/{CRITIC_TRAIN.name}"] == 2 * 2 + 5.0
