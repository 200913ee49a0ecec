#!/usr/bin/env bash
# modelc against llama.cpp CUDA on the same random models, on the lent GPU machine
# (bench/RESULTS.md "Side by side with llama.cpp CUDA, the whole table"), in two calls:
#   bash scripts/cuda_side_by_side.sh         (~9 min: builds, checks, then the kernels' figures)
#   bash scripts/cuda_side_by_side.sh http    (~6 min, on the same machine while warm: HTTP and
#                                              the 8B split with the CPU)
#   bash scripts/cuda_side_by_side.sh webgpu  (~3 min, warm too: the WebGPU backend through
#                                              NVIDIA's Vulkan driver, carry .gl: the Vulkan
#                                              loader's .deb, parity and decode next to CUDA)
#   bash scripts/cuda_side_by_side.sh pdl     (~7 min: the GPU tests with MODELC_CUDA_PDL=1, batch-1
#                                              decode with it and without, alternated; QUICK=1
#                                              test_cuda.py only; PDL_MODELS="a b": the models;
#                                              PDL_TESTK: test_cuda.py's tests by -k)
#   bash scripts/cuda_side_by_side.sh gemv    (~6 min: the pipelined GEMV (cuda_gemvp) -- its GPU
#                                              tests, the 1.1B's and 8B's shapes against the wide
#                                              GEMV and a pure read, batch-1 decode with each,
#                                              alternated; GEMV_PLANS: its plans to sweep;
#                                              GEMV_TESTK: test_cuda.py's tests by -k beside;
#                                              GEMV_TYPES, GEMV_SHAPES: the sweep's; GEMV_MODELS,
#                                              GEMV_STREAMS: the decode runs'; each model wide,
#                                              pipe with the norm launched, pipe norming itself,
#                                              or GEMV_SETS; GEMV_TESTS: the test files;
#                                              GEMV_KINDS, GEMV_SWEEP: the sweep's kinds and more
#                                              arguments; GEMV_BY: the kind its 8B Q4_K lines show;
#                                              OLD=abc1234: that commit unpacked for a setting
#                                              "@/tmp/old_abc1234" in GEMV_SETS)
#   OLD=abc1234 bash scripts/cuda_side_by_side.sh decode  (~5 min: the GPU tests here, batch-1
#                                              decode alternated with the old code; DECODE_SETS,
#                                              DECODE_MODELS, DECODE_TESTS; PROFILE=1: the 8B's
#                                              eager step kernel by kernel)
#   bash scripts/cuda_side_by_side.sh ms1     (~8 min: issue 35's must-shows 1 and 3 alone: batch-1
#                                              decode and pp2048, modelc and llama-bench on the same
#                                              files; MS1_MODELS: which; MS1_SETS, OLD, MS1_TESTS:
#                                              settings / old code alternated, the GPU tests first;
#                                              FLOOR=1: bench/cuda_floor.py on each model;
#                                              NO_LLAMA=1: no llama.cpp, ~4 min; FLOOR_ARGS:
#                                              cuda_floor.py's arguments)
#   bash scripts/cuda_side_by_side.sh tests37 (~4 min: session 37's GPU tests alone)
#   bash scripts/cuda_side_by_side.sh depth   (~8 min: decode after a DEPTH-token prompt (4000),
#                                              modelc's attention unsplit and split
#                                              (DEPTH_SETS), llama-bench -d beside)
#   OLD="abc1234 [def5678]" bash scripts/cuda_side_by_side.sh ab  (~5 min from a bare machine, ~8
#       with LLAMA=1: the GPU tests, then HTTP at 64 streams, greedy and sampled as
#       llama-server's defaults: each commit in .devrun/old_$OLD.tar.zst
#       (scripts/device_wheels.sh OLD), this checkout, and with MODELC_CUDA_SAMPLER=batch;
#       SPLITLOAD=1: each server's warm load again from two client processes;
#       TRACE=1: a server under bench.wake_trace (what runs between a step's end and the
#       scheduler's turn); GILRUN=1: the kernel tests and a server with MODELC_CUDA_LAUNCH=gil too; the engine
#       in process; PROFILE=1: a py-spy profile; LLAMA=1 builds llama.cpp at nice 19
#       beside and ends with llama-server; QUICK=1: no kernel tests, no batched-sampler
#       server, no engine in process: ~3 min; IORUN=1: the tests with MODELC_CUDA_STEP_IO=graph,
#       and a server so where they pass; COLDRUN=1: servers with MODELC_CUDA_MIXED_BUCKET=32,
#       MODELC_CUDA_CAPTURE_FIRST=1 and both, and MODELC_CUDA_MIXED_KEY=rows with each
#       bucket; the graph steps after each load); FAMILIES=1: every tiny family on CUDA
#       against the CPU (tests/test_cuda_families.py, ~2 min); STEPS="1 4": a server with --scheduler-steps N
#       for each N (multi-step batches; 0 is auto, "now" the default 1), and with the step I/O
#       too where IORUN's tests passed); REPEAT=2: the old commits, this checkout, its
#       step I/O server and SERVE_SETS' servers twice, in turn; SERVE_SETS="lbl:A=1 --flag=v;..."
#       a server of this checkout with those env assignments and modelc run flags in each
#       round; RUNS="cold warm warm2": each server's loads; NO1=1: no one-stream load;
#       PRIME=1: a first server of this checkout compiling its kernels into CuPy's cache
#       (unprimed, the first one pays NVRTC in its cold and sampled loads); PACK=1: every log
#       in one logs.tgz (a call brings back 8 files at most))
# Here, once a checkout: bash scripts/device_wheels.sh [OLD_COMMIT] (the .whl, .devrun and .gl
# folders below, from the registries), or by hand:
# scripts/llamacpp_cuda.sh pack <sdist>/vendor/llama.cpp .devrun/llama_src.tar.zst
# and, for the HTTP baseline (the code issue 35 was filed against), git archive dfffbcb |
# zstd -19 -o .devrun/old_dfffbcb.tar.zst (.devrun and .whl ignored by git: .git/info/exclude);
# carry .whl and .devrun.  What session 23 learnt: llama.cpp's build (~4.5 min on 12 jobs)
# takes the host's cores, so timings wait for it (the GPU checks run beside it); each model
# is timed in a process of its own (a third model built in one process once failed,
# docs/gpu.md); a server's first load test paid a graph capture per new row count, so
# HTTP is run twice on one server (cold, warm), and again without the graph buckets
# (MODELC_CUDA_GRAPH_BUCKETS=0) and with --stream-interval 8.  Session 24: the three
# calls can run back to back on one warm machine (each within 30 s of the last); the
# .whl folder holds py-spy's wheel, which profiles the server's warm load
# ($OUT/pyspy_now.txt: where the ~9 ms a step beyond the GPU's 3 ms go; $OUT/gil_now.md:
# how much of it each thread spends waiting for the GIL, bench/gil_wait.py).  Session 26:
# py-spy halves the server's speed while it samples, so it profiles a third load of its
# own, never one whose figures are reported.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/cuda-logs}
mkdir -p "$OUT"
T0=$SECONDS
M=/tmp/m35
B=/tmp/lsrc/llama.cpp/build/bin
export PYTHONPATH=/tmp/site:$PWD M OUT
at() { echo "== $1 at $((SECONDS - T0)) s"; }
unz() { python3 -c "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(open(sys.argv[1], 'rb'), sys.stdout.buffer)" "$1"; }

