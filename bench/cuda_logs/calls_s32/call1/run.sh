#!/usr/bin/env bash
# session 32, call 1: the read-back mends and the fused edges (cuda_fuse) under the GPU tests;
# batch-1 decode with the edges and without (MODELC_CUDA_FUSE=0), the split off, PDL off
set -o pipefail
export PYTHONUNBUFFERED=1
T0=$SECONDS
GEMV_TESTS="tests/test_cuda_fuse.py tests/test_cuda_decode.py tests/test_cuda_gemvp.py tests/test_cuda_kernels.py" \
  GEMV_KINDS=wide GEMV_BY=wide GEMV_TYPES=Q4_K,Q6_K GEMV_SWEEP="--wprs 0" \
  GEMV_SHAPES="8b qkv,8b wo,8b gate+up,8b down" GEMV_STREAMS=1 \
  GEMV_SETS="MODELC_CUDA_FUSE=0;;MODELC_CUDA_FUSE=0;" \
  GEMV_MODELS="llama8b-q4_k_m llama1b-q4_k_m" \
  timeout 560 bash scripts/cuda_side_by_side.sh gemv 2>&1 | tee "$OUT/gemv.txt" | grep -v '^| 8b'
echo "== end at $((SECONDS - T0)) s"
