"""IntegratedWorker stages against an in-process dock, with a recording engine.

Two workers (DP ranks 0 and 1) run in this process without a process group;
each one's collectives are no-ops. Each test pins one behaviour so that
breaking it in the worker, trainer stages or dock makes the test fail.
"""
import dataclasses
import math
import os
from pathlib import Path

import pytest
import ray
import torch

import mindspeed_rl.workers.integrated_worker as iw
from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.stages import OLD, ROLLOUT, TRAIN
from mindspeed_rl.models.loss.grpo_loss import compute_group_norm_advantages
from mindspeed_rl.models.lr_schedule import lr_at
from mindspeed_rl.trainer.stage_runner import StageGroup, run_dp_stage, run_queued_stage
from mindspeed_rl.trainer.utils.compute_utils import compute_advantage, compute_rule_reward
from mindspeed_rl.data.driver_dock import DriverDock
from mindspeed_rl.workers.parallel_state import ParallelState
from ut.dapo.test_dapo_sampling import Group

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"


class Local:
    """`handle.method.remote(...)` runs the method in-process (ray.get is patched to identity)."""

    def __init__(self, obj):
        self.obj = obj

    def __getattr__(self, name):
        method = getattr(self.obj, name)
        return type("Remote", (), {"remote": staticmethod(method)})


class RecordingEngine:
    """Stands in for CausalLMEngine: records calls; log-probs depend on temperature."""

    def __init__(self, *args, **kwargs):
        self.kwargs = kwargs
        self.calls = []

    def log_probs(self, prompts, responses, micro_batches, with_entropy=False, temperature=1.0):
        self.calls.append(("log_probs", [p.clone() for p in prompts], temperature))
        return [torch.full((r.numel(),), -1.0 / temperature) for r in responses], None

    def train_step(self, prompts, responses, micro_batches, loss_fn, token_count, dp_size=1,
                   with_entropy=True, temperature=1.0):
        loss = 0.0
        for idx in micro_batches:
            lps = [torch.full((responses[i].numel(),), -0.5) for i in idx]
            value, _ = loss_fn(idx, lps, None)
            loss += float(value)
        self.calls.append(("train_step", [p.clone() for p in prompts], temperature, loss))
        return {"actor/pg_loss": loss}

    def generate(self, prompts, max_new_tokens, **kwargs):
        self.calls.append(("generate", kwargs))
        return [torch.arange(1 + int(p.sum()) % max_new_tokens) + 1 for p in prompts]


@pytest.fixture
def local(monkeypatch):
    monkeypatch.setattr(ray, "get", lambda value, **_: value)
    monkeypatch.setattr(iw, "CausalLMEngine", RecordingEngine)


def _setup(*overrides):
    cfgs = build_configs(load_config(TINY, ["megatron_training.model_path=/unused", *overrides]))
    plan = cfgs.plan
    dock = DriverDock(plan.prompts_per_round, plan.n_samples, addition_columns=["labels"], run_plan=plan)
    workers = []
    for rank in range(plan.layout.world_size):
        w = iw.IntegratedWorker(rank=rank,
                                world_size=plan.layout.world_size, run_plan=plan)
        w.parallel_state = ParallelState.from_layout(rank, plan.layout)
        w.initialize("/unused", eos_id=13, pad_id=14)
        workers.append(w)
    return cfgs, dock, workers


def _fill(dock, plan, seed=0):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 9, (int(n),)) for n in torch.randint(2, 8, (plan.prompts_per_round,), generator=gen)]
    dock.put_prompts_experience({"prompts": prompts, "labels": [torch.tensor([i]) for i in range(len(prompts))]},
                                ["labels"])
    rows = list(range(plan.rows_per_round))
    lengths = torch.randint(1, 10, (len(rows),), generator=gen)
    dock.put_experience({"responses": [torch.ones(int(n), dtype=torch.long) for n in lengths],
                         "response_length": [n.reshape(1) for n in lengths]}, rows)
    dock.put_experience({"advantages": [torch.tensor([float(i % 3) - 1]) for i in rows],
                         "ref_log_prob": [torch.full((int(n),), -2.0) for n in lengths],
                         "old_log_prob": [torch.full((int(n),), -0.5) for n in lengths]}, rows)


