#!/usr/bin/env bash
# llama.cpp with CUDA, from the llama-cpp-python 0.3.36 sdist's source, for side-by-side
# figures on the lent GPU machine (no network there):
#   scripts/llamacpp_cuda.sh pack SDIST_LLAMA_CPP_DIR OUT.tar.zst   (here: a ~4 MB source
#       subset: ggml with its CPU and CUDA backends, src, common, vendor, and the tools
#       llama-bench, llama-batched-bench, llama-server with an empty web UI)
#   scripts/llamacpp_cuda.sh build SRC.tar.zst [JOBS]               (there: cmake for sm_90a
#       into /tmp/lsrc/llama.cpp/build/bin; ~4 min on 12 jobs; python's zstandard unpacks it)
set -euo pipefail
case ${1:-} in
pack)
  src=$2 out=$3 tmp=$(mktemp -d)
  mkdir -p "$tmp/llama.cpp/ggml/src" "$tmp/llama.cpp/tools/ui" "$tmp/llama.cpp/scripts"
  (cd "$src" && cp -r CMakeLists.txt cmake common include src vendor licenses LICENSE "$tmp/llama.cpp/")
  (cd "$src/ggml" && cp -r CMakeLists.txt cmake include "$tmp/llama.cpp/ggml/")
  (cd "$src/ggml/src" && for f in *; do
     case $f in ggml-et|ggml-metal|ggml-hexagon|ggml-sycl|ggml-vulkan|ggml-opencl|ggml-cann|ggml-musa|\
       ggml-kompute|ggml-webgpu|ggml-zdnn|ggml-rpc|ggml-blas|ggml-hip|ggml-openvino|ggml-zendnn|ggml-virtgpu) ;;
       *) cp -r "$f" "$tmp/llama.cpp/ggml/src/" ;;
     esac
   done)
  (cd "$src/tools" && cp -r llama-bench batched-bench server cli mtmd "$tmp/llama.cpp/tools/")
  cp "$src"/tools/ui/{CMakeLists.txt,sources.cmake,ui.cpp.in,ui.h.in} "$tmp/llama.cpp/tools/ui/"
  cp "$src/scripts/ui-assets.cmake" "$tmp/llama.cpp/scripts/"
  printf '%s\n' 'find_package(Threads REQUIRED)' 'llama_add_compile_flags()' \
    'add_subdirectory(batched-bench)' 'add_subdirectory(llama-bench)' 'add_subdirectory(mtmd)' \
    'if (LLAMA_BUILD_SERVER)' '  add_subdirectory(ui)' '  add_subdirectory(server)' 'endif()' \
    >"$tmp/llama.cpp/tools/CMakeLists.txt"
  tar cf - -C "$tmp" llama.cpp | zstd -19 -T2 -q -f -o "$out"
  rm -rf "$tmp"
  ls -la "$out"
  ;;
build)
  mkdir -p /tmp/lsrc && cd /tmp/lsrc
  python3 -c "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(open(sys.argv[1], 'rb'), sys.stdout.buffer)" "$2" | tar xf -
  cd llama.cpp
  cmake -S . -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON -DLLAMA_USE_PREBUILT_UI=OFF -DCMAKE_BUILD_TYPE=Release >/tmp/lsrc/cfg.log
  ninja -C build -j "${3:-12}" llama-bench llama-batched-bench llama-server >/tmp/lsrc/build.log
  ls build/bin
  ;;
*)
  echo "usage: $0 pack SDIST_LLAMA_CPP_DIR OUT.tar.zst | build SRC.tar.zst [JOBS]" >&2
  exit 2
  ;;
esac
