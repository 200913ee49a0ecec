#!/usr/bin/env bash
# The test command: installs modelc with its test tools into .venv, fetches the pinned
# test models into ~/.cache/modelc-test-assets, then runs ruff, mypy and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,bench]'
.venv/bin/python -m tests.assets
# headless Chromium for the chat-page test (Debian's package; only where we may install it)
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
# Mesa's software Vulkan (lavapipe) for the WebGPU backend's tests: where it is present they
# must run (MODELC_REQUIRE_WEBGPU=1 turns a missing adapter into a failure, not a skip)
if ! ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mesa-vulkan-drivers >/dev/null
fi
if ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1; then
  export MODELC_REQUIRE_WEBGPU=1
  export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"  # Mesa warns without one
fi
# nginx for the loopback fleet test (tests/test_ship_fleet.py; Debian's nginx-light, small)
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light >/dev/null
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# two workers, each given whole modules (--dist loadfile: a module's fixtures start once);
# the servers a test talks to run one thread each, so one worker leaves a core idle.
# MODELC_TEST_WORKERS=0 runs the suite in this one process. numpy's OpenBLAS gets one
# thread a process: its idle threads spin, and beside the other worker they made numpy-heavy
# tests several times slower (84 s against 24 s for one test with a busy neighbour).
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 -n "${MODELC_TEST_WORKERS:-2}" --dist loadfile "$@"
