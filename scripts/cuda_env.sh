# shellcheck shell=bash
# Sourced by scripts/cuda_tests.sh and scripts/cuda_kernels_check.sh on the device machine:
# modelc's pure-python deps from the wheels in .whl (no network there), the CPU kernels
# built in place (the reference the GPU is compared with), logs to $OUT (the device tool's
# folder) or ./cuda-logs.
OUT=${OUT:-$PWD/cuda-logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ] && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
if ! python3 -c "import modelc._kernels.kernels" 2>/dev/null; then
  python3 setup.py build_ext --inplace >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
