#!/usr/bin/env bash
# session 33, call 1: new = 19943bd (Q4_K's mins one a lane, s33-gemv's Q4_K / Q6_K one-row paths and warps-a-row shifts,
# plus the streamed GEMV opt-in MODELC_CUDA_GEMV_STREAM=1) against main (0b78ca4): the GPU tests,
# the 8B Q4_K / Q6_K shapes alone (old wide / new wide / new stream), batch-1 decode of the 8B and
# 1.1B Q4_K_M alternated old / new / new+stream
set -u -o pipefail
export PYTHONUNBUFFERED=1
T0=$SECONDS
M=/tmp/m35
at() { echo "== $1 at $((SECONDS - T0)) s"; }
unz() { python3 -c "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(open(sys.argv[1], 'rb'), sys.stdout.buffer)" "$1"; }
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
OLD=/tmp/old_0b78ca4
NEW=/tmp/new_19943bd
(mkdir -p $OLD && cd $OLD && unz "$OLDPWD/.devrun/old_0b78ca4.tar.zst" | tar xf - && python3 setup.py build_ext --inplace >"$OUT/old_ext.log" 2>&1) &
(mkdir -p $NEW && cd $NEW && unz "$OLDPWD/.devrun/new_19943bd.tar.zst" | tar xf - && python3 setup.py build_ext --inplace >"$OUT/new_ext.log" 2>&1) &
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
at "GPU tests in new (streamed = gemvw's bits; kernels; decode)"
(cd $NEW && PYTHONPATH=/tmp/site:$NEW MODELC_CUDA_1B_DIR=$M timeout 200 python3 -m pytest -q --noconftest -p no:cacheprovider -rfEs \
  tests/test_cuda_gemvs.py tests/test_cuda_kernels.py tests/test_cuda_decode.py >"$OUT/tests_new.log" 2>&1)
grep -hE "^(FAILED|ERROR)|passed|failed" "$OUT"/tests_*.log | head -12
grep -hE "^E |^[a-z_/]+\.py:[0-9]+: " "$OUT"/tests_*.log | head -16
at "batch-1 decode: old / new / new+stream alternated"
n1=0
for m in llama8b-q4_k_m llama1b-q4_k_m; do
  for v in old new stream old new stream; do
    [[ $m == llama1b* && $v == old && $n1 -ge 1 ]] && break; [[ $m == llama1b* && $v == old ]] && n1=1
    [[ $SECONDS -gt 300 ]] && break
    d=$NEW; [[ $v == old ]] && d=$OLD
    st=0; [[ $v == stream ]] && st=1
    r=$(cd "$d" && PYTHONPATH=/tmp/site:$d MODELC_CUDA_GEMV_STREAM=$st timeout 60 python3 bench/cuda_bench.py --no-hf --no-variants --streams 1 \
      --steps 64 --bw "$BW" --model "$M/$m.gguf" 2>&1 | grep -E '^\{|Error|error' | tail -1)
    echo "$m $v $(echo "$r" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(round(d['tok_s'],1), 'tok/s', round(d['step_ms'],3), 'ms', round(100*d['bw_fraction'],1), '%')" 2>/dev/null || echo "$r" | cut -c1-200)"
  done
done
at "8B shapes alone: old wide / new wide / new stream (4 / 3 blocks an SM)"
SH="8b qkv,8b wo,8b gate+up,8b down"
(cd $OLD && PYTHONPATH=/tmp/site:$OLD timeout 60 python3 bench/cuda_gemv_sweep.py --types Q4_K,Q6_K --kinds wide --rows 1 \
  --wprs 0 --shapes "$SH" 2>&1 | grep -E "\| wide \|" | sed 's/^/old /' | cut -c1-100)
(cd $NEW && PYTHONPATH=/tmp/site:$NEW timeout $((520 - SECONDS)) python3 bench/cuda_gemv_sweep.py --types Q4_K,Q6_K --kinds wide,stream --rows 1 \
  --wprs 0 --shapes "$SH" --wide-blocks 0,3 --stream-unrolls 0,3 2>&1 | grep -E "\| (wide|stream) \||Error|error" | sed 's/^/new /' | cut -c1-110)
at "end"
