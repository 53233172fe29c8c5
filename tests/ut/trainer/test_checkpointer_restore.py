"""open_resume and Checkpointer.restore: the workers load the folder ``find`` chose, and the driver continues
from the state saved with it (iteration, KL coefficient, data position)."""
import os

import pytest

from mindspeed_rl.utils import checkpoint as ckpt


class _Workers:
    def __init__(self):
        self.calls = []

    def load(self, folder, iteration, with_optimizer, with_rng):
        self.calls.append((folder, iteration, with_optimizer, with_rng))


def _saved(root, iteration, **state):
    folder = ckpt.iteration_dir(str(root), iteration)
    os.makedirs(folder)
    ckpt.write_state(folder, dict(state, iteration=iteration))
    return folder


def _with_dcp(folder):
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {"w": torch.ones(2)}}, checkpoint_id=os.path.join(folder, ckpt.DCP_DIR))
    return folder


def test_restore_loads_the_workers_and_returns_the_saved_driver_state(tmp_path):
    folder = _with_dcp(_saved(tmp_path, 6, kl_coef=0.25, data_position=9))
    ckpt.write_tracker(str(tmp_path), 6)
    resume = ckpt.open_resume(str(tmp_path), no_load_optim=True)
    assert resume == ckpt.Resume(folder, 6, with_optimizer=False, with_rng=True,
                                 state={"iteration": 6, "kl_coef": 0.25, "data_position": 9})
    workers = _Workers()
    state = ckpt.Checkpointer(str(tmp_path), load_workers=workers.load).restore(resume)
    assert workers.calls == [(folder, 6, False, True)]
    assert state == {"iteration": 6, "kl_coef": 0.25, "data_position": 9}


def test_the_trainer_state_is_read_once(tmp_path, monkeypatch):
    _with_dcp(_saved(tmp_path, 2, kl_coef=0.5, data_position=2))
    ckpt.write_tracker(str(tmp_path), 2)
    import builtins
    opened, real_open = [], builtins.open

    def counting_open(path, *args, **kwargs):
        if str(path).endswith(ckpt.STATE):
            opened.append(path)
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", counting_open)
    resume = ckpt.open_resume(str(tmp_path))
    ckpt.Checkpointer(str(tmp_path), load_workers=_Workers().load).restore(resume)
    assert len(opened) == 1 and resume.state["kl_coef"] == 0.5


def test_an_old_state_with_a_dock_round_still_loads():
    # versions before the stage runner saved the dock's round count too; it follows from data_position
    assert ckpt.driver_state(6, {"kl_coef": 0.25, "data_position": 9, "dock_round": 6}) == \
        {"iteration": 6, "kl_coef": 0.25, "data_position": 9}


def test_an_old_state_without_data_position_counts_one_batch_per_iteration():
    state = ckpt.driver_state(4, {"kl_coef": 0.5})
    assert state["data_position"] == 4 and state["kl_coef"] == 0.5


def test_weights_only_starts_at_zero_and_never_reads_the_state(tmp_path):
    folder = _with_dcp(_saved(tmp_path, 3, kl_coef=0.5, data_position=7))
    ckpt.write_tracker(str(tmp_path), 3)
    open(os.path.join(folder, ckpt.STATE), "w").close()  # unreadable: finetune does not need it
    resume = ckpt.open_resume(str(tmp_path), finetune=True)
    assert resume == ckpt.Resume(folder, 3, finetune=True, with_optimizer=False, with_rng=False,
                                 state=ckpt.FRESH_STATE)
    workers = _Workers()
    state = ckpt.Checkpointer(str(tmp_path), load_workers=workers.load).restore(resume)
    assert workers.calls == [(folder, 0, False, False)]
    assert state == {"iteration": 0, "data_position": 0}
    with pytest.raises(ckpt.CheckpointError, match="trainer_state.json"):
        ckpt.open_resume(str(tmp_path))  # a resume needs it: refused before any worker loads


def test_what_load_names_is_decided_in_one_place(tmp_path):
    _saved(tmp_path, 1, kl_coef=0.1)
    ckpt.write_tracker(str(tmp_path), 1)
    ours, hf = str(tmp_path), str(tmp_path / "hf")
    assert ckpt.load_kind(None, False, False, False) is None
    assert ckpt.load_kind(ours, False, True, True) == "resume"  # upstream's DAPO keys on our checkpoint
    assert ckpt.load_kind(ours, True, False, False) == "finetune"
    assert ckpt.load_kind(hf, True, False, False) == "hf"
    assert ckpt.load_kind(hf, False, True, True) == "hf"
    assert ckpt.load_kind(hf, False, True, False) == "resume"  # keeps RNG state: must be ours
    assert ckpt.open_resume(None) is None and ckpt.open_resume(hf, no_load_optim=True, no_load_rng=True) is None


