"""Faults handled in the driver, with in-process stand-ins (no Ray): non-finite values, verifier
faults, Ray start retries, placement choice, bad data files, save folder, damaged checkpoints,
signals and Ray errors through the CLI's main."""
import json
import os
import signal

import math

import pytest
import ray
import torch
import torch.distributed.checkpoint as dcp

from cli import train_grpo
from mindspeed_rl.trainer import grpo_trainer_hybrid as hybrid
from mindspeed_rl.utils import checkpoint as ckpt
from mindspeed_rl.utils import ray_utils
from mindspeed_rl.workers.scheduler import launcher

NAN = float("nan")


# ------------------------------------------------------------------ non-finite policy

class _Trainer(hybrid.RayGRPOTrainer):
    """fit() over scripted per-iteration metrics; saves recorded, no Ray."""

    def __init__(self, script, limit, save_interval=1, train_iters=None):
        self.script, self.saved, self.history = script, [], []
        self.max_nonfinite_iterations, self.save_interval, self.save_dir = limit, save_interval, "/ckpt"
        self.train_iters = train_iters or len(script)
        self.kl_ctrl = type("KL", (), {"value": 0.0})()
        self.transfer_dock = type("TD", (), {"set_round": lambda self, n: None})()
        self.logger = type("L", (), {"log": lambda *a: None})()

    def step(self, iteration, batch):
        return dict(self.script[iteration - 1])

    def save(self, iteration):
        self.saved.append(iteration)
        self.last_saved = iteration


def _ok(skipped=0.0):
    return {"reward/mean": 0.5, "actor/pg_loss": 0.1, "actor/grad_norm": 1.0, "actor/skipped_steps": skipped}


def test_nan_rewards_stop_after_n_iterations_naming_the_first_quantity(capsys):
    bad = {"reward/nonfinite": 16.0, "reward/first_nonfinite_row": 3.0, "reward/first_nonfinite_value": NAN,
           "reward/mean": NAN, "actor/pg_loss": NAN, "actor/grad_norm": NAN, "actor/skipped_steps": 1.0}
    trainer = _Trainer([_ok(), bad, dict(bad, **{"actor/skipped_steps": 2.0}),
                        dict(bad, **{"actor/skipped_steps": 3.0}), _ok(3.0)], limit=3)
    with pytest.raises(hybrid.NonFiniteError) as info:
        trainer.fit(iter(range(9)))
    text = str(info.value)
    assert "3 iterations in a row (2-4)" in text
    assert "iteration 2: reward in 16 rows (first row 3, score nan)" in text  # the reward, not the loss
    assert "last checkpoint is iteration 1" in text
    assert trainer.saved == [1]  # nothing written from a NaN state
    assert capsys.readouterr().out.count("warning: iteration") == 3


def test_skipped_step_alone_counts_and_a_finite_iteration_resets_the_streak():
    # grad norm overflow only seen through the engine's skipped-step counter; save owed to iteration 3
    script = [_ok(), _ok(1.0), _ok(1.0), _ok(2.0), _ok(2.0)]
    trainer = _Trainer(script, limit=2, save_interval=2)
    trainer.fit(iter(range(9)))
    assert trainer.saved == [3, 5]  # 2 and 4 fell on skipped steps: the next finite iteration saves
    assert hybrid.first_nonfinite(_ok(2.0), 1.0).startswith("grad norm (the engine skipped 1")
    assert hybrid.first_nonfinite({"actor/pg_loss": float("inf")}) == "actor/pg_loss=inf"


def test_a_nan_critic_stops_the_run_like_a_nan_actor(capsys):
    # PPO: the critic's loss goes NaN first; its skipped steps count as well; nothing is saved from them
    nan_critic = dict(_ok(), **{"critic/vf_loss": NAN, "critic/grad_norm": NAN, "critic/skipped_steps": 1.0})
    script = [dict(_ok(), **{"critic/vf_loss": 0.3, "critic/skipped_steps": 0.0}), nan_critic,
              dict(nan_critic, **{"critic/skipped_steps": 2.0})]
    trainer = _Trainer(script, limit=2, save_interval=1)
    with pytest.raises(hybrid.NonFiniteError) as info:
        trainer.fit(iter(range(9)))
    assert "2 iterations in a row (2-3)" in str(info.value) and "iteration 2: critic/vf_loss=nan" in str(info.value)
    assert trainer.saved == [1]
    assert "warning: iteration 2: non-finite critic/vf_loss=nan" in capsys.readouterr().out


