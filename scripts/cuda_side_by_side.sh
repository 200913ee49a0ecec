#!/usr/bin/env bash
# modelc against llama.cpp CUDA on the same random models, in one call on the lent GPU
# machine (bench/RESULTS.md "Side by side with llama.cpp CUDA, current"). Here, once:
#   scripts/llamacpp_cuda.sh pack <sdist>/vendor/llama.cpp .devrun/llama_src.tar.zst
# (.devrun, .whl ignored by git: .git/info/exclude); then carry .whl and .devrun and run
#   bash scripts/cuda_side_by_side.sh           (~9.5 minutes on an H100)
# llama.cpp and the 8B build in the background while the GPU tests run; then modelc's
# decode steps (1 / 8 / 64 streams) and prefill (512, 2,048), llama-bench and
# llama-batched-bench on the same files, 64 streams over HTTP through `modelc run` and
# llama-server, and (time left) the 8B split half and half with the CPU.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/cuda-logs}
mkdir -p "$OUT"
T0=$SECONDS
M=/tmp/m35
B=/tmp/lsrc/llama.cpp/build/bin
export PYTHONPATH=/tmp/site:$PWD
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl || exit 1
(python3 setup.py build_ext --inplace >"$OUT/ext_build.log" 2>&1) &
EB=$!
[ -x $B/llama-server ] || (bash scripts/llamacpp_cuda.sh build "$PWD/${LLAMA_SRC:-.devrun/llama_src.tar.zst}" 12 \
  >"$OUT/llama_build.log" 2>&1) &
LB=$!
[ -f $M/llama1b-q4_k_m.gguf ] || python3 -m tests.gen_cuda_models $M >"$OUT/gen.log" 2>&1
[ -f $M/llama8b-q4_k_m.gguf ] || python3 -m tests.gen_cuda_models $M 8b-q4_k_m >"$OUT/gen8b.log" 2>&1 &
G8=$!
wait $EB
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "== tests at $((SECONDS - T0)) s"
MODELC_CUDA_1B_DIR=$M timeout 170 python3 -m pytest -q --noconftest -p no:cacheprovider -rs \
  tests/test_cuda_kernels.py >"$OUT/tests_kernels.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_kernels.log" | head -20
MODELC_MATMUL=exact timeout 120 python3 -m pytest -q --noconftest -p no:cacheprovider -rs \
  tests/test_cuda.py >"$OUT/tests_cuda.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_cuda.log" | head -20
echo "== waiting for llama.cpp and the 8B at $((SECONDS - T0)) s"
wait $LB $G8
echo "== modelc steps at $((SECONDS - T0)) s"
timeout 120 python3 bench/cuda_bench.py --no-hf --no-variants --streams 1,8,64 --steps 48 \
  --bw "${BW:-3.35e12}" --model $M/llama1b-q4_0.gguf --model $M/llama1b-q4_k_m.gguf \
  --json "$OUT/bench_1b.json" 2>&1 | grep -E "^\||captured"
echo "== modelc prefill at $((SECONDS - T0)) s"
for m in llama1b-q4_0 llama1b-q4_k_m llama8b-q4_k_m; do
  timeout 60 python3 -m modelc bench $M/$m.gguf --device cuda --prompt-lens 512,2048 --batches 1 \
    --steps 8 --reps 2 2>&1 | grep -vi warn | tail -6
done
echo "== llama.cpp at $((SECONDS - T0)) s"
for m in llama1b-q4_0 llama1b-q4_k_m llama8b-q4_k_m; do
  timeout 80 $B/llama-bench -m $M/$m.gguf -ngl 99 -p 512,2048 -n 128 -r 3 2>&1 | grep -E "pp|tg|error" | tail -3
done
for m in llama1b-q4_0 llama1b-q4_k_m; do
  timeout 60 $B/llama-batched-bench -m $M/$m.gguf -ngl 99 -c 16384 -b 2048 -ub 512 -npp 32 \
    -ntg 64 -npl 1,8,64 2>&1 | grep -E "^\|  |error" | tail -3
done
echo "== HTTP, 1.1B Q4_0 at $((SECONDS - T0)) s"
LOAD="--concurrency 1,8,64 --requests 128 --prompt-len 32 --max-tokens 64 --markdown"
python3 -m modelc run $M/llama1b-q4_0.gguf --device cuda --max-concurrent 64 --max-context 256 \
  --speculate off --port 18080 >"$OUT/modelc_server.log" 2>&1 &
SP=$!
for _ in $(seq 1 60); do curl -sf http://127.0.0.1:18080/health >/dev/null && break; sleep 1; done
timeout 100 python3 -m modelc bench --url http://127.0.0.1:18080 $LOAD 2>&1 | tail -6
kill $SP; wait $SP 2>/dev/null
$B/llama-server -m $M/llama1b-q4_0.gguf -ngl 99 -np 64 -c 16384 --port 18081 >"$OUT/llama_server.log" 2>&1 &
LP=$!
for _ in $(seq 1 60); do curl -sf http://127.0.0.1:18081/health >/dev/null && break; sleep 1; done
timeout 100 python3 -m modelc bench --url http://127.0.0.1:18081 $LOAD 2>&1 | tail -6
kill $LP; wait $LP 2>/dev/null
echo "== -ngl 16 of the 8B at $((SECONDS - T0)) s"
if [ $((SECONDS - T0)) -lt 470 ]; then
  timeout 60 $B/llama-bench -m $M/llama8b-q4_k_m.gguf -ngl 16 -p 64 -n 32 -r 2 2>&1 | grep -E "pp|tg|error" | tail -2
  timeout $((585 - (SECONDS - T0))) python3 bench/cuda_bench.py --offload $M/llama8b-q4_k_m.gguf \
    --ngl 16 --steps 32 --no-hf 2>&1 | grep -vi warn | tail -6
fi
echo "== end at $((SECONDS - T0)) s"
