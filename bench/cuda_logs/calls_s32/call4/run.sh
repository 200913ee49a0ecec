#!/usr/bin/env bash
# session 32, call 4: Q4_K repacked in place for the wide GEMV (5a4e9b0) against the code
# before it (f274902): the GPU tests, the Q4_K shapes alone in each checkout (wide, x 3
# alternated), batch-1 decode of the 8B and 1.1B Q4_K_M alternated
set -u -o pipefail
export PYTHONUNBUFFERED=1
T0=$SECONDS
M=/tmp/m35
at() { echo "== $1 at $((SECONDS - T0)) s"; }
unz() { python3 -c "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(open(sys.argv[1], 'rb'), sys.stdout.buffer)" "$1"; }
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
OLD=/tmp/old_f274902
(mkdir -p $OLD && cd $OLD && unz "$OLDPWD/.devrun/old_f274902.tar.zst" | tar xf - && python3 setup.py build_ext --inplace >"$OUT/old_ext.log" 2>&1) &
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
at "GPU tests (kernels: the wide GEMV on repacked Q4_K, models)"
MODELC_CUDA_1B_DIR=$M timeout 110 python3 -m pytest -q --noconftest -p no:cacheprovider -rfEs tests/test_cuda_kernels.py \
  >"$OUT/tests_kernels.log" 2>&1
grep -hE "^(FAILED|ERROR)|passed|failed" "$OUT"/tests_*.log | head -12
grep -hE "^E |^[a-z_/]+\.py:[0-9]+: " "$OUT"/tests_*.log | head -16
wait
at "Q4_K shapes alone: old / new"
for d in $OLD "$PWD"; do
  (cd "$d" && PYTHONPATH=/tmp/site:$d timeout 60 python3 bench/cuda_gemv_sweep.py --types Q4_K --kinds wide --rows 1 \
    --wprs 0 --shapes "8b qkv,8b gate+up,8b down" 2>&1 | grep -E "\| wide \|" \
    | awk -v d="$d" -F'|' '{printf "%s %s %s GB/s |", (d ~ /old/ ? "old" : "new"), $2, $10} END {print ""}')
done
at "batch-1 decode: old / new alternated"
for m in llama8b-q4_k_m llama1b-q4_k_m; do
  for d in $OLD "$PWD" $OLD "$PWD"; do
    [[ $m == llama1b* && $SECONDS -gt 230 ]] && break
    r=$(cd "$d" && PYTHONPATH=/tmp/site:$d timeout 60 python3 bench/cuda_bench.py --no-hf --no-variants --streams 1 \
      --steps 64 --bw "$BW" --model "$M/$m.gguf" 2>&1 | grep -E '^\{|Error|error' | tail -1)
    echo "$m $([[ $d == "$OLD" ]] && echo old || echo new) $(echo "$r" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(round(d['tok_s'],1), 'tok/s', round(d['step_ms'],3), 'ms', round(100*d['bw_fraction'],1), '%')" 2>/dev/null || echo "$r" | cut -c1-200)"
  done
done
at "end"
