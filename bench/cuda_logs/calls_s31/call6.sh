#!/usr/bin/env bash
# session 31, call 6: the wide GEMV given its own split rule (cuda.py passed the old rule's
# method): the 1.1B and 8B decode with it and with MODELC_CUDA_SPLIT_K=0, alternated
set -o pipefail
M=/tmp/m35
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
[ -f $M/llama1b-q4_k_m.gguf ] || python3 -m tests.gen_cuda_models $M >/dev/null 2>&1
for v in "" "MODELC_CUDA_SPLIT_K=0" ""; do
  # shellcheck disable=SC2086
  env $v timeout 30 python3 bench/cuda_bench.py --no-hf --no-variants --streams 1 --steps 64 \
    --model $M/llama1b-q4_k_m.gguf 2>&1 | grep -E '^\{|rror' | cut -c1-110 | sed "s/^/$v /"
done