def test_skipped_steps_of_either_engine_count_from_the_last_iteration():
    before = {"actor": 1.0, "critic": 2.0}
    assert hybrid.first_nonfinite({"actor/skipped_steps": 1.0, "critic/skipped_steps": 4.0}, before) == \
        "critic grad norm (the engine skipped 2 optimizer step(s))"
    assert hybrid.first_nonfinite({"actor/skipped_steps": 3.0, "critic/skipped_steps": 4.0}, before) == \
        "critic grad norm (the engine skipped 2 optimizer step(s))"  # the critic trains first
    assert hybrid.first_nonfinite({"actor/skipped_steps": 3.0, "critic/skipped_steps": 2.0}, before) == \
        "grad norm (the engine skipped 2 optimizer step(s))"
    assert hybrid.first_nonfinite({"critic/grad_norm": math.inf, "actor/pg_loss": NAN}) == "critic/grad_norm=inf"
    assert hybrid.skipped_steps({"critic/skipped_steps": 5.0}, before) == {"critic": 5.0, "actor": 1.0}


def test_policy_zero_never_stops():
    bad = {"reward/mean": NAN}
    trainer = _Trainer([bad] * 4, limit=0)
    assert len(trainer.fit(iter(range(9)))) == 4 and trainer.saved == []


def test_verifier_faults_get_a_console_line():
    m = {"reward/math/timeouts": 2.0, "reward/math/errors": 1.0, "reward/fmt/timeouts": 0.0,
         "reward/fmt/errors": 0.0}
    assert hybrid.verifier_fault_lines(7, m) == ["iter 7: verifier faults (scored 0): math: 2 timed out, 1 raised"]
    assert hybrid.verifier_fault_lines(7, dict(m, **{"reward/math/timeouts": 0.0, "reward/math/errors": 0.0})) == []


# ------------------------------------------------------------------ Ray start, placement

def test_ray_init_is_retried_with_backoff_then_one_line(monkeypatch, capsys):
    calls, waits = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise Exception("The current node timed out during startup.")
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    ray_utils._with_retries(flaky, "a local Ray did not start", attempts=3, backoff=1.5, sleep=waits.append)
    assert len(calls) == 3 and waits == [1.5, 3.0]
    assert "attempt 1 of 3 failed" in capsys.readouterr().out

    def dead():
        raise Exception("The current node timed out\n during startup.")
    with pytest.raises(ray_utils.RayStartError) as info:
        ray_utils._with_retries(dead, "a local Ray did not start", attempts=2, backoff=0, sleep=waits.append)
    assert str(info.value) == ("a local Ray did not start after 2 attempts: Exception: The current node "
                               "timed out during startup.")


def test_placement_strategy_spreads_over_several_nodes_and_packs_one():
    assert launcher.choose_strategy("auto", 1) == "PACK"
    assert launcher.choose_strategy("auto", 3) == "SPREAD"
    assert launcher.choose_strategy("STRICT_PACK", 3) == "STRICT_PACK"
    with pytest.raises(ValueError, match="placement_strategy"):
        launcher.choose_strategy("spread", 2)


def test_placement_shortfall_says_what_was_asked_and_what_the_cluster_has():
    nodes = [{"Resources": {"CPU": 2.0}}]
    assert launcher.placement_shortfall({"CPU": 0.5}, 4, "PACK", nodes) is None
    text = launcher.placement_shortfall({"CPU": 0.5}, 8, "PACK", nodes)
    assert text == "the run asks for 8 workers x {CPU: 0.5} = {CPU: 4}; the cluster has {CPU: 2} on 1 node(s)"
    assert "own node; the cluster has 1" in launcher.placement_shortfall({"CPU": 0.5}, 2, "STRICT_SPREAD", nodes)
    two = [{"Resources": {"CPU": 1.0}}, {"Resources": {"CPU": 1.0}}]
    assert "largest node fits 2" in launcher.placement_shortfall({"CPU": 0.5}, 3, "STRICT_PACK", two)
    # workers that ask for no resource (num_cpus_per_worker=0, no accelerator) fit one node
    assert launcher.placement_shortfall({"CPU": 0.0}, 3, "STRICT_PACK", two) is None
    for count in (1, 3):  # no node at all holds not even one worker
        assert "the largest node fits 0" in launcher.placement_shortfall({"CPU": 0.0}, count, "STRICT_PACK", [])


# ------------------------------------------------------------------ input found before Ray starts

def test_malformed_jsonl_line_and_non_utf8_byte_name_file_and_line(tmp_path):
    from mindspeed_rl.datasets.raw_files import load_raw
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "label": "1"}\n\n{"prompt": "b", "label": \n')
    with pytest.raises(ValueError, match=r"bad.jsonl' line 3: not valid JSON \(Expecting value"):
        load_raw(str(bad))
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"prompt": "a", "label": "1"}\n{"prompt": "caf\xe9", "label": "2"}\n')
    with pytest.raises(ValueError, match=r"latin.json' line 2, column 16: not UTF-8 \(byte 0xe9\)"):
        load_raw(str(latin))
    good = tmp_path / "good.json"
    good.write_text(json.dumps([{"prompt": "a", "label": "1"}]))
    assert len(load_raw(str(good))) == 1


