#!/usr/bin/env bash
# Installs what the tests need (torch 2.13.0 first: the machine's CPU wheel where one is provided), then runs the unit, system and patch-file tests.
# Extra arguments go to pytest, e.g. `bash tests/run_tests.sh -k balancing`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install --quiet torch==2.13.0
fi
"$PY" -m pip install --quiet -e ".[test]"
exec "$PY" -m pytest tests/ut tests/st patches/tests "$@"