copy_bw() {  # the GPU's device-to-device copy, bytes read and written a second (the bandwidth limit)
  python3 -c "import cupy; from bench.cuda_floor import copy_tbs; print(f'{copy_tbs(cupy) * 1e12:.4g}')"
}
alternate() {  # $1 streams, $2 settings ("A=1 B=2;A=0": env assignments, ";" apart), then models:
  # cuda_bench.py's decode of each model with each setting in turn, each run a process of its
  # own ($BW: the copy bandwidth)
  # (a setting "@DIR": that checkout's code, e.g. @/tmp/old_abc1234 from old_checkout;
  # $BENCH_ARGS: more cuda_bench.py arguments, e.g. "--prompt-len 4000")
  local streams=$1 sets=$2 m v dir
  shift 2
  for m in "$@"; do
    while IFS= read -r v; do
      echo "-- $m, $v"
      dir=$PWD
      [[ $v == @* ]] && dir=${v#@} && v=
      # shellcheck disable=SC2086
      (cd "$dir" && env $v PYTHONPATH="/tmp/site:$dir" timeout 100 python3 bench/cuda_bench.py --no-hf \
        --no-variants --streams "$streams" --steps 64 --bw "$BW" --model "$M/$m.gguf" ${BENCH_ARGS:-} 2>&1 \
        | grep -E '^\{|Error|error' | tail -3)
    done <<<"${sets//;/$'\n'}"
  done
}
tbs() { awk -v b="$1" 'BEGIN { printf "device copy: %.2f TB/s\n", b / 1e12 }'; }
graphs() {  # the server's steps so far: replayed / captured / eager (CudaLlama.graph_steps);
  # its batches since the last call and their ms a batch: the step thread's, the
  # scheduler's wake-up after each, its delivery and planning before the next (BatchDepth)
  curl -s http://127.0.0.1:18070/metrics | python3 -c "
import json, os, re, sys
f = os.environ['OUT'] + '/.metrics_prev'
now = {m[1]: float(m[2]) for m in re.finditer(r'^modelc_engine_(graph_steps_[a-z]+|scheduled_batches|[a-z]+_seconds)[{ ].*?([0-9.e+-]+)$', sys.stdin.read(), re.M)}
prev = json.load(open(f)) if os.path.exists(f) else {}
json.dump(now, open(f, 'w'))
d = {k: v - prev.get(k, 0.0) for k, v in now.items()}
n = max(d.get('scheduled_batches', 0.0), 1.0)
g = ' '.join(f'{k[12:]} {int(v)}' for k, v in now.items() if k.startswith('graph_steps'))
ms = ' / '.join(f\"{1e3 * d.get(k + '_seconds', 0.0) / n:.2f}\" for k in ('step', 'wake', 'plan'))
print(f'{g}; {int(n)} batches, ms a batch step / wake / plan {ms}')
"
}
serve() {  # $1 label, $2 checkout, then env assignments; 64 streams twice (cold, warm), 1 stream;
  # $ARGS: more arguments for modelc run; $LAUNCH: what runs it (python3 LAUNCH run ...);
  # $SAMPLED: a third load sampled as llama-server's defaults; $REQS: requests a load (128);
  # $PROFILE: one more load
  # under py-spy (bench/gil_wait.py: $OUT/gil_$1.md)
  local L=$1 R=$2 a; shift 2
  local ev=() xa=()  # env assignments; "--flag=value" items go to modelc run
  for a in "$@"; do case $a in --*) xa+=("$a") ;; *) ev+=("$a") ;; esac; done
  rm -f "$OUT/.metrics_prev"
  # shellcheck disable=SC2086
  (cd "$R" && env "${ev[@]}" PYTHONPATH=/tmp/site:$R python3 ${LAUNCH:--m modelc} run $M/llama1b-q4_0.gguf --device cuda \
    --max-concurrent 64 --max-context 256 --speculate off --port 18070 ${ARGS:-} "${xa[@]}" >"$OUT/server_$L.log" 2>&1) &
  for _ in $(seq 1 90); do curl -sf http://127.0.0.1:18070/health >/dev/null && break; sleep 1; done
  local runs=${RUNS:-"cold warm ${SAMPLED:+sampled}"}  # RUNS: the loads (cold warm sampled)
  # PROFILE=1: the last server (prof) one more load, under py-spy
  [ -n "${PROFILE:-}" ] && [ "$L" = prof ] && [ -x /tmp/site/bin/py-spy ] && runs="$runs profiled"
  for run in $runs; do
    echo "-- $L, 64 streams, $run"
    local GW='' how='' n=${REQS:-128}
    # llama-server's defaults: every step samples 64 rows (the batched sampler's many
    # device calls) where the greedy loads take the argmax
    case $run in sampled*) how="--temperature 0.8 --top-k 40 --top-p 0.95 --min-p 0.05" ;; esac
    [ $run = profiled ] && n=512  # outlasts py-spy's 5 s (128 requests take ~2 s on an H100)
    if [ $run = profiled ]; then  # native stacks, idle included: each thread's share running /
      # waiting for the GIL / idle, and the raw profile for the Python-level view
      (sleep 1; PATH=/tmp/site/bin:$PATH timeout 20 python3 -m bench.gil_wait --seconds 5 \
        --pid "$(pgrep -f "run $M/llama1b" | head -1)" --raw "$OUT/pyspy_$L.txt" >"$OUT/gil_$L.md" 2>&1) &
      GW=$!
    fi
    # shellcheck disable=SC2086
    timeout 60 python3 -m modelc bench --url http://127.0.0.1:18070 --concurrency 64 --requests $n \
      --prompt-len 32 --max-tokens 64 $how --markdown 2>&1 | tail -1
    [ -n "$GW" ] && wait "$GW" && cat "$OUT/gil_$L.md"
    graphs  # so far: a load's own eager steps and captures are the difference from the last
  done
  if [ -n "${SPLITLOAD:-}" ]; then  # SPLITLOAD=1: the warm load from two client processes of
    # 32 streams each: more than the one client's tok/s says that client was a limit
    echo "-- $L, 64 streams from two clients"
    local pids=()  # never a bare wait: the server (and llama.cpp's build) run beside
    for c in 1 2; do
      timeout 60 python3 -m modelc bench --url http://127.0.0.1:18070 --concurrency 32 --requests 64 \
        --prompt-len 32 --max-tokens 64 --json >"$OUT/split_$L$c.json" 2>/dev/null &
      pids+=($!)
    done
    wait "${pids[@]}"
    python3 -c "import json, sys; ls = [json.load(open(f))['levels'][0] for f in sys.argv[1:]]; \
print(f\"{sum(x['output_tokens'] for x in ls) / max(x['wall_s'] for x in ls):,.1f} tok/s together\")" \
      "$OUT/split_${L}1.json" "$OUT/split_${L}2.json"
    rm -f "$OUT/split_${L}1.json" "$OUT/split_${L}2.json"
    graphs
  fi
  [ -n "${NO1:-}" ] || echo "-- $L, 1 stream"  # NO1=1: no one-stream load
  [ -n "${NO1:-}" ] || timeout 40 python3 -m modelc bench --url http://127.0.0.1:18070 --concurrency 1 --requests 12 \
    --prompt-len 32 --max-tokens 64 --markdown 2>&1 | tail -1
  pkill -f "run $M/llama1b-q4_0.gguf"; sleep 2
}
setup() {  # wheels, the CPU kernels, the models; llama.cpp built beside ($1: nice level)
  # the host: a server's HTTP figures follow its CPU (the GPU's step is a fifth of a step)
  echo "host: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
  [ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl || exit 1
  (python3 setup.py build_ext --inplace >"$OUT/ext_build.log" 2>&1) &
  EB=$!
  if [ -n "${1:-}" ]; then
    touch /tmp/llama_building
    ([ -x $B/llama-server ] || nice -n "$1" bash scripts/llamacpp_cuda.sh build \
      "$PWD/${LLAMA_SRC:-.devrun/llama_src.tar.zst}" 12 >"$OUT/llama_build.log" 2>&1; rm -f /tmp/llama_building) &
  fi
  # the 1.1Bs (not when $PDL_MODELS names none of them)
  case "${PDL_MODELS:-llama1b}" in *llama1b*)
    [ -f $M/llama1b-q4_k_m.gguf ] || python3 -m tests.gen_cuda_models $M >"$OUT/gen.log" 2>&1 ;;
  esac
  wait $EB
}
llama_server() {  # llama-server -np 64 on the same file, the same load twice
  while [ -f /tmp/llama_building ]; do sleep 2; done
  $B/llama-server -m $M/llama1b-q4_0.gguf -ngl 99 -np 64 -c 16384 --port 18081 >"$OUT/llama_server.log" 2>&1 &
  local LP=$!
  for _ in $(seq 1 60); do curl -sf http://127.0.0.1:18081/health >/dev/null && break; sleep 1; done
  for run in cold warm ${SAMPLED:+sampled}; do
    echo "-- llama-server, 64 streams, $run"
    local how=
    [ $run = sampled ] && how="--temperature 0.8 --top-k 40 --top-p 0.95 --min-p 0.05"
    # shellcheck disable=SC2086
    timeout 40 python3 -m modelc bench --url http://127.0.0.1:18081 --concurrency 64 --requests 128 \
      --prompt-len 32 --max-tokens 64 $how --markdown 2>&1 | tail -1
  done
  kill $LP; wait $LP 2>/dev/null
}
old_checkout() {  # .devrun/old_$1.tar.zst unpacked and built in /tmp/old_$1
  mkdir -p "/tmp/old_$1" && (cd "/tmp/old_$1" && unz "$OLDPWD/.devrun/old_$1.tar.zst" | tar xf - \
    && python3 setup.py build_ext --inplace >"$OUT/old_$1_ext.log" 2>&1)
}