def test_save_folder_under_a_regular_file_is_found_before_training(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"megatron_training.save=.*file/ckpt' is not a writable folder: "
                                         r"'.*file' is a file, not a folder"):
        train_grpo._check_save_folder(str(tmp_path / "file" / "ckpt"))
    train_grpo._check_save_folder(str(tmp_path / "new" / "ckpt"))
    assert os.path.isdir(tmp_path / "new" / "ckpt") and os.listdir(tmp_path / "new" / "ckpt") == []


# ------------------------------------------------------------------ damaged checkpoints

def _save(root, iteration):
    folder = ckpt.iteration_dir(str(root), iteration)
    dcp.save({"w": torch.full((64, 16), float(iteration))}, checkpoint_id=os.path.join(folder, ckpt.DCP_DIR))
    ckpt.write_state(folder, {"iteration": iteration, "kl_coef": 0.01 * iteration})
    ckpt.write_tracker(str(root), iteration)
    return folder


class _Actor:
    def __init__(self, load, finetune=False):
        self.load, self.finetune, self.no_load_optim, self.no_load_rng = load, finetune, False, False


def _found(actor):
    resume = train_grpo._resume(actor)
    return resume.folder, resume.iteration


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_truncated_shard_is_named_and_resume_falls_back_to_the_previous_iteration(tmp_path, capsys):
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    assert _found(_Actor(str(tmp_path))) == (newest, 2)
    shard = os.path.join(newest, ckpt.DCP_DIR, "__0_0.distcp")
    size = os.path.getsize(shard)
    with open(shard, "r+b") as f:
        f.truncate(size // 2)
    assert _found(_Actor(str(tmp_path))) == (ckpt.iteration_dir(str(tmp_path), 1), 1)
    out = capsys.readouterr().out
    assert f"shard {shard} is truncated ({size // 2} of {size} bytes)" in out
    assert "resuming from the previous intact iteration 1" in out
    with pytest.raises(ckpt.CheckpointError, match=r"cannot be loaded: shard .*__0_0.distcp is truncated"):
        _found(_Actor(newest))  # an iteration folder named by the user: no fallback


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_empty_state_and_non_utf8_tracker_name_the_file(tmp_path):
    folder = _save(tmp_path, 1)
    open(os.path.join(folder, ckpt.STATE), "w").close()
    with pytest.raises(ckpt.CheckpointError, match=r"trainer_state.json is not readable JSON"):
        _found(_Actor(str(tmp_path)))
    assert _found(_Actor(str(tmp_path), finetune=True)) == (folder, 1)  # weights only
    with open(os.path.join(tmp_path, ckpt.TRACKER), "wb") as f:
        f.write(b"\xff\xfe1\n")
    with pytest.raises(ckpt.CheckpointError, match=r"latest_checkpointed_iteration.txt should hold an iteration"):
        _found(_Actor(str(tmp_path)))


# ------------------------------------------------------------------ the CLI's closing line

def _main_with(monkeypatch, capsys, fault):
    monkeypatch.setattr(train_grpo, "run", lambda *a, **k: fault())
    code = train_grpo.main(["--config", "x.yaml"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_ends_the_run_with_one_line_and_128_plus_signal(monkeypatch, capsys, sig):
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def interrupted():
        train_grpo.PROGRESS.update(last_saved=4, save_dir="/ckpt")
        os.kill(os.getpid(), sig)
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal while unwinding changes nothing
        raise AssertionError("the signal did not stop the run")
    try:
        code, err = _main_with(monkeypatch, capsys, interrupted)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    assert code == 128 + sig
    assert err == (f"error: stopped by {signal.Signals(sig).name}; Ray was shut down; the last checkpoint is "
                   f"iteration 4 in /ckpt\n")


def test_actor_death_of_the_dock_during_a_save_is_one_line(monkeypatch, capsys):
    class Died(ray.exceptions.ActorDiedError):
        def __str__(self):
            return ("The actor died unexpectedly before finishing this task.\n\tclass_name: GRPOTransferDock\n"
                    "\tactor_id: 1234\n\tpid: 4321\n" + "\tmore context\n" * 30)

    def fault():
        raise Died()
    code, err = _main_with(monkeypatch, capsys, fault)
    assert code == 1
    assert err == "error: actor GRPOTransferDock (pid 4321) died (Died)\n"


def test_a_ranks_error_is_the_remote_error_itself(monkeypatch, capsys):
    def fault():
        try:
            raise ValueError("checkpoint '/c/iter_0000002' could not be read")
        except ValueError as cause:
            raise ray.exceptions.RayTaskError("load_checkpoint", "Traceback ...\n" * 200, cause).as_instanceof_cause()
    code, err = _main_with(monkeypatch, capsys, fault)
    assert code == 1
    assert err == "error: ValueError: checkpoint '/c/iter_0000002' could not be read\n"
