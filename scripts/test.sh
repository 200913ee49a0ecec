#!/usr/bin/env bash
# The test command: installs modelc with its test tools into .venv, fetches the pinned
# test models into ~/.cache/modelc-test-assets, then runs ruff, mypy and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
.venv/bin/python -m tests.assets
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