start_ab() {  # setup (the 1.1Bs made, as the GPU tests read them; $1: llama.cpp built beside
  # at that nice level), then in the background OLD's checkout and the 8B (their PIDs in
  # AB_PIDS: wait "${AB_PIDS[@]}", not for the build), the copy bandwidth
  setup "${1:-}"
  AB_PIDS=()
  if [ -n "${OLD:-}" ]; then old_checkout "$OLD" & AB_PIDS+=($!); fi
  ([ -f $M/llama8b-q4_k_m.gguf ] || python3 -m tests.gen_cuda_models $M 8b-q4_k_m >"$OUT/gen8b.log" 2>&1) &
  AB_PIDS+=($!)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  BW=$(copy_bw)
  tbs "$BW"
}
# session 37's GPU tests of tests/test_cuda.py (MXFP4 and BF16 as stored, sinks, the families
# (device-resident by default since session 38), the mixtures' routing now on the host), by -k
S37_K="families_match or gptoss or smollm3 or olmo2 or mistral3 or phi4mini or glm4moe or norm_silu or MXFP4 or BF16"
gpu_tests() {  # $1 a log's name, $2 a timeout, then pytest's files: run, failures shown
  local log="$OUT/tests_$1.log" t=$2
  shift 2
  MODELC_CUDA_1B_DIR=$M timeout "$t" python3 -m pytest -q --noconftest -p no:cacheprovider -rfEs "$@" >"$log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$log" | head -12
  grep -hE "^E |^[a-z_/]+\.py:[0-9]+: " "$log" | head -20
}

