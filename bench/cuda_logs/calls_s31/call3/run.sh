#!/usr/bin/env bash
# session 31, call 3: the small kernels' changes and the wide GEMV's capped grid (GPU tests,
# GEMVs alone by warps a row and cap, batch-1 decode by cap), then the 8B step's kernels
set -o pipefail
export PYTHONUNBUFFERED=1
T0=$SECONDS
GEMV_TESTS="tests/test_cuda_gemvp.py tests/test_cuda_kernels.py" GEMV_TESTK="attention or waits or every_type or families or big_decode" \
  GEMV_KINDS=wide GEMV_BY=wide GEMV_TYPES=Q4_K,Q6_K GEMV_SWEEP="--waves 0,1,2 --wprs 0,1,2,4" \
  GEMV_SHAPES="1b qkv,1b gate+up,8b qkv,8b wo,8b gate+up,8b down" GEMV_STREAMS=1 \
  GEMV_SETS="MODELC_CUDA_GEMV_WAVES=0;MODELC_CUDA_GEMV_WAVES=1;MODELC_CUDA_GEMV_WAVES=2" \
  GEMV_MODELS="llama8b-q4_k_m llama1b-q4_k_m llama1b-q4_0" \
  timeout 490 bash scripts/cuda_side_by_side.sh gemv 2>&1 | tee "$OUT/gemv.txt"
echo "== profile at $((SECONDS - T0)) s"
export PYTHONPATH=/tmp/site:$PWD
timeout $((585 - (SECONDS - T0))) python3 bench/cuda_profile.py /tmp/m35/llama8b-q4_k_m.gguf --streams 1 --steps 16 \
  >"$OUT/profile8b.txt" 2>&1; grep -A12 '## 1 streams' "$OUT/profile8b.txt" | cut -c1-100
echo "== end at $((SECONDS - T0)) s"
