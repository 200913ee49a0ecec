#!/usr/bin/env bash
# session 32, call 2: the opt-in edges' test against the float CPU model; the kernels' GPU
# tests with MODELC_CUDA_PDL_EARLY=1 (ENTER triggers the next launch before its wait);
# batch-1 decode alternated: base, early trigger, L2 prefetch of 2 / 3 waves, both, PDL off
set -u -o pipefail
export PYTHONUNBUFFERED=1
T0=$SECONDS
M=/tmp/m35
at() { echo "== $1 at $((SECONDS - T0)) s"; }
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
(python3 setup.py build_ext --inplace >"$OUT/ext_build.log" 2>&1) &
([ -f $M/llama8b-q4_k_m.gguf ] || python3 -m tests.gen_cuda_models $M 8b-q4_k_m >"$OUT/gen8b.log" 2>&1) &
([ -f $M/llama1b-q4_k_m.gguf ] || python3 -m tests.gen_cuda_models $M >"$OUT/gen.log" 2>&1) &
BW=$(python3 -c "
import cupy as cp, time
a = cp.empty(4 << 30, cp.uint8); b = cp.empty_like(a); b[:] = a; cp.cuda.Device().synchronize()
t = time.perf_counter()
for _ in range(10): b[:] = a
cp.cuda.Device().synchronize(); print(f'{2 * a.nbytes / ((time.perf_counter() - t) / 10):.4g}')")
echo "copy $BW B/s"
wait
at "tests: the edges, decode; the kernels with the early trigger"
timeout 120 python3 -m pytest -q --noconftest -p no:cacheprovider -rfEs tests/test_cuda_fuse.py tests/test_cuda_decode.py \
  >"$OUT/tests_fuse.log" 2>&1
MODELC_CUDA_PDL_EARLY=1 MODELC_CUDA_PREFETCH_WAVES=2 timeout 170 python3 -m pytest -q --noconftest -p no:cacheprovider \
  -rfEs tests/test_cuda_kernels.py >"$OUT/tests_early.log" 2>&1
grep -hE "^(FAILED|ERROR)|passed|failed" "$OUT"/tests_*.log | head -12
grep -hE "^E |^[a-z_/]+\.py:[0-9]+: " "$OUT"/tests_*.log | head -16
at "batch-1 decode, alternated"
SETS=";MODELC_CUDA_PDL_EARLY=1;MODELC_CUDA_PREFETCH_WAVES=2;MODELC_CUDA_PREFETCH_WAVES=3;MODELC_CUDA_PDL_EARLY=1 MODELC_CUDA_PREFETCH_WAVES=2"
SETS="$SETS;MODELC_CUDA_PDL=0;MODELC_CUDA_FUSE=1 MODELC_CUDA_PDL_EARLY=1;;MODELC_CUDA_PDL_EARLY=1;MODELC_CUDA_PDL_EARLY=1 MODELC_CUDA_PREFETCH_WAVES=2"
for m in llama8b-q4_k_m llama1b-q4_k_m; do
  while IFS= read -r v; do
    # shellcheck disable=SC2086
    r=$(env $v timeout 60 python3 bench/cuda_bench.py --no-hf --no-variants --streams 1 --steps 64 --bw "$BW" \
      --model "$M/$m.gguf" 2>&1 | grep -E '^\{|Error|error' | tail -1)
    echo "$m [$v] $(echo "$r" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(round(d['tok_s'],1), 'tok/s', round(d['step_ms'],3), 'ms', round(100*d['bw_fraction'],1), '%')" 2>/dev/null || echo "$r" | cut -c1-200)"
  done <<<"${SETS//;/$'\n'}"
done
at "end"
