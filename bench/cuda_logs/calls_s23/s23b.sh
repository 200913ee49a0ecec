# session 23, call 2: the wide GEMV (tests, sweep, decode q8 vs wide), HTTP at dfffbcb vs now,
# the 8B split's threads, llama.cpp tg128
set -u
T0=$SECONDS
OUT=${OUT:-$PWD/cuda-logs}; mkdir -p "$OUT"
source .devrun/setup.sh
B=/tmp/lsrc/llama.cpp/build/bin
(python3 -m tests.gen_cuda_models $M 8b-q4_k_m >"$OUT/gen8b.log" 2>&1) &
G8=$!
(mkdir -p /tmp/old && cd /tmp/old && python3 -c "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(open(sys.argv[1], 'rb'), sys.stdout.buffer)" "$OLDPWD/.devrun/old_dfffbcb.tar.zst" | tar xf - && python3 setup.py build_ext --inplace >/tmp/old_ext.log 2>&1) &
OB=$!
(mkdir -p /tmp/now && cd /tmp/now && python3 -c "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(open(sys.argv[1], 'rb'), sys.stdout.buffer)" "$OLDPWD/.devrun/now_head.tar.zst" | tar xf - && python3 setup.py build_ext --inplace >/tmp/now_ext.log 2>&1) &
NB=$!
wait_ext
python3 - <<'PY'
import cupy as cp, time
a = cp.empty(4 << 30, cp.uint8); b = cp.empty_like(a); b[:] = a
cp.cuda.Device().synchronize(); t = time.perf_counter()
for _ in range(10): b[:] = a
cp.cuda.Device().synchronize(); dt = (time.perf_counter() - t) / 10
print(f"device copy: {2 * a.nbytes / dt / 1e12:.2f} TB/s (read + write of 4 GiB)")
PY
echo "== wide tests at $((SECONDS - T0)) s"
MODELC_CUDA_1B_DIR=$M timeout 150 python3 -m pytest -q --noconftest -p no:cacheprovider -rs \
  tests/test_cuda_kernels.py tests/test_cuda_repack.py -k "wide or int8 or q8 or repack" >"$OUT/tests_wide.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_wide.log" | head -20
echo "== sweep at $((SECONDS - T0)) s"
timeout 150 python3 bench/cuda_gemv_sweep.py --types Q4_0,Q4_K,Q6_K --kinds q8,wide --rows 1,2,8 >"$OUT/sweep.log" 2>&1
tail -30 "$OUT/sweep.log"
wait $G8
echo "== decode at $((SECONDS - T0)) s"
for k in q8 wide; do
  MODELC_CUDA_GEMV=$k timeout 100 python3 bench/cuda_bench.py --no-hf --no-variants --streams 1,8 --steps 48 \
    --bw 3.35e12 --model $M/llama1b-q4_0.gguf --model $M/llama1b-q4_k_m.gguf --model $M/llama8b-q4_k_m.gguf 2>&1 | grep -E "^\|" | sed "s/^/$k /"
done
echo "== HTTP at $((SECONDS - T0)) s"
wait $OB $NB; tail -1 /tmp/old_ext.log /tmp/now_ext.log
bash .devrun/http_pair.sh /tmp/old dfffbcb 18070
bash .devrun/http_pair.sh /tmp/now now 18071
echo "== split at $((SECONDS - T0)) s"
lscpu | grep -E "Model name|^Thread|^Core|^Socket|NUMA node\(s\)|L3"
MODELC_THREADS=8 timeout 90 python3 bench/cuda_bench.py --offload $M/llama8b-q4_k_m.gguf --ngl 16 --steps 32 --no-hf 2>&1 | grep -E "^\|.*llama8b"
echo "== llama.cpp at $((SECONDS - T0)) s"
while [ -f /tmp/llama_building ] && [ $((SECONDS - T0)) -lt 520 ]; do sleep 2; done
for m in llama1b-q4_0 llama1b-q4_k_m llama8b-q4_k_m; do
  timeout 40 $B/llama-bench -m $M/$m.gguf -ngl 99 -p 0 -n 128 -r 3 2>&1 | grep -E "tg|error" | tail -1
done
timeout 30 $B/llama-bench -m $M/llama8b-q4_k_m.gguf -ngl 16 -p 0 -n 32 -r 2 -t 8,16 2>&1 | grep -E "tg|error" | tail -2
echo "== end at $((SECONDS - T0)) s"
