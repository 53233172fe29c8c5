#!/usr/bin/env bash
# Installs what the tests need with the exact tested versions (scripts/install.sh: torch 2.13.0 first, then the
# package with its test and vllm extras from constraints.txt), then runs the unit, system and patch-file tests.
# Extra arguments go to pytest, e.g. `bash tests/run_tests.sh -k balancing`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PYTHON="$PY" bash scripts/install.sh test,vllm
exec "$PY" -m pytest tests/ut tests/st patches/tests "$@"
