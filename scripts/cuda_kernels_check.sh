#!/usr/bin/env bash
# Issue 35's decode kernels on a GPU machine in one call (about 6 minutes on an H100):
#   1. random models: the 1.1B in Q4_0, Q8_0 and Q4_K_M, the 8B in Q4_K_M (CHECK_8B=0: not)
#   2. tests: the CPU-side kernel checks, the new kernels against numpy, models on the q8
#      path against their numpy twin and the CPU's exact / fast modes
#      (tests/test_cuda_kernels.py)
#   3. bench/cuda_bench.py at 1 / 8 / 64 streams, before (MODELC_CUDA_DEQ=deq32
#      MODELC_CUDA_GEMV=gemv4: the kernels of a04ce0e) and after (deq8, and the int8 GEMV
#      q8); then tests/test_cuda.py (exact mode, every test as before)
#   4. bench/cuda_profile.py of the 1.1B Q4_K_M at 1 and 64 streams, after and before; the
#      1.1Bs at 32 / 64 streams as int8 GEMV passes (MODELC_CUDA_GEMV_MAX=64); 8 / 64
#      streams with the f16 copies kept (MODELC_CUDA_F16_CACHE=1); deq8 alone
# Each stage is skipped once the budget (CHECK_BUDGET seconds from the start, 340) is spent
# (CHECK_BUDGET=540 under a 600 s limit runs every stage); logs and JSON
# in $OUT.  CUDA_BW: the card's bandwidth for the bench's share column (3.35e12, H100 SXM).
set -uo pipefail
T0=$SECONDS  # the budget counts the wheels and the CPU kernels' build too
# shellcheck source=scripts/cuda_env.sh
. "$(dirname "$0")/cuda_env.sh"
M=/tmp/m35
BUDGET=${CHECK_BUDGET:-340}
BW=${CUDA_BW:-3.35e12}
left() { echo $((BUDGET - (SECONDS - T0))); }
stage() { echo "== $1 at $((SECONDS - T0)) s"; [ "$(left)" -gt "${2:-20}" ] || { echo "   skipped: budget spent"; return 1; }; }

stage "models" && {
  [ -f $M/llama1b-q4_k_m.gguf ] || python3 -m tests.gen_cuda_models $M
  if [ "${CHECK_8B:-1}" = 1 ] && [ ! -f $M/llama8b-q4_k_m.gguf ]; then
    python3 -m tests.gen_cuda_models $M 8b-q4_k_m
  fi
  ls -la $M
}
MODELS=(--model "$M/llama1b-q4_0.gguf" --model "$M/llama1b-q4_k_m.gguf")
[ -f $M/llama8b-q4_k_m.gguf ] && MODELS+=(--model "$M/llama8b-q4_k_m.gguf")

tests() {  # tests NAME MODULES...: exact mode (the q8 tests set their own)
  local name=$1
  shift
  stage "tests $name" 60 || return
  MODELC_MATMUL=exact MODELC_CUDA_1B_DIR=$M timeout "$(($(left) - 40))" python3 -m pytest -q --noconftest \
    -p no:cacheprovider -rs --durations=8 "$@" 2>&1 | tee "$OUT/tests_$name.log" | tail -30
}
tests kernels tests/test_cuda_quants_host.py tests/test_cuda_kernels.py

bench() {  # bench NAME DEQ GEMV
  stage "bench $1 (MODELC_CUDA_DEQ=$2 MODELC_CUDA_GEMV=$3)" 30 || return
  MODELC_CUDA_DEQ=$2 MODELC_CUDA_GEMV=$3 timeout "$(($(left) - 10))" python3 bench/cuda_bench.py \
    --no-hf --no-variants --streams 1,8,64 --steps 48 --bw "$BW" "${MODELS[@]}" \
    --json "$OUT/bench_$1.json" 2>&1 | tee "$OUT/bench_$1.log" | grep -v '^{'
}
profile() {
  stage "profile $1" 30 || return
  MODELC_CUDA_DEQ=$2 MODELC_CUDA_GEMV=$3 timeout "$(($(left) - 5))" python3 bench/cuda_profile.py \
    $M/llama1b-q4_k_m.gguf --streams 1,64 --steps 16 2>&1 | grep -v "Warning\|_warn_once" \
    | tee "$OUT/profile_$1.log" | head -40
}
bench before deq32 gemv4
bench after deq8 q8
tests cuda tests/test_cuda.py
profile after deq8 q8
# 64 streams as 4 int8 GEMV passes of 16 rows (the weights read 4 times, no f16 copy)
stage "bench q8rows (MODELC_CUDA_GEMV_MAX=64)" 30 && MODELC_CUDA_GEMV=q8 MODELC_CUDA_GEMV_MAX=64 \
  timeout "$(($(left) - 10))" python3 bench/cuda_bench.py --no-hf --no-variants --streams 32,64 \
  --steps 48 --bw "$BW" "${MODELS[@]:0:4}" --json "$OUT/bench_q8rows.json" 2>&1 \
  | tee "$OUT/bench_q8rows.log" | grep -v '^{'
# 8 / 64 streams with the weights' f16 copies kept (2 bytes a weight more, no dequantizing)
stage "bench f16cache (MODELC_CUDA_F16_CACHE=1)" 30 && MODELC_CUDA_F16_CACHE=1 \
  MODELC_CUDA_GEMV=q8 timeout "$(($(left) - 10))" python3 bench/cuda_bench.py --no-hf \
  --no-variants --streams 8,64 --steps 48 --bw "$BW" "${MODELS[@]}" \
  --json "$OUT/bench_f16cache.json" 2>&1 | tee "$OUT/bench_f16cache.log" | grep -v '^{'
profile before deq32 gemv4
bench deq8 deq8 gemv4
echo "== done at $((SECONDS - T0)) s"
