# sourced: wheels, CPU kernels, models, llama.cpp build (background, once)
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$PWD
M=/tmp/m35
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
if ! python3 -c "import modelc._kernels.kernels" 2>/dev/null; then
  (python3 setup.py build_ext --inplace > /tmp/ext_build.log 2>&1; echo "ext build rc $?" >> /tmp/ext_build.log) &
  EB=$!
fi
if [ -z "${SKIP_LLAMA:-}" ] && [ ! -x /tmp/lsrc/llama.cpp/build/bin/llama-server ] && [ ! -f /tmp/llama_building ]; then
  touch /tmp/llama_building
  (bash scripts/llamacpp_cuda.sh build "$PWD/.devrun/llama_src.tar.zst" 12 > /tmp/llama_build.log 2>&1; rm -f /tmp/llama_building) &
fi
[ -f $M/llama1b-q4_k_m.gguf ] || python3 -m tests.gen_cuda_models $M > /tmp/gen.log 2>&1
wait_ext() { [ -n "${EB:-}" ] && wait $EB; tail -1 /tmp/ext_build.log 2>/dev/null; }
