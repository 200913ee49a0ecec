# session 23, call 1: the tensor-core prompt attention (tests, prefill against llama.cpp),
# the 8B -ngl 16 split against llama.cpp's
set -u
T0=$SECONDS
OUT=${OUT:-$PWD/cuda-logs}; mkdir -p "$OUT"
source .devrun/setup.sh
B=/tmp/lsrc/llama.cpp/build/bin
(python3 -m tests.gen_cuda_models $M 8b-q4_k_m >"$OUT/gen8b.log" 2>&1; echo "gen8b done at $((SECONDS - T0)) s" >>"$OUT/gen8b.log") &
G8=$!
wait_ext
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "== tests at $((SECONDS - T0)) s"
MODELC_CUDA_1B_DIR=$M timeout 200 python3 -m pytest -q --noconftest -p no:cacheprovider -rs -s \
  tests/test_cuda_kernels.py >"$OUT/tests_kernels.log" 2>&1
grep -E "^hd |^(FAILED|ERROR)|passed|failed" "$OUT/tests_kernels.log" | head -40
echo "== modelc prefill at $((SECONDS - T0)) s"
for m in llama1b-q4_0 llama1b-q4_k_m; do
  for mma in 1 0; do
    echo "-- $m MMA=$mma"
    MODELC_CUDA_ATTN_MMA=$mma timeout 60 python3 -m modelc bench $M/$m.gguf --device cuda --prompt-lens 512,2048 --batches 1 \
      --steps 8 --reps 2 2>&1 | grep -vi warn | tail -4
  done
done
echo "== waiting for llama.cpp at $((SECONDS - T0)) s"
while [ -f /tmp/llama_building ]; do sleep 2; done
tail -3 /tmp/llama_build.log
for m in llama1b-q4_0 llama1b-q4_k_m; do
  timeout 60 $B/llama-bench -m $M/$m.gguf -ngl 99 -p 512,2048 -n 0 -r 3 2>&1 | grep -E "pp|error" | tail -2
done
echo "== waiting for the 8B at $((SECONDS - T0)) s"
wait $G8; tail -1 "$OUT/gen8b.log"
timeout 80 python3 -m modelc bench $M/llama8b-q4_k_m.gguf --device cuda --prompt-lens 512,2048 --batches 1 \
  --steps 8 --reps 2 2>&1 | grep -vi warn | tail -4
timeout 60 $B/llama-bench -m $M/llama8b-q4_k_m.gguf -ngl 99 -p 512,2048 -n 128 -r 2 2>&1 | grep -E "pp|tg|error" | tail -3
echo "== -ngl 16 of the 8B at $((SECONDS - T0)) s"
nproc
timeout 90 $B/llama-bench -m $M/llama8b-q4_k_m.gguf -ngl 16 -p 64 -n 32 -r 2 2>&1 | grep -E "pp|tg|error|threads" | tail -3
timeout 90 $B/llama-bench -m $M/llama8b-q4_k_m.gguf -ngl 0 -p 64 -n 32 -r 2 2>&1 | grep -E "pp|tg|error" | tail -2
timeout $((590 - (SECONDS - T0))) python3 bench/cuda_bench.py --offload $M/llama8b-q4_k_m.gguf \
  --ngl 16 --steps 32 --no-hf 2>&1 | grep -vi warn | tail -6
echo "== end at $((SECONDS - T0)) s"
