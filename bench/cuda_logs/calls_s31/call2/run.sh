#!/usr/bin/env bash
# session 31: the pipelined GEMV against the wide one (tests, GEMVs alone, batch-1 decode, the
# norm in its prologue), the 8B after the load-race mend (its two tests; its decode runs at
# all), then the 8B step's kernels
set -o pipefail
export PYTHONUNBUFFERED=1
T0=$SECONDS
GEMV_TESTK="grows or waits" GEMV_TYPES=Q4_K,Q6_K GEMV_PLANS=",16:64:2,24:96:2" GEMV_STREAMS=1 \
  GEMV_SHAPES="1b qkv,1b gate+up,8b qkv,8b wo,8b gate+up,8b down" \
  GEMV_MODELS="llama8b-q4_k_m llama1b-q4_k_m" timeout 470 bash scripts/cuda_side_by_side.sh gemv 2>&1 | tee "$OUT/gemv.txt"
echo "== profile at $((SECONDS - T0)) s"
export PYTHONPATH=/tmp/site:$PWD
timeout $((580 - (SECONDS - T0))) python3 bench/cuda_profile.py /tmp/m35/llama8b-q4_k_m.gguf --streams 1 --steps 16 \
  >"$OUT/profile8b.txt" 2>&1; grep -A40 '## 1 streams' "$OUT/profile8b.txt" | cut -c1-100 | head -34
echo "== end at $((SECONDS - T0)) s"