def test_resume_says_in_one_line_what_it_restored_and_what_it_left_behind(tmp_path, capsys):
    folder = _saved(tmp_path, 2, kl_coef=0.1, data_position=3)
    loader = ckpt.Checkpointer(str(tmp_path), load_workers=_Workers().load)
    loader.restore(ckpt.Resume(folder, 2))
    exact = capsys.readouterr().out
    assert exact == (f"resumed from {folder} at iteration 2: restored weights, optimizer state, RNG state, "
                     f"KL coefficient and data position\n")
    # upstream's DAPO configs: no_load_optim and no_load_rng
    loader.restore(ckpt.Resume(folder, 2, with_optimizer=False, with_rng=False))
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and "restored weights, KL coefficient and data position" in line
    assert ("left behind: optimizer state (megatron_training.no_load_optim: true), RNG state "
            "(megatron_training.no_load_rng: true): the run does not continue exactly") in line
    loader.restore(ckpt.Resume(folder, 2, with_optimizer=True, with_rng=False))
    line = capsys.readouterr().out
    assert "restored weights, optimizer state, KL" in line and "left behind: RNG state (" in line
    assert "optimizer state (megatron_training.no_load_optim" not in line
    loader.restore(ckpt.Resume(folder, 2, finetune=True, with_optimizer=False, with_rng=False))
    line = capsys.readouterr().out
    assert line.startswith(f"loaded the weights of {folder} (iteration 2) and started at iteration 0; left "
                           f"behind (megatron_training.finetune: true): optimizer state, RNG state")


def test_a_resume_missing_what_it_asks_for_is_refused_before_any_worker_starts(tmp_path):
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    folder = _saved(tmp_path, 2, kl_coef=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {"w": torch.ones(2)}}, checkpoint_id=os.path.join(folder, ckpt.DCP_DIR))
    with pytest.raises(ckpt.CheckpointError, match=r"holds no optimizer state .*no_load_optim: true"):
        ckpt.check_resumable(folder, with_optimizer=True, with_rng=False, world_size=1)
    # a DP=1 checkpoint resumed by 2 ranks: rank 1 has no RNG state
    os.makedirs(os.path.join(folder, "rng"))
    open(os.path.join(folder, "rng", "rank0.pt"), "wb").close()
    ckpt.check_resumable(folder, with_optimizer=False, with_rng=True, world_size=1)
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.check_resumable(folder, with_optimizer=False, with_rng=True, world_size=2)
    assert str(info.value) == (f"checkpoint '{folder}' holds RNG state for 1 rank(s), this run has 2 (no state "
                               f"for rank 1); set megatron_training.no_load_rng: true to resume with fresh "
                               f"random streams")
    ckpt.check_resumable(folder, with_optimizer=False, with_rng=False, world_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {"w": torch.ones(2)}, "optim": {"state": {"w": {"exp_avg": torch.ones(2)}}}},
                 checkpoint_id=os.path.join(folder, ckpt.DCP_DIR))
    ckpt.check_resumable(folder, with_optimizer=True, with_rng=False, world_size=2)


