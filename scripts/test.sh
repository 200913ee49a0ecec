#!/usr/bin/env bash
# The test command: installs modelc with its test tools into .venv, fetches the pinned
# test models into ~/.cache/modelc-test-assets, then runs ruff, mypy and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# uv installs what pip would (the same versions) in a third of the time (48 s against 149 s
# here, the kernels' C build included); pip where uv cannot be had or cannot install
{ .venv/bin/python -m pip install -q --disable-pip-version-check uv >/dev/null 2>&1 &&
  .venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode -e '.[test,bench]'; } ||
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,bench]'
.venv/bin/python -m tests.assets
# Debian packages the tests use, where we may install them (root, apt-get), one index
# update for all: headless Chromium for the chat-page test; Mesa's software Vulkan
# (lavapipe) for the WebGPU backend's tests; nginx for the loopback fleet test
# (tests/test_ship_fleet.py; Debian's nginx-light, small)
apt_updated=
apt_install() {  # $1: --no-install-recommends or "", then the packages
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 0
  [ -n "$apt_updated" ] || { apt-get update -qq && apt_updated=1; }
  local rec=$1
  shift
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $rec "$@" >/dev/null
}
command -v chromium >/dev/null 2>&1 || apt_install "" chromium
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || apt_install --no-install-recommends mesa-vulkan-drivers
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || apt_install --no-install-recommends nginx-light
# where lavapipe is present the WebGPU tests must run (MODELC_REQUIRE_WEBGPU=1 turns a
# missing adapter into a failure, not a skip)
if ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1; then
  export MODELC_REQUIRE_WEBGPU=1
  export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"  # Mesa warns without one
fi
# bytecode: where PYTHONDONTWRITEBYTECODE is set (as on this project's CI machines) every
# process compiled modelc's ~270 modules from source again, 1.5 s of CPU to import the
# server's modules against 0.87 s from .pyc files, for each `modelc run` and command the
# tests start; here they are compiled once, and pytest's rewritten test modules are kept
# for the other worker (the __pycache__ folders are ignored by git)
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m compileall -q -j 0 modelc bench tests >/dev/null
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
