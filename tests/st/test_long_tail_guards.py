"""Runs that would train on something else than the user thinks, through the CLI (CPU, tiny model, DP=2): a
rollout correction that rejects every token stops before the update; a resume says when it changes the algorithm
and counts the pool it drops; a pool of another run is refused in one line naming the file."""
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, ROOT)
from cli.train_grpo import main  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")
PARTIAL = ["rl_config.partial_rollout_max_split=3", "generate_config.sampling_config.max_tokens=24"]


@pytest.fixture(scope="module")
def partial_save(tmp_path_factory):
    """One iteration with partial rollout, saved: its pool holds rows in flight."""
    tmp = tmp_path_factory.mktemp("partial")
    save, tiny = str(tmp / "ckpt"), str(tmp / "tiny")
    assert main(["--config", CONFIG, "--output-dir", str(tmp / "a"), "--tiny-model-dir", tiny, *PARTIAL,
                 "megatron_training.train_iters=1", f"megatron_training.save={save}"]) == 0
    return tmp, os.path.join(save, "iter_0000001"), tiny


def test_a_correction_that_rejects_every_token_warns_then_stops_before_the_update(tmp_path, capsys):
    save = str(tmp_path / "ckpt")
    code = main(["--config", CONFIG, "--output-dir", str(tmp_path / "out"), "--tiny-model-dir", str(tmp_path / "m"),
                 "generate_config.sampling_config.logprobs=0", "megatron_training.train_iters=3",
                 "rl_config.rollout_correction={rollout_rs: token_k1, rollout_rs_threshold: '2_3'}",
                 "rl_config.max_all_rejected_iterations=2", f"megatron_training.save={save}",
                 "megatron_training.save_interval=1"])
    out, err = capsys.readouterr()
    assert code == 1
    assert ("warning: iteration 1: rollout correction rejected 100.0% of its tokens (rejection token_k1 in "
            "[2, 3]): its update learns nothing (1 of 2 in a row allowed)\n") in out
    assert err == ("error: rollout correction rejected 100.0% of its tokens (rejection token_k1 in [2, 3]) "
                   "in 2 iterations in a row (1-2) (rl_config.max_all_rejected_iterations=2): the policy "
                   "loss, its gradient and the KL would all be 0, so the run stops before the update; loosen "
                   f"rl_config.rollout_correction's thresholds; the last checkpoint is iteration 1 in {save}\n")
    assert sorted(n for n in os.listdir(save) if n.startswith("iter_")) == ["iter_0000001"]  # none of iteration 2


def test_a_resume_that_changes_the_algorithm_and_drops_the_pool_says_both(partial_save, capsys):
    tmp, folder, tiny = partial_save
    capsys.readouterr()
    assert main(["--config", CONFIG, "--output-dir", str(tmp / "b"), "--tiny-model-dir", tiny,
                 "generate_config.sampling_config.max_tokens=24", "megatron_training.train_iters=2",
                 f"megatron_training.load={folder}", "rl_config.adv_estimator=rloo"]) == 0
    out = capsys.readouterr().out
    assert (f"warning: checkpoint {folder} (iteration 1) was trained as GRPO; this run continues it as RLOO: "
            f"rl_config.adv_estimator 'group_norm' -> 'rloo' (weights, optimizer state, KL coefficient and data "
            f"position carry over)\n") in out
    dropped = [line for line in out.splitlines() if "pool of" in line]
    assert len(dropped) == 1 and dropped[0].startswith(
        f"warning: partial rollout is off (rl_config.partial_rollout_max_split=1): the pool of {folder} is dropped: ")
    assert " prompts in flight, " in dropped[0] and " tokens made so far; their prompts are not drawn again" in dropped[0]


def test_a_pool_of_another_run_is_refused_in_one_line(partial_save, capsys):
    tmp, folder, tiny = partial_save
    capsys.readouterr()
    code = main(["--config", CONFIG, "--output-dir", str(tmp / "c"), "--tiny-model-dir", tiny, *PARTIAL,
                 "megatron_training.train_iters=2", f"megatron_training.load={folder}", "rl_config.seed=7"])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "continuing" not in out
    assert err.startswith(f"error: partial rollout: {os.path.join(folder, 'carry_pool.pt')} belongs to another "
                          f"run: its rl_config.seed=1234, this run's 7; continuing it would train that run's prompts")
