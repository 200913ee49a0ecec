#!/usr/bin/env bash
# session 31, call 5: why the 1.1B got slower from b20e3ac to 52fd020 (the 8B faster):
# each kernel's duration in both, and the split rule off
set -o pipefail
export PYTHONUNBUFFERED=1
T0=$SECONDS
M=/tmp/m35
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --target /tmp/site .whl/*.whl
unz() { python3 -c "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(open(sys.argv[1], 'rb'), sys.stdout.buffer)" "$1"; }
mkdir -p /tmp/old && (cd /tmp/old && unz "$OLDPWD/.devrun/old_b20e3ac.tar.zst" | tar xf -)
export PYTHONPATH=/tmp/site:$PWD
[ -f $M/llama1b-q4_k_m.gguf ] || python3 -m tests.gen_cuda_models $M >/dev/null 2>&1
echo "== models at $((SECONDS - T0)) s"
for d in /tmp/old "$PWD"; do
  echo "-- profile, $d"
  (cd "$d" && PYTHONPATH=/tmp/site:$d MODELC_CUDA_PDL=0 timeout 60 python3 bench/cuda_profile.py $M/llama1b-q4_k_m.gguf \
    --streams 1 --steps 16 2>&1 | grep -A12 '## 1 streams' | cut -c1-100)
done
for v in "@/tmp/old" "" "MODELC_CUDA_SPLIT_K=0" "@/tmp/old" ""; do
  dir=$PWD; [[ $v == @* ]] && dir=${v#@} && v=
  echo "-- decode, $dir $v"
  # shellcheck disable=SC2086
  (cd "$dir" && env $v PYTHONPATH=/tmp/site:$dir timeout 40 python3 bench/cuda_bench.py --no-hf --no-variants \
    --streams 1 --steps 64 --model $M/llama1b-q4_k_m.gguf 2>&1 | grep -E '^\{|rror' | cut -c1-120)
done
echo "== end at $((SECONDS - T0)) s"
