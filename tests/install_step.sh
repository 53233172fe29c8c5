# Sourced by tests/run_tests.sh and tests/st/run_grpo.sh (from the repository root, with $PY set): runs
# scripts/install.sh for them (same packages, same versions), first saying which Python it installs into and
# roughly what it costs, and on a failure showing pip's last lines and what to try instead.

# "<python executable> (<virtualenv / conda env / no virtualenv> <prefix>)" of the interpreter $PY
msrl_python_env() {
    "$PY" -c '
import os, sys
p = sys.prefix
if p != sys.base_prefix:
    kind = "virtualenv " + p
elif os.environ.get("CONDA_PREFIX") == p:
    kind = "conda env " + p
else:
    kind = "no virtualenv active: packages go into " + p
print(f"{sys.executable} ({kind})")'
}

# msrl_install <caller> <extras ("" for none)> <cost note> [<hint when it fails>]
msrl_install() {
    local caller=$1 extras=$2 cost=$3 hint=${4:-} where log
    if ! where=$(msrl_python_env 2>&1); then
        echo "$caller: cannot run the Python '$PY' ($where); set PYTHON=/path/to/python or activate a venv" >&2
        return 1
    fi
    log=$(mktemp "${TMPDIR:-/tmp}/msrl_install_XXXXXX")
    echo "$caller: installing the tested versions (scripts/install.sh ${extras:-(no extras)}, constraints.txt) into $where"
    echo "$caller: $cost; pip's output goes to $log. Another Python: PYTHON=/path/to/python, or activate a venv first"
    # PIP_VERBOSE=1 cancels install.sh's --quiet in the log only: pip then writes why a resolution failed
    if PYTHON="$PY" PIP_VERBOSE=${PIP_VERBOSE:-1} bash scripts/install.sh $extras >"$log" 2>&1; then
        rm -f "$log"
        return 0
    fi
    echo "$caller: the install failed; the last lines of $log:" >&2
    tail -n 30 "$log" | sed 's/^/    /' >&2
    if [ -n "$hint" ]; then
        echo "$caller: $hint" >&2
    fi
    return 1
}
