#!/usr/bin/env bash
# Serve Hy-Memory-30B-A3B for Memstore with vLLM on one GPU (80-141 GB). See README.md.
set -euo pipefail

PORT=${PORT:-8001}
MAX_SEQS=${MAX_SEQS:-256}
if [[ -z ${MODEL:-} ]]; then
    # BF16 weights (~61 GB) leave too little KV cache on an 80 GB card; FP8 (~31 GB) fits well.
    gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n1)
    if ((gpu_mib >= 120000)); then MODEL=tencent/Hy-Memory-30B-A3B; else MODEL=tencent/Hy-Memory-30B-A3B-FP8; fi
fi

exec vllm serve "$MODEL" \
    --served-model-name hy-memory \
    --host 0.0.0.0 --port "$PORT" \
    --max-model-len 16384 \
    --max-num-seqs "$MAX_SEQS" \
    --max-num-batched-tokens 16384 \
    --enable-prefix-caching \
    --gpu-memory-utilization 0.92 \
    "$@"
