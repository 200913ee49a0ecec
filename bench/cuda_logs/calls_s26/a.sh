# Session 26, call A (H100/H200): set up, the kernel tests (attention fixed in 84bc831) beside
# llama.cpp's build, then the 1.1B Q4_0 served over HTTP at 64 streams: the GIL's share of
# each thread (py-spy, bench/gil_wait.py), a GIL hand-back's wait (bench/gil_probe.py), the
# engine in-process at the load's shape, and llama-server on the same file.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/cuda-logs}; mkdir -p "$OUT"
T0=$SECONDS; M=/tmp/m35; B=/tmp/lsrc/llama.cpp/build/bin
export PYTHONPATH=/tmp/site:$PWD M OUT
at() { echo "== $1 at $((SECONDS - T0)) s"; }
left() { echo $((585 - (SECONDS - T0))); }
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl || exit 1
(python3 setup.py build_ext --inplace >"$OUT/ext_build.log" 2>&1) & EB=$!
touch /tmp/llama_building
([ -x $B/llama-server ] || bash scripts/llamacpp_cuda.sh build "$PWD/.devrun/llama_src.tar.zst" 12 \
  >"$OUT/llama_build.log" 2>&1; rm -f /tmp/llama_building) &
[ -f $M/llama1b-q4_0.gguf ] || python3 -m tests.gen_cuda_models $M >"$OUT/gen.log" 2>&1
wait $EB; tail -1 "$OUT/ext_build.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
python3 -c "import sys, cupy; print(sys.version.split()[0], 'cupy', cupy.__version__)"
at "kernel tests (llama.cpp building beside)"
MODELC_CUDA_1B_DIR=$M timeout 200 python3 -m pytest -q --noconftest -p no:cacheprovider -rs \
  tests/test_cuda_kernels.py >"$OUT/tests_kernels.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_kernels.log" | head -12
at "waiting for llama.cpp"
while [ -f /tmp/llama_building ]; do sleep 2; done; ls $B | tr '\n' ' '; echo
serve() {  # $1 label; $LAUNCH: what runs modelc; 64 streams twice (cold, warm), then 1 stream
  local L=$1
  PYTHONPATH=/tmp/site:$PWD python3 ${LAUNCH:--m modelc} run $M/llama1b-q4_0.gguf --device cuda \
    --max-concurrent 64 --max-context 256 --speculate off --port 18070 >"$OUT/server_$L.log" 2>&1 &
  for _ in $(seq 1 90); do curl -sf http://127.0.0.1:18070/health >/dev/null && break; sleep 1; done
  for run in cold warm; do
    echo "-- $L, 64 streams, $run"
    if [ $run = warm ] && [ $L = now ]; then
      (sleep 1; PATH=/tmp/site/bin:$PATH python3 -m bench.gil_wait --seconds 5 \
        --pid "$(pgrep -f "run $M/llama1b" | head -1)" --raw "$OUT/pyspy_$L.txt" >"$OUT/gil_$L.md" 2>&1) &
    fi
    timeout 40 python3 -m modelc bench --url http://127.0.0.1:18070 --concurrency 64 --requests 128 \
      --prompt-len 32 --max-tokens 64 --markdown 2>&1 | tail -1
  done
  echo "-- $L, 1 stream"
  timeout 30 python3 -m modelc bench --url http://127.0.0.1:18070 --concurrency 1 --requests 8 \
    --prompt-len 32 --max-tokens 64 --markdown 2>&1 | tail -1
  pkill -f "run $M/llama1b-q4_0.gguf"; sleep 2
}
at "HTTP"
serve now
cat "$OUT/gil_now.md"
LAUNCH="-m bench.gil_probe --every 1 --" serve probe
grep gil_probe "$OUT/server_probe.log" | tail -12
$B/llama-server -m $M/llama1b-q4_0.gguf -ngl 99 -np 64 -c 16384 --port 18081 >"$OUT/llama_server.log" 2>&1 &
LP=$!
for _ in $(seq 1 60); do curl -sf http://127.0.0.1:18081/health >/dev/null && break; sleep 1; done
for run in cold warm; do
  echo "-- llama-server, 64 streams, $run"
  timeout 40 python3 -m modelc bench --url http://127.0.0.1:18081 --concurrency 64 --requests 128 \
    --prompt-len 32 --max-tokens 64 --markdown 2>&1 | tail -1
done
kill $LP; wait $LP 2>/dev/null
at "the engine in process at the load's shape (no HTTP)"
timeout $(left) python3 -m bench.engine_overhead --model $M/llama1b-q4_0.gguf --device cuda --real-forward \
  --streams 64 --requests 128 --tokens 60,64 --prompt-len 192 --reps 1 2>&1 | tail -6
at "end"
