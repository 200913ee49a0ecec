# session 23, call 4 (short): wide (now the default) with deq8w: 1 / 64 streams, prefill,
# HTTP twice on one server (graph captures in the first run), its tests
set -u
T0=$SECONDS
OUT=${OUT:-$PWD/cuda-logs}; mkdir -p "$OUT"
SKIP_LLAMA=1 source .devrun/setup.sh
export M
timeout 45 python3 bench/cuda_bench.py --no-hf --no-variants --streams 1,64 --steps 32 \
  --bw 3.02e12 --model $M/llama1b-q4_k_m.gguf --model $M/llama1b-q4_0.gguf 2>&1 | tee "$OUT/decode_wide.log" | grep -E "^\||Error"
timeout 25 python3 -m modelc bench $M/llama1b-q4_k_m.gguf --device cuda --prompt-lens 512,2048 --batches 1 \
  --steps 8 --reps 2 2>&1 | grep -E "prefill|decode"
echo "== HTTP at $((SECONDS - T0)) s"
python3 -m modelc run $M/llama1b-q4_0.gguf --device cuda --max-concurrent 64 --max-context 256 --speculate off \
  --port 18071 >"$OUT/server.log" 2>&1 &
SP=$!
for _ in $(seq 1 60); do curl -sf http://127.0.0.1:18071/health >/dev/null && break; sleep 1; done
for i in 1 2; do
  timeout 30 python3 -m modelc bench --url http://127.0.0.1:18071 --concurrency 64 --requests 128 --prompt-len 32 \
    --max-tokens 64 --markdown 2>&1 | tail -1
done
kill $SP
echo "== tests at $((SECONDS - T0)) s"
wait_ext
MODELC_CUDA_1B_DIR=$M timeout 60 python3 -m pytest -q -x --noconftest -p no:cacheprovider -rs \
  tests/test_cuda_kernels.py -k "wide" 2>&1 | tee "$OUT/tests_wide.log" | grep -E "^(FAILED|ERROR)|passed|failed"
echo "== end at $((SECONDS - T0)) s"
