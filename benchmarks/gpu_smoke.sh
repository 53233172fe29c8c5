#!/usr/bin/env bash
# Smoke of the sharded engine on CUDA: a random-init model with Qwen2.5-0.5B's shape (no download),
# FSDP2 over all GPUs (2 or more; one GPU runs the DDP engine, FSDP needs >= 2 ranks), bf16,
# a few GRPO iterations with DP balance on; prints tokens/s per stage and peak memory.
#   bash benchmarks/gpu_smoke.sh                 # on a CUDA machine
#   DEVICE=cpu bash benchmarks/gpu_smoke.sh      # dry run of this script on CPU (tiny shape, gloo)
# Rollout: vLLM when it is installed (ROLLOUT=auto), else transformers generate; ROLLOUT=hf or vllm forces one.
# With vLLM each rank's engine takes generate_config.gpu_memory_utilization (0.3 here) of its GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
ITERS=${ITERS:-4}
ROLLOUT=${ROLLOUT:-auto}
OUT=${OUT_DIR:-$(mktemp -d /tmp/msrl_smoke_XXXX)}
"$PY" -c "import mindspeed_rl, ray, transformers" 2>/dev/null || "$PY" -m pip install --quiet -e .
if [ "$DEVICE" = cuda ]; then
    N=$(nvidia-smi -L | wc -l)
    ARGS=(megatron_training.model=qwen25_0p5b actor_config.model=qwen25_0p5b megatron_training.bf16=true
          megatron_training.distributed_backend=nccl megatron_training.seq_length=1024
          generate_config.max_model_len=2048 generate_config.sampling_config.max_tokens=256
          rl_config.max_packing_token_size=4096 rl_config.max_prompt_length=8
          generate_config.rollout_backend="$ROLLOUT" generate_config.dtype=bfloat16
          generate_config.gpu_memory_utilization=0.3 generate_config.max_num_seqs=64)
else
    N=2
    ARGS=(generate_config.rollout_backend="$ROLLOUT")
    if [ "$ROLLOUT" = vllm ]; then  # vLLM's CPU attention needs a head size of 32 or more
        ARGS+=(generate_config.dtype=float32 megatron_training.num_attention_heads=2
               megatron_training.num_query_groups=2)
    fi
fi
if [ "$N" -ge 2 ]; then ENGINE=(megatron_training.use_distributed_optimizer=true); else ENGINE=(); fi
echo "device=$DEVICE ranks=$N run folder: $OUT"
"$PY" cli/train_grpo.py --config configs/grpo_tiny_cpu.yaml --tiny-model-dir "$OUT/model" --output-dir "$OUT" \
    "${ARGS[@]}" "${ENGINE[@]}" rl_config.actor_resource.num_npus="$N" megatron_training.train_iters="$ITERS" \
    rl_config.use_dp_batch_balance=true
"$PY" benchmarks/smoke_table.py "$OUT/metrics.jsonl"
