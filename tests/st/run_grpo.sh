#!/usr/bin/env bash
# Tiny GRPO with DP batch balance on a local Ray, on CPU: 2 data-parallel
# ranks, a random-init Qwen2-shaped model, the toy 'length' task. Sets itself
# up on a fresh machine (scripts/install.sh: torch 2.13.0, then the package with constraints.txt), exits non-zero on any
# failure. Extra arguments are config overrides, e.g. megatron_training.train_iters=8
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import mindspeed_rl, ray, transformers, torch" 2>/dev/null; then
    PYTHON="$PY" bash scripts/install.sh  # torch 2.13.0, then the package with the tested versions
fi
OUT=${OUT_DIR:-$(mktemp -d /tmp/msrl_grpo_XXXX)}
echo "run folder: $OUT"
"$PY" cli/train_grpo.py --config configs/grpo_tiny_cpu.yaml --tiny-model-dir "$OUT/tiny_model" \
    --output-dir "$OUT" "$@"
