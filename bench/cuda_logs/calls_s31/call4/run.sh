#!/usr/bin/env bash
# session 31, call 4: the split rule, argmax in parts, the norms' threads (GPU tests; GEMVs
# alone by warps a row; batch-1 decode against b20e3ac, alternated), then the 8B's kernels
set -o pipefail
export PYTHONUNBUFFERED=1
T0=$SECONDS
OLD=b20e3ac GEMV_TESTS="tests/test_cuda_decode.py tests/test_cuda_gemvp.py tests/test_cuda_kernels.py" \
  GEMV_TESTK="norm or attention or waits or every_type or families or big_decode or sampling" \
  GEMV_KINDS=wide GEMV_BY=wide GEMV_TYPES=Q4_K,Q6_K GEMV_SWEEP="--wprs 0,1,2,4" \
  GEMV_SHAPES="1b qkv,1b wo,1b gate+up,1b down,8b qkv,8b wo,8b gate+up,8b down" GEMV_STREAMS=1 \
  GEMV_SETS="@/tmp/old_b20e3ac;;MODELC_CUDA_ATTN_SPLIT=4" GEMV_MODELS="llama8b-q4_k_m llama1b-q4_k_m" \
  timeout 420 bash scripts/cuda_side_by_side.sh gemv 2>&1 | tee "$OUT/gemv.txt" | grep -v '^| 8b'
grep -E '^\| (1b|8b) [a-z+]+ \| Q4_K \| 1 .*\| wide \|' "$OUT/sweep_gemv.txt" | grep -E 'wo|down' | cut -c1-90
echo "== ncu: the wide GEMV on the 8B's gate+up and down at $((SECONDS - T0)) s"
export PYTHONPATH=/tmp/site:$PWD
for sh in "8b gate+up" "8b down"; do
  timeout 90 ncu --clock-control none -k regex:gemvw_12_1 -s 5 -c 1 --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section MemoryWorkloadAnalysis python3 bench/cuda_gemv_sweep.py --kinds wide \
    --types Q4_K --shapes "$sh" --wprs 0 --rows 1 >"$OUT/ncu_${sh// /_}.txt" 2>&1
  grep -E "DRAM Throughput|Memory Throughput|Duration|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Stall|Warp Cycles Per Issued|L2 Hit|Mem Busy|Max Bandwidth|Issued Warp|No Eligible|stalled|Eligible Warps|Active Warps" \
    "$OUT/ncu_${sh// /_}.txt" | sed 's/  */ /g' | cut -c1-260 | head -26
done
echo "== profile at $((SECONDS - T0)) s"
timeout $((470 - (SECONDS - T0))) python3 bench/cuda_profile.py /tmp/m35/llama8b-q4_k_m.gguf --streams 1 --steps 16 \
  >"$OUT/profile8b.txt" 2>&1; grep -A13 '## 1 streams' "$OUT/profile8b.txt" | cut -c1-100
echo "== end at $((SECONDS - T0)) s"
