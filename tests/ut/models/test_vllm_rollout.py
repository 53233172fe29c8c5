"""The vLLM backend next to the training engine (float32, tiny model), in its own process."""
import json
import os
import subprocess
import sys

import pytest

from vllm_need import need_vllm

need_vllm()
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    work = tmp_path_factory.mktemp("vllm")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "vllm_cases.py"), str(work)], capture_output=True,
                          text=True, timeout=900)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_greedy_tokens_equal_the_trainers_before_and_after_a_synced_train_step(found):
    assert found["start_equal"] == found["prompts"]
    assert found["synced_equal"] == found["prompts"]


def test_without_the_sync_the_engine_samples_from_stale_weights(found):
    # the control: the train steps changed the greedy tokens, so equality above means the sync happened
    assert found["stale_equal"] < found["prompts"]


def test_rollout_log_probs_match_the_trainers_for_the_sampled_tokens(found):
    assert found["log_prob_rows"] == found["prompts"]
    assert found["max_log_prob_diff"] < 1e-4


def test_a_rows_response_depends_on_its_own_seed_only(found):
    assert found["seed_alone_equal"] and found["seed_repeat_equal"]
    assert found["other_seeds_differ"]


@pytest.mark.parametrize("case", ["t07_k4", "t15_minp"])
def test_rollout_log_probs_are_those_sampled_from_after_temperature_top_k_and_min_p(found, case):
    # temperature 0.7 with top-k 4, and temperature 1.5 with min_p 0.5 (so min_p must reach the engine)
    got = found[case]
    assert got["rows"] == found["prompts"] and got["masked"] > 0  # the processing removed tokens here
    assert got["outside"] == 0  # every sampled token survives the processing
    assert got["max_diff"] < 1e-4
    # the control: the renormalisation matters, the temperature-only log-probs are not these
    assert got["temperature_only_diff"] > 1e-3


def test_seeded_rows_whose_prompts_exceed_a_steps_token_budget_together_run_on_cpu(found):
    # vLLM's CPU build stops on a seeded row whose prefill is split over steps; the backend prefills whole
    got = found["long_prompts"]
    assert "error" not in got, got.get("error")
    assert got["lengths"] == [8, 8, 8]
    assert got["alone_equal"] == [True, True, True]  # batched or alone, each row follows its own seed
