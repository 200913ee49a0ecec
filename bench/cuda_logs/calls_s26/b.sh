# Session 26, call B: the GPU tests (the mixed-step graphs, the KV cache's one-copy prefix
# reads and fills) beside llama.cpp's build, then the 1.1B Q4_0 over HTTP at 64 streams:
# e73d2cc (call A's code) and now, alternated, llama-server, a py-spy profile of now.
# (Its PROFILE branch's bare `wait` waited for the server too: the call ran out its 600 s
# there, after the figures below it were printed.  `scripts/cuda_side_by_side.sh ab` is the
# mended form.)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/cuda-logs}; mkdir -p "$OUT"
T0=$SECONDS; M=/tmp/m35; B=/tmp/lsrc/llama.cpp/build/bin
export PYTHONPATH=/tmp/site:$PWD M OUT
at() { echo "== $1 at $((SECONDS - T0)) s"; }
unz() { python3 -c "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(open(sys.argv[1], 'rb'), sys.stdout.buffer)" "$1"; }
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl || exit 1
(python3 setup.py build_ext --inplace >"$OUT/ext_build.log" 2>&1) & EB=$!
mkdir -p /tmp/old && (cd /tmp/old && unz "$OLDPWD/.devrun/old_e73d2cc.tar.zst" | tar xf - \
  && python3 setup.py build_ext --inplace >"$OUT/old_ext.log" 2>&1) & OB=$!
touch /tmp/llama_building
([ -x $B/llama-server ] || bash scripts/llamacpp_cuda.sh build "$PWD/.devrun/llama_src.tar.zst" 10 \
  >"$OUT/llama_build.log" 2>&1; rm -f /tmp/llama_building) &
[ -f $M/llama1b-q4_0.gguf ] || python3 -m tests.gen_cuda_models $M >"$OUT/gen.log" 2>&1
wait $EB; tail -1 "$OUT/ext_build.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
at "GPU tests (llama.cpp building beside)"
MODELC_CUDA_1B_DIR=$M timeout 200 python3 -m pytest -q --noconftest -p no:cacheprovider -rs \
  tests/test_cuda_kernels.py >"$OUT/tests_kernels.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_kernels.log" | head -12
MODELC_MATMUL=exact timeout 170 python3 -m pytest -q --noconftest -p no:cacheprovider \
  -rs tests/test_cuda.py tests/test_cuda_route.py >"$OUT/tests_cuda.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_cuda.log" | head -12
wait $OB
at "waiting for llama.cpp"
while [ -f /tmp/llama_building ]; do sleep 2; done
serve() {  # $1 label, $2 checkout: 64 streams twice (cold, warm), 1 stream; PROFILE=1: a py-spy run
  local L=$1 R=$2
  (cd "$R" && PYTHONPATH=/tmp/site:$R python3 -m modelc run $M/llama1b-q4_0.gguf --device cuda \
    --max-concurrent 64 --max-context 256 --speculate off --port 18070 >"$OUT/server_$L.log" 2>&1) &
  for _ in $(seq 1 90); do curl -sf http://127.0.0.1:18070/health >/dev/null && break; sleep 1; done
  for run in cold warm; do
    echo "-- $L, 64 streams, $run"
    timeout 40 python3 -m modelc bench --url http://127.0.0.1:18070 --concurrency 64 --requests 128 \
      --prompt-len 32 --max-tokens 64 --markdown 2>&1 | tail -1
  done
  if [ -n "${PROFILE:-}" ]; then
    echo "-- $L, 64 streams, under py-spy"
    (sleep 1; PATH=/tmp/site/bin:$PATH python3 -m bench.gil_wait --seconds 5 \
      --pid "$(pgrep -f "run $M/llama1b" | head -1)" --raw "$OUT/pyspy_$L.txt" >"$OUT/gil_$L.md" 2>&1) &
    timeout 40 python3 -m modelc bench --url http://127.0.0.1:18070 --concurrency 64 --requests 128 \
      --prompt-len 32 --max-tokens 64 --markdown 2>&1 | tail -1
    wait; cat "$OUT/gil_$L.md"
  fi
  echo "-- $L, 1 stream"
  timeout 30 python3 -m modelc bench --url http://127.0.0.1:18070 --concurrency 1 --requests 8 \
    --prompt-len 32 --max-tokens 64 --markdown 2>&1 | tail -1
  pkill -f "run $M/llama1b-q4_0.gguf"; sleep 2
}
at "HTTP"
serve old /tmp/old
PROFILE=1 serve now "$PWD"
serve old2 /tmp/old
$B/llama-server -m $M/llama1b-q4_0.gguf -ngl 99 -np 64 -c 16384 --port 18081 >"$OUT/llama_server.log" 2>&1 &
LP=$!
for _ in $(seq 1 60); do curl -sf http://127.0.0.1:18081/health >/dev/null && break; sleep 1; done
for run in cold warm; do
  echo "-- llama-server, 64 streams, $run"
  timeout 40 python3 -m modelc bench --url http://127.0.0.1:18081 --concurrency 64 --requests 128 \
    --prompt-len 32 --max-tokens 64 --markdown 2>&1 | tail -1
done
kill $LP; wait $LP 2>/dev/null
at "end"