def _run(dock, workers, name, **context):
    """Stage ``name`` as the driver runs it (one dispatch, each rank's run, one put of the results):
    the round's plan and the ranks' metrics."""
    metrics = run_dp_stage(Group(workers), dock, StageGroup.of(dock.run_plan.stages[name]), **context)
    return dock.plan_stage(name), metrics


def _seen_rows(dock, worker, kind):
    """Rows (by prompt identity) a worker's engine was given."""
    return [call[1] for call in worker.actor.calls if call[0] == kind]


def test_each_rank_processes_exactly_its_plan_shares(local):
    cfgs, dock, (w0, w1) = _setup()
    plan = cfgs.plan
    _fill(dock, plan)
    shares, (r0, r1) = _run(dock, [w0, w1], OLD.name)
    lengths = (dock.experience_lengths["prompt_length"] + dock.experience_lengths["response_length"]).numpy()
    for worker, result, rank in ((w0, r0, 0), (w1, r1, 1)):
        mine = torch.tensor([r for share in shares[rank] for r in share])
        assert result["load/actor_log_prob"] == lengths[mine.numpy()].sum()
        seen = [p for call in _seen_rows(dock, worker, "log_probs") for p in call]
        expected = [dock.experience_data["prompts"][int(r)] for r in mine]
        assert len(seen) == len(expected) and all(torch.equal(a, b) for a, b in zip(seen, expected))
    assert bool((dock.experience_data_status["old_log_prob"] == 1).all())


def test_log_probs_use_the_sampling_temperature(local):
    cfgs, dock, (w0, w1) = _setup("generate_config.sampling_config.temperature=0.5")
    _fill(dock, cfgs.plan)
    shares = _run(dock, [w0, w1], OLD.name)[0][0]
    _run(dock, [w0, w1], TRAIN.name, kl_coef=0.0)
    temps = [call[2] for call in w0.actor.calls if call[0] in ("log_probs", "train_step")]
    assert temps and all(t == 0.5 for t in temps)
    rows = [r for share in shares for r in share]
    assert all(float(dock.experience_data["old_log_prob"][r][0]) == -2.0 for r in rows)  # -1 / 0.5


def test_kl_coefficient_reaches_the_loss(local):
    losses = []
    for coef in (0.0, 0.5):
        cfgs, dock, (w0, w1) = _setup()
        _fill(dock, cfgs.plan)
        _run(dock, [w0, w1], TRAIN.name, kl_coef=coef)
        losses.append(sum(call[3] for call in w0.actor.calls if call[0] == "train_step"))
    # policy -0.5 vs reference -2.0 on every token: the KL term is strictly positive
    assert losses[1] > losses[0] + 1e-3


def test_epochs_repeat_the_rank_mini_batches(local):
    for epochs in (1, 3):
        cfgs, dock, (w0, w1) = _setup(f"rl_config.epochs={epochs}")
        _fill(dock, cfgs.plan)
        _run(dock, [w0, w1], TRAIN.name, kl_coef=0.0)
        steps = [c for c in w0.actor.calls if c[0] == "train_step"]
        assert len(steps) == cfgs.plan.mini_batches * epochs
        # every epoch trains on the same shares, in the same order
        per_epoch = [torch.cat(c[1]) for c in steps]
        assert all(torch.equal(per_epoch[i], per_epoch[i % cfgs.plan.mini_batches]) for i in range(len(steps)))


def test_lr_schedule_spans_the_run_plan_optimizer_steps(local):
    cfgs, _, (w0, _) = _setup("actor_config.lr_decay_style=cosine", "actor_config.min_lr=1.0e-5",
                              "actor_config.lr_warmup_fraction=0.25", "rl_config.epochs=2")
    schedule = w0.actor.kwargs["lr_schedule"]
    total = cfgs.plan.optimizer_steps
    assert total == 4 * 2 * 2
    for step in range(total + 1):
        want = lr_at(step, base_lr=1e-3, min_lr=1e-5, total_steps=total, warmup_steps=4, style="cosine")
        assert math.isclose(schedule(step), want)
    # pinned ends: warm-up from base_lr / warmup_steps, decay down to min_lr at the last step
    assert math.isclose(schedule(0), 1e-3 / 4) and math.isclose(schedule(total), 1e-5)
    assert w0.actor.kwargs["eps"] == cfgs.actor_config.adam_eps