if [ "${1:-}" = ab ]; then  # ~8 min with LLAMA=1 (its build beside the tests)
  export SAMPLED=1
  setup ${LLAMA:+19}
  OB=()
  for o in ${OLD:-}; do old_checkout "$o" & OB+=($!); done  # OLD: one commit or several
  at "GPU tests${IORUN:+ (MODELC_CUDA_STEP_IO=graph)}"
  IO=()  # IORUN=1: the tests with each step's own I/O (cuda_io), and a server so
  [ -n "${IORUN:-}" ] && IO=(MODELC_CUDA_STEP_IO=graph)
  if [ -z "${QUICK:-}" ] && [ -z "${NOTESTS:-}" ]; then  # NOTESTS=1: no GPU tests at all
    env "${IO[@]}" MODELC_CUDA_1B_DIR=$M timeout 150 python3 -m pytest -q --noconftest \
      -p no:cacheprovider -rfEs tests/test_cuda_kernels.py >"$OUT/tests_kernels.log" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_kernels.log" | head -12
  fi
  GIL=cupy
  if [ -n "${GILRUN:-}" ]; then  # the same with launches keeping the GIL (cuda_launch)
    MODELC_CUDA_LAUNCH=gil MODELC_CUDA_1B_DIR=$M timeout 150 python3 -m pytest -q --noconftest \
      -p no:cacheprovider -rfEs tests/test_cuda_kernels.py >"$OUT/tests_kernels_gil.log" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_kernels_gil.log" | head -12
    grep -qE "^(FAILED|ERROR)| failed| error" "$OUT/tests_kernels_gil.log" || GIL=gil
  fi
  [ -f .gpuA/smollm2_rows.npy ] && export MODELC_TEST_LOGITS=$PWD/.gpuA/smollm2_rows.npy
  # ABK="expr": those GPU tests alone (pytest -k)
  [ -z "${NOTESTS:-}" ] && env "${IO[@]}" MODELC_MATMUL=exact MODELC_CUDA_1B_DIR=$M timeout 150 python3 -m pytest -q \
    --noconftest -p no:cacheprovider -rfEs ${ABK:+-k "$ABK"} tests/test_cuda.py tests/test_cuda_route.py \
    tests/test_cuda_sampler.py tests/test_cuda_io.py >"$OUT/tests_cuda.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_cuda.log" | head -12
  grep -E "^E |^[a-z_/]+\.py:[0-9]+: " "$OUT/tests_cuda.log" | head -30  # why, where one failed
  if [ -n "${FAMILIES:-}" ]; then  # FAMILIES=1: every tiny family on CUDA against the CPU
    MODELC_MATMUL=exact timeout 240 python3 -m pytest -q --noconftest -p no:cacheprovider -rfEs \
      tests/test_cuda_families.py >"$OUT/tests_families.log" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_families.log" | head -20
  fi
  COLDOK=1  # COLDRUN=1: the mixed steps' GPU test at 32s and captured at once, first
  if [ -n "${COLDRUN:-}" ]; then
    timeout 120 python3 -m pytest -q --noconftest -p no:cacheprovider -rfEs \
      tests/test_cuda_kernels.py -k mixed_steps >"$OUT/tests_cold.log" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_cold.log" | head -5
    grep -qE "^(FAILED|ERROR)| failed| error" "$OUT/tests_cold.log" && COLDOK=
  fi
  [ ${#OB[@]} -gt 0 ] && wait "${OB[@]}"  # never a bare wait: llama.cpp's build runs beside
  at "HTTP, alternated"
  IOOK=1
  grep -qE "^(FAILED|ERROR)| failed| error" "$OUT/tests_kernels.log" "$OUT/tests_cuda.log" 2>/dev/null && IOOK=
  # PRIME=1: a server of this checkout first, its few loads compiling the kernels into
  # CuPy's cache (else the first server of this checkout pays NVRTC in its cold and sampled loads)
  [ -n "${PRIME:-}" ] && REQS=32 RUNS="cold sampled" NO1=1 serve prime "$PWD" >/dev/null
  # SERVE_SETS="label:A=1 B=2 --flag=v;label2:C=3": a server of this checkout with each set
  # of env assignments (and modelc run's --flags), in every round after this checkout's
  for rep in $(seq 1 "${REPEAT:-1}"); do  # REPEAT=2: every server twice, in turn
    for o in ${OLD:-}; do serve "old_$o$rep" "/tmp/old_$o"; done
    serve "now$rep" "$PWD"
    [ -n "${IORUN:-}" ] && [ -n "$IOOK" ] && serve "io$rep" "$PWD" MODELC_CUDA_STEP_IO=graph
    while IFS= read -r set; do
      [ -n "$set" ] || continue
      # shellcheck disable=SC2086
      serve "${set%%:*}$rep" "$PWD" ${set#*:}
    done <<<"${SERVE_SETS//;/$'\n'}"
  done
  for k in ${STEPS:-}; do  # multi-step batches (--scheduler-steps), alone and with the step I/O
    ARGS="--scheduler-steps $k" serve "steps$k" "$PWD"
    if [ -n "${IORUN:-}" ] && [ -n "$IOOK" ]; then
      ARGS="--scheduler-steps $k" serve "io_steps$k" "$PWD" MODELC_CUDA_STEP_IO=graph
    fi
  done
  if [ -n "${COLDRUN:-}" ] && [ -n "$COLDOK" ]; then  # the cold load: fewer shapes, captured at once
    serve bucket32 "$PWD" MODELC_CUDA_MIXED_BUCKET=32
    serve first "$PWD" MODELC_CUDA_CAPTURE_FIRST=1
    serve first32 "$PWD" MODELC_CUDA_CAPTURE_FIRST=1 MODELC_CUDA_MIXED_BUCKET=32
    # one graph a row bucket of the mixed steps, all captured as the model loads
    serve fixed "$PWD" MODELC_CUDA_MIXED_KEY=rows
    serve fixed32 "$PWD" MODELC_CUDA_MIXED_KEY=rows MODELC_CUDA_MIXED_BUCKET=32
  fi
  [ $GIL = gil ] && [ -n "${GILRUN:-}" ] && serve gil "$PWD" MODELC_CUDA_LAUNCH=gil
  if [ -z "${QUICK:-}" ]; then
    serve batch "$PWD" MODELC_CUDA_SAMPLER=batch  # the batched sampler, before the default
    at "the engine in process, the HTTP load's shape"
    timeout 60 python3 -m bench.engine_overhead --model $M/llama1b-q4_0.gguf --device cuda \
      --real-forward --streams 64 --requests 128 --tokens 64,64 --prompt-len 32 --reps 1 \
      2>&1 | tail -5
  fi
  [ -n "${PROFILE:-}" ] && serve prof "$PWD"  # the defaults, profiled
  if [ -n "${TRACE:-}" ]; then  # TRACE=1: a server under bench.wake_trace: what the event loop
    # runs from each step's end to the scheduler's turn
    LAUNCH="-m bench.wake_trace --out $OUT/wake_trace.txt --" serve trace "$PWD"
    sleep 3; cat "$OUT/wake_trace.txt"
  fi
  [ -n "${LLAMA:-}" ] && llama_server
  at "end"
  # PACK=1: every log in one archive (at most 8 files come back from a call)
  if [ -n "${PACK:-}" ]; then
    (cd "$OUT" && tar czf /tmp/logs.tgz --exclude=.metrics_prev . && find . -type f -delete \
      && mv /tmp/logs.tgz logs.tgz)
  fi
  exit 0
fi

if [ -z "${1:-}" ]; then
  setup 0
  [ -f $M/llama8b-q4_k_m.gguf ] || python3 -m tests.gen_cuda_models $M 8b-q4_k_m >"$OUT/gen8b.log" 2>&1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  tbs "$(copy_bw)"
  at "GPU checks (llama.cpp building beside)"
  MODELC_CUDA_1B_DIR=$M timeout 200 python3 -m pytest -q --noconftest -p no:cacheprovider -rs \
    tests/test_cuda_kernels.py >"$OUT/tests_kernels.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_kernels.log" | head -20
  MODELC_CUDA_GRAPH_BUCKETS=1 MODELC_MATMUL=exact timeout 150 python3 -m pytest -q --noconftest -p no:cacheprovider \
    -rs tests/test_cuda.py >"$OUT/tests_cuda.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_cuda.log" | head -20
  [ -n "${NO_LLAMA:-}" ] && { at "end"; exit 0; }
  at "waiting for llama.cpp"
  while [ -f /tmp/llama_building ]; do sleep 2; done
  at "modelc decode steps"
  for m in llama1b-q4_0 llama1b-q4_k_m; do  # a process a model
    timeout 60 python3 bench/cuda_bench.py --no-hf --no-variants --streams 1,8,64 --steps 48 --bw 3.02e12 \
      --model $M/$m.gguf --json "$OUT/bench_$m.json" 2>&1 | grep -E "^\||captured|Error"
  done
  at "modelc prefill and the 8B"
  for m in llama1b-q4_0 llama1b-q4_k_m llama8b-q4_k_m; do
    timeout 60 python3 -m modelc bench $M/$m.gguf --device cuda --prompt-lens 512,2048 --batches 1 \
      --steps 16 --reps 2 2>&1 | grep -E "prefill|decode" | sed "s/^/$m /"
  done
  at "llama.cpp"
  for m in llama1b-q4_0 llama1b-q4_k_m llama8b-q4_k_m; do
    timeout 60 $B/llama-bench -m $M/$m.gguf -ngl 99 -p 512,2048 -n 128 -r 3 2>&1 | grep -E "pp|tg|error"
  done
  for m in llama1b-q4_0 llama1b-q4_k_m; do
    timeout 60 $B/llama-batched-bench -m $M/$m.gguf -ngl 99 -c 16384 -b 2048 -ub 512 -npp 32 \
      -ntg 64 -npl 1,8,64 2>&1 | grep -E "^\|  |error" | tail -3
  done
  at "models in turn in one process"
  timeout 60 python3 bench/cuda_models_in_turn.py $M/llama1b-q4_0.gguf $M/llama1b-q4_k_m.gguf \
    $M/llama8b-q4_k_m.gguf 2>&1 | grep -E "ok|failed"
  at "end"
  exit 0
fi

if [ "${1:-}" = pdl ]; then  # ~7 min from a bare machine: programmatic dependent launch
  # (MODELC_CUDA_PDL=1, cuda_launch): the GPU tests with it, then batch-1 decode of the 1.1Bs
  # and the 8B with and without it, alternated, each run a process of its own
  setup
  ([ -f $M/llama8b-q4_k_m.gguf ] || python3 -m tests.gen_cuda_models $M 8b-q4_k_m >"$OUT/gen8b.log" 2>&1) &
  G8=$!
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  BW=$(copy_bw)
  tbs "$BW"
  at "GPU tests with MODELC_CUDA_PDL=1"
  if [ -z "${QUICK:-}" ]; then  # QUICK=1: test_cuda.py only
    MODELC_CUDA_PDL=1 MODELC_CUDA_1B_DIR=$M timeout 170 python3 -m pytest -q --noconftest \
      -p no:cacheprovider -rfEs tests/test_cuda_kernels.py >"$OUT/tests_kernels_pdl.log" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_kernels_pdl.log" | head -12
  fi
  MODELC_CUDA_PDL=1 MODELC_MATMUL=exact timeout 120 python3 -m pytest -q --noconftest \
    -p no:cacheprovider -rfEs tests/test_cuda.py -k "${PDL_TESTK:-}" >"$OUT/tests_cuda_pdl.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_cuda_pdl.log" | head -12
  grep -hE "^E |^[a-z_/]+\.py:[0-9]+: " "$OUT"/tests_*_pdl.log | head -20
  wait $G8
  at "batch-1 decode, PDL off / on, alternated"
  # shellcheck disable=SC2086
  alternate 1,64 "MODELC_CUDA_PDL=0;MODELC_CUDA_PDL=1" ${PDL_MODELS:-llama8b-q4_k_m llama1b-q4_k_m llama1b-q4_0 llama8b-q4_k_m}
  at "end"
  exit 0
fi

if [ "${1:-}" = gemv ]; then  # ~6 min from a bare machine: MODELC_CUDA_GEMV=pipe against wide
  start_ab  # OLD=abc1234: GEMV_SETS may name @/tmp/old_abc1234
  at "the pipelined GEMV's tests (and GEMV_TESTK: test_cuda.py's by -k)"
  # shellcheck disable=SC2086
  timeout 170 python3 -m pytest -q --noconftest -p no:cacheprovider -rfEs ${GEMV_TESTS:-tests/test_cuda_gemvp.py} \
    >"$OUT/tests_gemvp.log" 2>&1
  [ -n "${GEMV_TESTK:-}" ] && MODELC_MATMUL=exact timeout 100 python3 -m pytest -q --noconftest -p no:cacheprovider \
    -rfEs tests/test_cuda.py -k "$GEMV_TESTK" >>"$OUT/tests_gemvp.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_gemvp.log" | head -12
  grep -hE "^E |^[a-z_/]+\.py:[0-9]+: " "$OUT/tests_gemvp.log" | head -20
  at "GEMVs alone: wide, pipe (plans), a pure read of the same bytes"
  # shellcheck disable=SC2086
  timeout 170 python3 bench/cuda_gemv_sweep.py --types "${GEMV_TYPES:-Q4_K,Q6_K,Q4_0}" --kinds "${GEMV_KINDS:-wide,pipe}" \
    --rows 1 --wprs 0 --read-grids 0,1056 --pipe-plans "${GEMV_PLANS:-,16:64:2,24:96:2,24:48:3}" \
    ${GEMV_SHAPES:+--shapes "$GEMV_SHAPES"} ${GEMV_SWEEP:-} \
    >"$OUT/sweep_gemv.txt" 2>&1
  grep -m4 -E "Error|error" "$OUT/sweep_gemv.txt"
  grep -E "\| Q4_K \| - .*\| read \|" "$OUT/sweep_gemv.txt"  # the pure reads, then each kind's fastest and as served
  sed -n '/best |/,$p' "$OUT/sweep_gemv.txt"
  grep -E "^\| 8b [a-z+]+ \| Q4_K \| 1 .*\| ${GEMV_BY:-pipe} \|" "$OUT/sweep_gemv.txt"  # the 8B's Q4_K by plan
  wait "${AB_PIDS[@]}"  # the 8B (and the old checkout)
  at "batch-1 decode, MODELC_CUDA_GEMV wide / pipe, alternated"
  # shellcheck disable=SC2086
  alternate "${GEMV_STREAMS:-1,8}" "${GEMV_SETS:-MODELC_CUDA_GEMV=wide;MODELC_CUDA_GEMV=pipe MODELC_CUDA_PIPE_NORM=0;MODELC_CUDA_GEMV=pipe}" \
    ${GEMV_MODELS:-llama8b-q4_k_m llama1b-q4_k_m llama1b-q4_0 llama8b-q4_k_m}
  at "end"
  exit 0
fi

if [ "${1:-}" = depth ]; then  # ~8 min from a bare machine: decode after a long prompt (DEPTH
  # tokens, 4000), modelc's attention in one block a row and head and split in S runs
  # (MODELC_CUDA_ATTN_SPLIT), against llama.cpp's llama-bench -d at the same depth
  setup 0
  ([ -f $M/llama8b-q4_k_m.gguf ] || python3 -m tests.gen_cuda_models $M 8b-q4_k_m >"$OUT/gen8b.log" 2>&1) &
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  BW=$(copy_bw)
  tbs "$BW"
  at "the split attention's GPU test"
  timeout 120 python3 -m pytest -q --noconftest -p no:cacheprovider -rfEs tests/test_cuda_decode.py \
    >"$OUT/tests_decode.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_decode.log" | head -8
  at "waiting for llama.cpp (its build takes the host's cores)"
  while [ -f /tmp/llama_building ]; do sleep 2; done
  wait
  at "modelc decode after ${DEPTH:-4000} tokens, one block a row and head / split"
  BENCH_ARGS="--prompt-len ${DEPTH:-4000}" alternate 1 \
    "${DEPTH_SETS:-;MODELC_CUDA_ATTN_SPLIT=4;MODELC_CUDA_ATTN_SPLIT=16}" llama1b-q4_k_m llama8b-q4_k_m
  at "llama.cpp tg at depth 0 and ${DEPTH:-4000}"
  for m in llama1b-q4_k_m llama8b-q4_k_m; do
    timeout 120 $B/llama-bench -m $M/$m.gguf -ngl 99 -fa 1 -p 0 -n 64 -d 0,"${DEPTH:-4000}" -r 2 2>&1 \
      | grep -E "tg|error"
  done
  at "end"
  exit 0
fi

if [ "${1:-}" = decode ]; then  # ~5 min from a bare machine: this checkout against OLD=abc1234
  # (.devrun/old_abc1234.tar.zst) at batch 1 -- the GPU tests here (DECODE_TESTS), batch-1
  # decode alternated over DECODE_SETS (";" apart; "@/tmp/old_$OLD": the old code) and
  # DECODE_MODELS, then (PROFILE=1) where the 8B's eager step goes, kernel by kernel, here
  start_ab
  at "GPU tests here"
  # shellcheck disable=SC2086
  gpu_tests decode "${DECODE_TIMEOUT:-200}" ${DECODE_TESTS:-tests/test_cuda_decode.py tests/test_cuda_kernels.py}
  wait "${AB_PIDS[@]}"
  at "batch-1 decode, alternated"
  # shellcheck disable=SC2086
  alternate 1 "${DECODE_SETS:-;@/tmp/old_$OLD}" ${DECODE_MODELS:-llama8b-q4_k_m llama1b-q4_k_m llama8b-q4_k_m llama1b-q4_k_m}
  if [ -n "${PROFILE:-}" ]; then
    at "the 8B's eager step, kernel by kernel"
    timeout 120 python3 bench/cuda_profile.py $M/llama8b-q4_k_m.gguf --streams 1 --steps 16 2>&1 | tail -30
  fi
  at "end"
  exit 0
fi

if [ "${1:-}" = tests37 ]; then  # ~4 min: session 37's GPU tests alone (no llama.cpp)
  setup
  at "session 37's GPU tests: families, sinks, MXFP4 and BF16"
  gpu_tests s37 170 tests/test_cuda.py -k "$S37_K"
  gpu_tests s37k 120 tests/test_cuda_kernels.py -k "deq8 or tiled or tensor_cores"
  at "end"
  exit 0
fi

if [ "${1:-}" = ms1 ]; then  # ~8 min from a bare machine: issue 35's must-shows 1 and 3 alone --
  # batch-1 decode (graph replay) and prefill of 2,048 tokens, modelc and llama-bench on the
  # same files (MS1_MODELS) in the same call; modelc's decode while llama.cpp builds (each
  # model with each of MS1_SETS in turn, as alternate's; OLD=abc1234 unpacks the old code for
  # a set "@/tmp/old_abc1234"; MS1_TESTS=1: the GPU tests here first) and again after it
  if [ -n "${NO_LLAMA:-}" ]; then start_ab; else start_ab 0; fi  # NO_LLAMA=1: modelc alone (~4 min)
  if [ -n "${MS1_TESTS:-}" ]; then
    at "GPU tests here (llama.cpp building beside)"
    gpu_tests ms1 150 tests/test_cuda_decode.py tests/test_cuda_kernels.py
    gpu_tests ms1_s37 150 tests/test_cuda.py -k "$S37_K"
  fi
  wait "${AB_PIDS[@]}"  # not the build's
  MS1=${MS1_MODELS:-llama1b-q4_k_m llama8b-q4_k_m}
  if [ -n "${FLOOR:-}" ]; then  # FLOOR=1: each model's bytes read with no arithmetic, a kernel
    # a matrix against one persistent kernel (bench/cuda_floor.py)
    at "the step's floor: pure reads, kernels against a persistent kernel"
    # FLOOR_ARGS: bench/cuda_floor.py's own (--small 0,1,2,5: small kernels a layer)
    # shellcheck disable=SC2086
    for m in $MS1; do timeout 120 python3 -m bench.cuda_floor --gguf $M/$m.gguf ${FLOOR_ARGS:-} 2>&1 | tail -30; done
    [ -n "${FLOOR_ONLY:-}" ] && { at "end"; exit 0; }  # FLOOR_ONLY=1: the floor alone
  fi
  at "modelc decode, one stream (llama.cpp building beside)"
  # shellcheck disable=SC2086
  alternate 1 "${MS1_SETS:-}" $MS1
  at "modelc prefill of 2,048 tokens"
  for m in $MS1; do
    timeout 60 python3 -m modelc bench $M/$m.gguf --device cuda --prompt-lens 2048 --batches 1 \
      --steps 16 --reps 2 2>&1 | grep -E "prefill|decode" | sed "s/^/$m /"
  done
  [ -n "${NO_LLAMA:-}" ] && { at "end"; exit 0; }
  at "waiting for llama.cpp"
  while [ -f /tmp/llama_building ]; do sleep 2; done
  grep -iE "error|failed" "$OUT/llama_build.log" /tmp/lsrc/build.log 2>/dev/null | head -5
  at "llama.cpp: llama-bench pp2048 and tg128"
  for m in $MS1; do
    timeout 90 $B/llama-bench -m $M/$m.gguf -ngl 99 -p 2048 -n 128 -r 3 2>&1 | grep -E "pp|tg|error"
  done
  at "modelc decode again, the host idle"
  # shellcheck disable=SC2086
  alternate 1 "" $MS1
  at "end"
  exit 0
fi

if [ "${1:-}" = webgpu ]; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  python3 -c "from modelc.runtime.backends.webgpu_device import find_adapter as f; print(f().info)"
  at "WebGPU tests"
  MODELC_REQUIRE_WEBGPU=1 timeout 150 python3 -m pytest -q --noconftest -p no:cacheprovider -rs \
    tests/test_webgpu.py tests/test_webgpu_resident.py >"$OUT/tests_webgpu.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests_webgpu.log" | head -20
  at "parity (exact mode, f32 cache)"
  for d in cpu webgpu cuda; do
    MODELC_MATMUL=exact timeout 60 python3 -m modelc generate $M/llama1b-q4_0.gguf --device $d \
      "The quick brown fox" --max-tokens 12 --kv-cache f32 --temperature 0 2>/dev/null | md5sum | sed "s/^/$d /"
  done
  at "decode, WebGPU resident / op by op / CUDA"
  for m in llama1b-q4_0 llama1b-q4_k_m; do
    for d in webgpu cuda; do
      timeout 90 python3 -m modelc bench $M/$m.gguf --device $d --prompt-lens 64 --batches 1 \
        --steps 32 --reps 2 2>&1 | grep -E "prefill|decode" | sed "s/^/$m $d /"
    done
    MODELC_WEBGPU_RESIDENT=0 timeout 90 python3 -m modelc bench $M/$m.gguf --device webgpu \
      --prompt-lens 64 --batches 1 --steps 8 --reps 1 2>&1 | grep -E "decode" | sed "s/^/$m webgpu op-level /"
  done
  at "WebGPU gap: host / GPU (timestamps) / total ms a step, matmul GB/s"
  for m in llama1b-q4_0 llama1b-q4_k_m; do
    timeout 120 python3 bench/webgpu_gap.py --model $M/$m.gguf --json "$OUT/gap_$m.json" 2>&1 | grep -v XDG_RUNTIME
  done
  at "end"
  exit 0
fi

at "the engine in process at the HTTP load's shape (no HTTP): model / step thread / event loop"
timeout 120 python3 -m bench.engine_overhead --model $M/llama1b-q4_0.gguf --device cuda --real-forward \
  --streams 64 --requests 128 --tokens 60,64 --prompt-len 192 --reps 2 2>&1 | tail -5
at "HTTP"
PROFILE=1 serve now "$PWD"
serve nobuckets "$PWD" MODELC_CUDA_GRAPH_BUCKETS=0
ARGS="--stream-interval 8" serve si8 "$PWD"
# a thread napping 1 ms beside the server: how long a hand-back of the GIL waits under this
# load (no ptrace needed, unlike py-spy); the step thread makes one a CuPy call
LAUNCH="-m bench.gil_probe --every 1 --" serve probe "$PWD"  # a line a second
grep gil_probe "$OUT/server_probe.log"
[ -f .devrun/old_dfffbcb.tar.zst ] && old_checkout dfffbcb && serve dfffbcb /tmp/old_dfffbcb
llama_server
at "-ngl 16 of the 8B"
timeout 60 $B/llama-bench -m $M/llama8b-q4_k_m.gguf -ngl 16 -p 64 -n 32 -r 2 2>&1 | grep -E "pp|tg|error"
echo "-- llama.cpp, -ngl 16 and the output head on the GPU too (-ot output.weight=CUDA0)"
timeout 60 $B/llama-bench -m $M/llama8b-q4_k_m.gguf -ngl 16 -ot "output\.weight=CUDA0" -p 64 -n 32 -r 2 \
  2>&1 | grep -E "pp|tg|error"
timeout 90 python3 bench/cuda_bench.py --offload $M/llama8b-q4_k_m.gguf \
  --ngl 16 --steps 32 --no-hf 2>&1 | grep -E "^\|.*llama8b|Error"
echo "-- modelc, -ngl 16 with the head left on the CPU (MODELC_OFFLOAD_HEAD=last, llama.cpp's placement)"
MODELC_OFFLOAD_HEAD=last timeout $((590 - (SECONDS - T0))) python3 bench/cuda_bench.py --offload \
  $M/llama8b-q4_k_m.gguf --ngl 16 --steps 32 --no-hf 2>&1 | grep -E "^\|.*llama8b|Error"
at "end"
