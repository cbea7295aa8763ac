#!/usr/bin/env bash
# Serve the Q4_K_M GGUF of Hy-Memory-30B-A3B (~18 GB) for Memstore with llama.cpp. See README.md.
# Usage: serve-llama-cpp.sh /path/to/Hy-Memory-30B-A3B-Q4_K_M.gguf [extra llama-server flags]
set -euo pipefail

GGUF=${1:?path to the Q4_K_M .gguf file}
shift
PORT=${PORT:-8001}
SLOTS=${SLOTS:-4}

exec llama-server -m "$GGUF" \
    --alias hy-memory \
    --host 0.0.0.0 --port "$PORT" \
    --jinja \
    -c $((SLOTS * 8192)) -np "$SLOTS" \
    -ngl 99 \
    "$@"