@pytest.mark.parametrize("text", ["３", "²", "1\u0662", "x"])
def test_a_tracker_that_is_not_ascii_digits_is_named(tmp_path, text):
    _saved(tmp_path, 3, kl_coef=0.1)
    with open(os.path.join(tmp_path, ckpt.TRACKER), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.find(str(tmp_path))
    assert str(info.value) == (f"checkpoint tracker {tmp_path}/{ckpt.TRACKER} should hold an iteration number in "
                               f"ASCII digits, holds {text!r}")
    from mindspeed_rl.utils.megatron_format import find_megatron_checkpoint
    assert find_megatron_checkpoint(str(tmp_path)) is None  # not Megatron's either, and no crash


def _ppo_save(root, iteration, critic_ranks=2, actor_ranks=2):
    """An iteration as a PPO run saves it: the actor's and the critic's sharded state and RNG files."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    folder = _saved(root, iteration, kl_coef=0.1, data_position=iteration)
    for dcp_dir, rng_dir, ranks in ((ckpt.DCP_DIR, ckpt.RNG_DIR, actor_ranks),
                                    (ckpt.CRITIC_DCP_DIR, ckpt.CRITIC_RNG_DIR, critic_ranks)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save({"model": {"w": torch.ones(64)}, "optim": {"state": {"w": {"exp_avg": torch.ones(2)}}}},
                     checkpoint_id=os.path.join(folder, dcp_dir))
        os.makedirs(os.path.join(folder, rng_dir))
        for k in range(ranks):
            open(os.path.join(folder, rng_dir, f"rank{k}.pt"), "wb").close()
    ckpt.write_tracker(str(root), iteration)
    return folder


def test_a_ppo_checkpoint_resumes_only_as_ppo_and_a_grpo_one_only_without_a_critic(tmp_path, capsys):
    ppo = _ppo_save(tmp_path / "ppo", 4)
    resume = ckpt.open_resume(str(tmp_path / "ppo"), world_size=2, critic_world_size=2)
    assert resume.groups == ("actor", "critic") and resume.fresh == ()
    with pytest.raises(ckpt.CheckpointError) as info:  # a GRPO run would drop the critic
        ckpt.open_resume(str(tmp_path / "ppo"), world_size=2)
    assert str(info.value) == (
        f"checkpoint '{ppo}' (iteration 4) was saved by a PPO run (it holds the critic's state, critic_dcp/); this "
        f"run has no critic, and resuming would drop it: resume with megatron_training.stage=ray_ppo, or set "
        f"megatron_training.finetune: true to start this run from its actor's weights")
    finetune = ckpt.open_resume(str(tmp_path / "ppo"), finetune=True, world_size=2)  # the key that drops it
    assert finetune.groups == ("actor",) and finetune.fresh == ()
    grpo = _with_dcp(_saved(tmp_path / "grpo", 3, kl_coef=0.1))
    os.makedirs(os.path.join(grpo, ckpt.RNG_DIR))
    ckpt.write_tracker(str(tmp_path / "grpo"), 3)
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.open_resume(str(tmp_path / "grpo"), world_size=2, critic_world_size=2)
    assert str(info.value) == (
        f"checkpoint '{grpo}' (iteration 3) holds no critic state (critic_dcp/ is missing: saved by a GRPO or DAPO "
        f"run); this PPO run cannot resume it: set megatron_training.finetune: true to start PPO from its actor's "
        f"weights with a new critic (critic_config's model)")
    new_critic = ckpt.open_resume(str(tmp_path / "grpo"), finetune=True, world_size=2, critic_world_size=2)
    assert new_critic.groups == ("actor",) and new_critic.fresh == ("critic",)
    workers = _Workers()
    ckpt.Checkpointer(str(tmp_path / "grpo"), load_workers=workers.load).restore(new_critic)
    assert capsys.readouterr().out.rstrip().endswith("; no state for the critic: it starts from its own model")


def test_a_damaged_critic_shard_falls_back_to_the_previous_intact_checkpoint(tmp_path, capsys):
    _ppo_save(tmp_path, 2)
    newest = _ppo_save(tmp_path, 4)
    shard = next(os.path.join(newest, ckpt.CRITIC_DCP_DIR, n) for n in os.listdir(os.path.join(
        newest, ckpt.CRITIC_DCP_DIR)) if n.endswith(".distcp"))
    with open(shard, "r+b") as f:
        f.truncate(10)
    resume = ckpt.open_resume(str(tmp_path), world_size=2, critic_world_size=2)
    assert resume.iteration == 2
    out = capsys.readouterr().out
    assert f"shard {shard} is truncated (10 of " in out and "resuming from the previous intact iteration 2" in out
    assert ckpt.damage(newest).startswith(f"shard {shard} is truncated (10 of ")  # the critic's file, named


@pytest.mark.parametrize("critic_ranks, detail", [(4, "no state for ranks 2, 3"), (1, "no rank for rank1")])
def test_another_number_of_critic_ranks_is_refused_as_for_the_actor(tmp_path, critic_ranks, detail):
    folder = _ppo_save(tmp_path, 2, critic_ranks=2)
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.open_resume(str(tmp_path), world_size=2, critic_world_size=critic_ranks)
    assert str(info.value) == (f"checkpoint '{folder}' holds the critic's RNG state for 2 rank(s), this run has "
                               f"{critic_ranks} critic rank(s) ({detail}); set megatron_training.no_load_rng: true "
                               f"to resume with fresh random streams")
    assert ckpt.open_resume(str(tmp_path), no_load_rng=True, world_size=2, critic_world_size=critic_ranks).groups == \
        ("actor", "critic")
    with pytest.raises(ckpt.CheckpointError, match=r"holds RNG state for 2 rank\(s\), this run has 1 \(no rank for "
                                                   r"rank1\)"):
        ckpt.open_resume(str(tmp_path), world_size=1, critic_world_size=2)  # the same rule for the actor
