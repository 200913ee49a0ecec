"""The GPU's memory as a budget across models (issue 36: "on a GPU its free memory").

On a GPU (``scripts/cuda_tests.sh``; ``MODELC_CUDA_1B_DIR`` from ``python -m
tests.gen_cuda_models DIR``): the random 1.1B Q4_0 under three names, one named on the
command line (kept loaded) and two in the store, served with ``--device cuda`` and a
``--max-gpu-memory`` that holds two, as measured by a server with room for all.  Requests
name them in turn: the idle store model is unloaded for the other, every answer equals the probe's, ``/api/ps`` names exactly the
loaded models with their ``size_vram`` (each measured, their sum inside the budget) and
``modelc ps`` says they run on the GPU.  The planner itself is held on the CPU by
``tests/test_memory_plan.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from modelc.runtime.backends.cuda import cuda_unavailable
from tests import net
from tests.server_fixtures import ROOT, Server, start

WHY = cuda_unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no CUDA here: {WHY}")
OPTS = ["--device", "cuda", "--max-context", "512", "--max-concurrent", "2"]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = os.environ.get("MODELC_CUDA_1B_DIR")
    if not d:
        pytest.skip("no 1B model: set MODELC_CUDA_1B_DIR (python -m tests.gen_cuda_models DIR)")
    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, "MODELC_HOME": str(home)}
    cli = [sys.executable, "-m", "modelc.cli"]
    steps = [["pack", str(Path(d) / "llama1b-q4_0.gguf"), "--name", "g-a"]]
    steps += [["cp", "g-a", f"g-{x}"] for x in "bc"]
    for args in steps:
        subprocess.run([*cli, *args], cwd=ROOT, env=env, check=True, capture_output=True)
    return home


def _ask(srv: Server, model: str) -> str:
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 6}
    r = net.post(f"{srv.url}/v1/completions", json={**body, "temperature": 0}, timeout=300)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def _ps(srv: Server) -> dict[str, dict[str, Any]]:
    models = net.get(f"{srv.url}/api/ps", timeout=10).json()["models"]
    return {m["name"]: m for m in models}


def test_three_gpu_models_under_a_gpu_budget_for_two(home: Path) -> None:
    pinned = ["g-a", "--alias", "g-a"]  # the command line's: never unloaded
    probe = start(*pinned, *OPTS, home=home)
    try:
        first = _ask(probe, "g-a")
        _ask(probe, "g-b")
        ps = _ps(probe)
        cost_a, cost_b = ps["g-a"]["size_vram"], ps["g-b"]["size_vram"]
    finally:
        probe.stop()
    assert cost_a > 0 and cost_b > 0  # measured, not zero as on a CPU server
    budget = cost_a + cost_b + cost_b // 2
    srv = start(*pinned, *OPTS, "--max-gpu-memory", str(budget), home=home)
    try:
        for model, want in (("g-a", {"g-a"}), ("g-b", {"g-a", "g-b"}), ("g-c", {"g-a", "g-c"}),
                            ("g-b", {"g-a", "g-b"})):  # fmt: skip
            assert _ask(srv, model) == first
            ps = _ps(srv)
            assert set(ps) == want, (model, set(ps))
            assert all(m["size_vram"] > 0 for m in ps.values())
            assert sum(m["size_vram"] for m in ps.values()) <= budget
        assert "unloading g-b to make room for g-c" in srv.log()
        out = subprocess.run(
            [sys.executable, "-m", "modelc.cli", "ps", "--url", srv.url],
            cwd=ROOT, capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        assert "GPU " in out.stdout and "CPU" not in out.stdout, out.stdout
    finally:
        srv.stop()