@pytest.mark.parametrize("static", [True, False])
def test_rollout_uses_sampling_settings(local, static):
    cfgs, dock, (w0, w1) = _setup("generate_config.sampling_config.min_p=0.05",
                                  "generate_config.sampling_config.top_p=0.9", f"rl_config.guarantee_order={static}")
    plan = cfgs.plan
    dock.put_prompts_experience({"prompts": [torch.tensor([1, 2, i]) for i in range(plan.prompts_per_round)]})
    if static:
        _run(dock, [w0, w1], ROLLOUT.name, iteration=1)
    else:
        run_queued_stage(Group([w0, w1]), dock, plan.stages[ROLLOUT.name], iteration=1)
    kwargs = [c[1] for w in (w0, w1) for c in w.actor.calls if c[0] == "generate"]
    assert all(k["min_p"] == 0.05 and k["top_p"] == 0.9 and k["temperature"] == 1.0 for k in kwargs)
    assert bool((dock.experience_data_status["responses"] == 1).all())


def test_reward_and_group_normalised_advantage_stages(local):
    cfgs, dock, _ = _setup()
    plan = cfgs.plan
    _fill(dock, plan)
    rows = plan.rows_per_round

    def reward(responses, labels):  # a score that differs within each group
        return torch.tensor([float(r.numel()) for r in responses])

    metrics = compute_rule_reward(Local(dock), reward, rows)
    scores = torch.tensor([float(r.numel()) for r in dock.experience_data["responses"]])
    assert torch.equal(torch.cat([s.reshape(1) for s in dock.experience_data["rm_scores"]]), scores)
    assert metrics["reward/mean"] == pytest.approx(float(scores.mean()))
    dock.experience_data_status["advantages"][:] = 0
    compute_advantage(Local(dock), plan.n_samples, rows)
    adv = torch.cat([a.reshape(1) for a in dock.experience_data["advantages"]])
    groups = scores.view(-1, plan.n_samples)
    want = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)
    assert torch.allclose(adv, want.reshape(-1), atol=1e-5)
    assert torch.allclose(adv, compute_group_norm_advantages(scores, plan.n_samples))


def test_checkpoint_restores_rng_and_lr_step(local, tmp_path, monkeypatch):
    cfgs, _, (w0, w1) = _setup("actor_config.lr_decay_style=linear")
    saved = {}
    def save_sharded(self, path, opt):  # the folder a real save writes, which a load checks for
        os.makedirs(path, exist_ok=True)
        saved.update(path=path, opt=opt)

    monkeypatch.setattr(RecordingEngine, "save_sharded", save_sharded, raising=False)
    monkeypatch.setattr(RecordingEngine, "load_sharded", lambda self, path, opt: saved.update(loaded=path),
                        raising=False)
    monkeypatch.setattr(RecordingEngine, "set_step", lambda self, n: saved.update(step=n), raising=False)
    torch.manual_seed(123)
    w0.save_checkpoint(str(tmp_path), with_optimizer=False)
    expected = torch.rand(4)
    torch.manual_seed(999)
    w0.load_checkpoint(str(tmp_path), iteration=3)
    assert torch.equal(torch.rand(4), expected)  # the random stream continues where it was saved
    assert saved["step"] == 3 * cfgs.plan.steps_per_iteration and saved["opt"] is False
    with pytest.raises(ValueError, match="no RNG state for rank 1"):  # only rank 0 saved here
        w1.load_checkpoint(str(tmp_path), iteration=3)


def test_rollout_seeds_never_collide_across_iterations_and_rows():
    # a round of 512 prompts x 16 samples, several iterations: every (iteration, row) gets its own stream
    seeds = {iw.rollout_seed(1234, it, row) for it in range(4) for row in range(0, 8192, 1)}
    assert len(seeds) == 4 * 8192
    assert all(0 <= s < 2 ** 63 for s in seeds)
    assert iw.rollout_seed(1234, 1, 0) != iw.rollout_seed(1235, 1, 0)


def test_rollout_seed_follows_the_first_row_of_each_share(local):
    cfgs, dock, (w0, w1) = _setup("rl_config.guarantee_order=true")
    plan = cfgs.plan
    dock.put_prompts_experience({"prompts": [torch.tensor([1, 2, i]) for i in range(plan.prompts_per_round)]})
    shares = _run(dock, [w0, w1], ROLLOUT.name, iteration=3)[0]
    seeds = [c[1]["seed"] for c in w0.actor.calls if c[0] == "generate"]
    assert seeds == [iw.rollout_seed(cfgs.rl_config.seed, 3, share[0]) for share in shares[0]]


