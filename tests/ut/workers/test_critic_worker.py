"""PPO's critic worker in this process over a recording engine: its values stage, and its update's loss
(divided by the token count of every DP rank together, ``epochs`` passes, ``token_level_loss`` honoured),
its engine's settings, micro-batches, checkpoints and HF export."""
from pathlib import Path

import pytest
import torch

import mindspeed_rl.workers.critic_worker as cw
import mindspeed_rl.workers.engine_worker as engine_worker
from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.stages import CRITIC_TRAIN, VALUES
from mindspeed_rl.models.loss.value_loss import value_loss
from mindspeed_rl.data.columnar import ColumnBatch
from mindspeed_rl.utils.checkpoint import CheckpointError
from mindspeed_rl.workers.parallel_state import ParallelState
from tests.ut.workers.engine_stand_in import RecordsCheckpoints

TINY = Path(__file__).resolve().parents[3] / "configs" / "ppo_tiny_cpu.yaml"


class ValueEngine(RecordsCheckpoints):
    """Stands in for CausalLMEngine(head="value"): values are 0.1 x the response token; records train steps."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs, self.steps, self.value_calls, self.saved = args, kwargs, [], [], []

    def values(self, prompts, responses, micro_batches):
        self.value_calls.append((prompts, list(micro_batches)))
        return [0.1 * r.float() for r in responses]

    def train_step(self, prompts, responses, micro_batches, loss_fn, token_count, dp_size=1, with_entropy=True):
        losses = [loss_fn(idx, [0.1 * responses[i].float() + 0.05 for i in idx], None) for idx in micro_batches]
        self.steps.append({"token_count": token_count, "dp_size": dp_size, "with_entropy": with_entropy,
                           "rows": sorted(i for idx in micro_batches for i in idx), "parts": list(micro_batches),
                           "prompts": prompts, "loss": sum(float(loss) for loss, _ in losses)})
        return {"critic/vf_loss": self.steps[-1]["loss"]}



@pytest.fixture
def critic(monkeypatch):
    monkeypatch.setattr(cw, "CausalLMEngine", ValueEngine)
    reduced = []  # (op, group) of each count all-reduce

    def make(*overrides, dp_tokens=0.0):
        cfgs = build_configs(load_config(TINY, ["megatron_training.model_path=/unused", *overrides]))
        plan = cfgs.plan.for_group("critic")
        # the other DP ranks' tokens (or rows), as the all-reduce over the critic's DP group adds them
        monkeypatch.setattr("mindspeed_rl.workers.engine_worker.all_reduce_scalar",
                            lambda value, op, group: reduced.append((op, group)) or value + dp_tokens)
        worker = cw.CriticWorker(rank=0, world_size=plan.layout.world_size, run_plan=plan)
        worker.parallel_state = ParallelState.from_layout(0, plan.layout)
        assert worker.initialize("/unused", eos_id=13, pad_id=14) == 0
        worker.reduced = reduced
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


FIXED = "rl_config.use_dynamic_bsz=false"  # fixed-size micro-batches: critic_config.micro_batch_size rows (2)


@pytest.fixture
def micro_sync(monkeypatch):
    """Records each micro-batch count sync (count, group); ``extra`` micro-batches on another DP rank."""
    calls, extra = [], {"n": 0}

    def sync(count, group=None):
        calls.append((count, group))
        return count + extra["n"]
    monkeypatch.setattr(engine_worker, "sync_micro_batch_count", sync)
    return calls, extra


def test_the_critic_engine_is_a_trained_value_head_with_the_workers_settings(critic):
    plan, worker = critic()
    engine = worker.critic
    assert engine.args == ("/unused",)
    assert engine.kwargs["head"] == "value" and engine.kwargs["metrics_prefix"] == "critic"
    opt = plan.worker.optimizer
    assert engine.kwargs["trainable"] is True and engine.kwargs["lr"] == opt.lr == 2.0e-3
    assert engine.kwargs["pad_id"] == 14 and engine.kwargs["seed"] == plan.seed


def test_values_cut_fixed_micro_batches_of_each_batch_without_a_dp_sync(critic, micro_sync):
    calls, extra = micro_sync
    extra["n"] = 1  # a sync would add a micro-batch
    _, worker = critic(FIXED)
    first, second = _batch([2, 3, 1]), _batch([4])
    metrics, out = worker.compute_values([first, second])
    assert calls == []
    assert [(p, parts) for p, parts in worker.critic.value_calls] == [(first["prompts"], [[0, 1], [2]]),
                                                                     (second["prompts"], [[0]])]
    # one value row per response row of every batch, in order; tokens of both batches
    assert [len(v) for v in out[VALUES.outputs[0]]] == [2, 3, 1, 4]
    assert metrics[f"tokens/{VALUES.name}"] == (2 + 3 + 1 + 4) + 4 * 2.0


def test_the_update_syncs_its_micro_batch_count_and_sums_counts_over_the_dp_group(critic, micro_sync):
    calls, extra = micro_sync
    plan, worker = critic(FIXED)
    group = object()  # the critic's DP group (no process group runs here)
    worker.parallel_state.dp_group = group
    batch = _batch([2, 3, 1])
    worker.update([batch])
    step = worker.critic.steps[-1]
    assert worker.reduced == [("sum", group)] and calls == [(2, group)]
    assert step["parts"] == [[0, 1], [2]] and step["prompts"] is batch["prompts"]
    assert step["dp_size"] == worker.parallel_state.dp_size == 2
    extra["n"] = 1  # another DP rank cuts 3 micro-batches: this one runs 3 too
    worker.update([batch])
    assert worker.critic.steps[-1]["parts"] == [[0], [1], [2]]


def test_the_update_clips_values_by_cliprange_value_and_averages_metrics(critic):
    plan, worker = critic("rl_config.cliprange_value=0.01", "rl_config.epochs=2")
    assert plan.worker.loss.cliprange_value == 0.01
    batch = _batch([2, 3])
    metrics, _ = worker.update([batch, _batch([1])])
    pad = torch.nn.utils.rnn.pad_sequence
    pred = pad([0.1 * r.float() + 0.05 for r in batch["responses"]], batch_first=True)
    mask = pad([torch.ones(n) for n in (2, 3)], batch_first=True)
    old, ret = pad(list(batch["values"]), batch_first=True), pad(list(batch["returns"]), batch_first=True)
    want, _ = value_loss(pred, old, ret, mask, 0.01)
    unclipped, _ = value_loss(pred, old, ret, mask, None)
    assert float(want) != pytest.approx(float(unclipped))
    assert worker.critic.steps[0]["loss"] == pytest.approx(float(want))
    losses = [s["loss"] for s in worker.critic.steps]
    assert len(losses) == 4 and metrics["critic/vf_loss"] == pytest.approx(sum(losses) / 4)


def test_one_update_step_reports_its_metrics_and_no_batches_report_none(critic):
    _, worker = critic()
    metrics, _ = worker.update([_batch([2])])
    assert metrics["critic/vf_loss"] == pytest.approx(worker.critic.steps[0]["loss"])
    metrics, out = worker.update([])
    assert out is None and "critic/vf_loss" not in metrics and metrics[f"tokens/{CRITIC_TRAIN.name}"] == 0.0


def test_a_checkpoint_holds_the_critics_shards_and_random_streams(critic, tmp_path):
    plan, worker = critic()
    folder = str(tmp_path)
    assert worker.save_checkpoint(folder) == folder
    # by default with the optimizer state, and this rank's random streams in critic_rng/
    assert worker.critic.saved == [(str(tmp_path / "critic_dcp"), True)]
    assert (tmp_path / "critic_rng" / "rank0.pt").is_file()
    saved_draw = torch.rand(4)
    torch.rand(3)
    assert worker.load_checkpoint(folder, iteration=3) == 3
    assert torch.equal(torch.rand(4), saved_draw)  # the random streams are those saved
    assert worker.critic.loaded == (str(tmp_path / "critic_dcp"), True)
    assert worker.critic.step == 3 * plan.steps_per_iteration
    worker.load_checkpoint(folder, iteration=1, with_optimizer=False, with_rng=False)
    assert worker.critic.loaded == (str(tmp_path / "critic_dcp"), False)


def test_a_checkpoint_without_optimizer_or_random_streams(critic, tmp_path):
    _, worker = critic()
    worker.save_checkpoint(str(tmp_path), with_optimizer=False, with_rng=False)
    assert worker.critic.saved == [(str(tmp_path / "critic_dcp"), False)] and not (tmp_path / "critic_rng").exists()
    with pytest.raises(CheckpointError, match="no RNG state for rank 0"):
        worker.load_checkpoint(str(tmp_path), iteration=1)  # the streams are loaded unless told not to
    with pytest.raises(CheckpointError, match="has no critic_dcp folder"):
        worker.load_checkpoint(str(tmp_path / "other"), iteration=1, with_rng=False)


def test_export_writes_the_value_model(critic, tmp_path):
    _, worker = critic()
    path = str(tmp_path / "hf")
    assert worker.export_hf(path) == path and worker.critic.saved == [path]


def test_multi_turn_rows_train_the_value_head_on_the_models_tokens_only(critic):
    from mindspeed_rl.plan.stages import LOSS_MASK
    plan, worker = critic("rl_config.token_level_loss=true")
    batch = _batch([2, 3])
    masks = [torch.tensor([1, 0], dtype=torch.int8), torch.tensor([1, 0, 1], dtype=torch.int8)]
    batch = ColumnBatch(dict({k: batch[k] for k in batch.keys()}, **{LOSS_MASK: masks}))
    worker.update([batch])
    step = worker.critic.steps[0]
    assert step["token_count"] == 3.0  # the model's tokens: 1 + 2 (the tool's are out of the count)
    pred = torch.nn.utils.rnn.pad_sequence([0.1 * r.float() + 0.05 for r in batch["responses"]], batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([m.float() for m in masks], batch_first=True)
    old = torch.nn.utils.rnn.pad_sequence(list(batch["values"]), batch_first=True)
    ret = torch.nn.utils.rnn.pad_sequence(list(batch["returns"]), batch_first=True)
    want, _ = value_loss(pred, old, ret, mask, plan.worker.loss.cliprange_value, token_level=True)
    assert step["loss"] == pytest.approx(float(want))
