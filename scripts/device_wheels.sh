#!/usr/bin/env bash
# The folders a GPU call carries (ignored by git: .git/info/exclude), made here once a
# checkout (a call cannot reach a registry):
#   .whl     modelc's pure-Python dependencies the device image lacks, as wheels for its
#            Python 3.12 (scripts/cuda_env.sh and scripts/cuda_side_by_side.sh install them
#            into /tmp/site there), py-spy and wgpu included
#   .devrun  llama.cpp's source from the llama-cpp-python 0.3.36 sdist
#            (scripts/llamacpp_cuda.sh pack) and, for OLD=<commit>, git archive <commit>
#   .gl      the Vulkan loader's .deb (the WebGPU call)
#   .gpuA    SmolLM2's logits for the device sampler's GPU test (MODELC_TEST_LOGITS)
# Usage: bash scripts/device_wheels.sh [OLD_COMMIT ...]
set -euo pipefail
cd "$(dirname "$0")/.."
for d in .whl .devrun .gl .gpuA; do
  grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >>.git/info/exclude
done
tmp=$(mktemp -d)
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
  manylinux1_x86_64 manylinux_2_24_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64; do
  plat+=(--platform "$p")
done
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$tmp" gguf msgspec zstandard platformdirs trio hypercorn quart-trio structlog llguidance \
  pytest-trio py-spy wgpu==0.32.0 "huggingface_hub>=2.4"
# only what the image (KINDS.md's package list) lacks: a second numpy, say, would shadow CuPy's;
# the last run's wheels go (two versions of one package stop the GPU machine's pip install)
rm -rf .whl
mkdir -p .whl
for p in gguf msgspec zstandard platformdirs trio hypercorn quart- quart_trio structlog llguidance \
  pytest_trio py_spy wgpu rendercanvas cffi pycparser h2- hpack hyperframe priority wsproto outcome \
  sniffio blinker flask itsdangerous huggingface_hub httpx2 httpcore2 truststore; do
  cp "$tmp"/$p*.whl .whl/
done
mkdir -p .devrun
if [ ! -f .devrun/llama_src.tar.zst ]; then
  python3 -m pip download -q --no-deps --no-binary=:all: llama-cpp-python==0.3.36 -d "$tmp"
  tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp"
  bash scripts/llamacpp_cuda.sh pack "$tmp/llama_cpp_python-0.3.36/vendor/llama.cpp" .devrun/llama_src.tar.zst
fi
# the batched sampler's real logits (SmolLM2's) for tests/test_cuda_sampler.py's GPU test
mkdir -p .gpuA
[ -f .gpuA/smollm2_rows.npy ] || "${PY:-.venv/bin/python}" -m tests.test_batch_sampler .gpuA/smollm2_rows.npy
for c in "$@"; do git archive "$c" | zstd -19 -T2 -q -f -o ".devrun/old_$c.tar.zst"; done
if [ ! -d .gl ] && command -v apt-get >/dev/null; then
  mkdir -p .gl /tmp/amd64/partial
  o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
  apt-get "${o[@]}" update >/dev/null 2>&1
  (cd .gl && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 >/dev/null 2>&1)
fi
rm -rf "$tmp"
du -sh .whl .devrun .gl .gpuA 2>/dev/null