def test_megatron_seed_seeds_each_rank_global_streams(local):
    draws = []
    for seed in (5, 6):
        _, _, (w0, w1) = _setup(f"megatron_training.seed={seed}")
        w1.initialize("/unused", eos_id=13, pad_id=14)
        draws.append(torch.rand(3))
        torch.manual_seed(seed + 1)
        assert torch.equal(draws[-1], torch.rand(3))  # rank 1's stream starts at seed + rank
    assert not torch.equal(draws[0], draws[1])


def test_run_stage_checks_the_share_count(local):
    cfgs, dock, (w0, _) = _setup()
    _fill(dock, cfgs.plan)
    train = StageGroup.of(cfgs.plan.stages[TRAIN.name])
    plan, batch, _ = dock.dispatch(train)
    with pytest.raises(ValueError, match="gives DP rank 0 1 shares, the run plan 2"):
        w0.run_stage(train, [plan[0][:1], plan[1]], batch)
    with pytest.raises(ValueError, match="plan has 1 DP ranks"):
        w0.run_stage(train, plan[:1], batch)
    ghost = StageGroup.of(dataclasses.replace(cfgs.plan.stages[TRAIN.name], name="ghost"))
    with pytest.raises(ValueError, match="no DP stage 'ghost'"):
        w0.run_stage(ghost, plan, batch)


def test_accelerator_rng_state_is_checkpointed_for_any_device_type(monkeypatch):
    """NPU (or any torch.<device> module with get/set_rng_state) streams are saved and restored."""
    import types

    from mindspeed_rl.utils import checkpoint as ckpt
    store = {"state": torch.tensor([1, 2, 3], dtype=torch.uint8)}
    fake = types.SimpleNamespace(get_rng_state=lambda device: store["state"].clone(),
                                 set_rng_state=lambda state, device: store.update(state=state.clone()))
    monkeypatch.setattr(torch, "npu", fake, raising=False)
    device = types.SimpleNamespace(type="npu")
    saved = ckpt.capture_rng(device)
    assert torch.equal(saved["npu"], torch.tensor([1, 2, 3], dtype=torch.uint8))
    store["state"] = torch.tensor([9], dtype=torch.uint8)
    ckpt.restore_rng(saved, device)
    assert torch.equal(store["state"], torch.tensor([1, 2, 3], dtype=torch.uint8))


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_failed_save_and_load_name_the_librarys_cause_in_one_line(local, tmp_path, monkeypatch):
    import os
    import warnings
    import torch.distributed.checkpoint as dcp
    from mindspeed_rl.utils.checkpoint import CheckpointError
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    _, _, (w0, _) = _setup()

    def full_disk_save(self, path, opt):  # DCP writing its shard onto a full disk
        os.makedirs(path)
        os.symlink("/dev/full", os.path.join(path, "__0_0.distcp"))
        dcp.save({"w": torch.ones(1000)}, checkpoint_id=path)
    monkeypatch.setattr(RecordingEngine, "save_sharded", full_disk_save, raising=False)
    folder = str(tmp_path / "tmp-iter")
    with pytest.raises(CheckpointError) as info:
        w0.save_checkpoint(folder)
    assert str(info.value) == f"saving checkpoint into '{folder}' failed: OSError: [Errno 28] No space left on device"

    dcp.save({"model.layers.0.w": torch.ones(2)}, checkpoint_id=str(tmp_path / "c" / "dcp"))
    monkeypatch.setattr(RecordingEngine, "load_sharded", lambda self, path, opt: dcp.load(
        {"model.layers.0.w": torch.ones(2), "model.layers.2.w": torch.ones(2)}, checkpoint_id=path), raising=False)
    with pytest.raises(CheckpointError) as info:
        w0.load_checkpoint(str(tmp_path / "c"), iteration=1)
    text = str(info.value)
    assert text.startswith(f"checkpoint '{tmp_path / 'c'}' could not be read: RuntimeError: Missing key in "
                           f"checkpoint state_dict: model.layers.2.w.") and "\n" not in text
