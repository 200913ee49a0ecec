#!/usr/bin/env bash
# modelc against llama.cpp CUDA on the same random models, in one call on the lent GPU
# machine (bench/RESULTS.md "Side by side with llama.cpp CUDA"). Here, once:
#   scripts/llamacpp_cuda.sh pack <sdist>/vendor/llama.cpp .devrun/llama_src.tar.zst
# (.devrun, .whl and .gl ignored by git: .git/info/exclude); then carry .whl .gl .devrun and
# run: LLAMA_SRC=.devrun/llama_src.tar.zst bash scripts/cuda_side_by_side.sh
# llama.cpp builds in the background while scripts/cuda_kernels_check.sh runs (the new
# kernels' tests and modelc's figures before / after), then the GPU memory budget test,
# greedy parity of cpu / webgpu / cuda on the 1.1B, and llama-bench / llama-batched-bench
# on the same files. KB: the kernel check's budget in seconds (290); BW: the card's
# bandwidth for the share column (3.35e12, H100; 4.8e12 on an H200).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/cuda-logs}
mkdir -p "$OUT"
T0=$SECONDS
if [ -d .gl ]; then for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
(bash scripts/llamacpp_cuda.sh build "$PWD/${LLAMA_SRC:-.devrun/llama_src.tar.zst}" 12 >"$OUT/llama_build.log" 2>&1) &
LB=$!
CHECK_8B=0 CHECK_BUDGET=${KB:-290} CUDA_BW=${BW:-3.35e12} bash scripts/cuda_kernels_check.sh 2>&1 \
  | tail -150 >"$OUT/kernels_check.txt"
grep -E "^==|passed|failed|^\| |FAILED|Error" "$OUT/kernels_check.txt" | head -60
M=/tmp/m35
echo "== GPU memory budget at $((SECONDS - T0)) s"
MODELC_CUDA_1B_DIR=$M timeout 100 python3 -m pytest -q -p no:cacheprovider --noconftest \
  tests/test_cuda_memory.py 2>&1 | tail -6
echo "== greedy on the 1.1B Q4_0, exact (the same digest on every device)"
for dev in cpu webgpu cuda; do
  echo "$dev: $(MODELC_MATMUL=exact timeout 60 python3 -m modelc generate $M/llama1b-q4_0.gguf \
    'The capital of France is' --device $dev --max-tokens 12 --temperature 0 --kv-cache f32 \
    2>/dev/null | md5sum)"
done
for _ in $(seq 1 100); do kill -0 $LB 2>/dev/null || break; sleep 3; done
echo "== llama.cpp at $((SECONDS - T0)) s"
B=/tmp/lsrc/llama.cpp/build/bin
for m in llama1b-q4_0 llama1b-q4_k_m; do
  timeout 60 $B/llama-bench -m $M/$m.gguf -ngl 99 -p 512 -n 128 -r 3 2>&1 | grep -E "^\||error" | tail -3
  timeout 60 $B/llama-batched-bench -m $M/$m.gguf -ngl 99 -c 16384 -b 2048 -ub 512 -npp 32 \
    -ntg 64 -npl 1,8,64 2>&1 | grep -E "^\||error" | tail -5
done
echo "== end at $((SECONDS - T0)) s"
