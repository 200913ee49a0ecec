"""Every tiny family on ``--device cuda`` against the CPU backend (issue 34: greedy tokens
equal, top-10 log-probs within 2e-3), each through the path the engine picks
(:func:`modelc.runtime.backends.cuda_offload.build_gpu`): device-resident where that
forward runs every part, else op by op on the op-level CUDA backend.

Runs where CuPy sees a GPU (``scripts/cuda_tests.sh``'s machine); skipped elsewhere (the
path choice itself is tests/test_cuda_route.py, on the CPU).  Both sides in f32
(``MODELC_MATMUL=exact`` on the GPU, the CPU backend's exact mode).  Cost on an H100: a
few seconds a family, most of it the CPU reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from modelc.formats import load_model
from modelc.runtime.backends.cuda import cuda_unavailable
from tests.runtime_support import gpu_path, make_backend, same_as_reference
from tests.tiny_families import TINY

WHY = cuda_unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no CUDA here: {WHY}")


def _exact_gpu() -> Any:
    from modelc.runtime.backends.cuda_backend import CudaBackend

    be = CudaBackend()
    be.dev.exact = True  # the process's kernels: f32 products past 16 rows too
    return be


@pytest.mark.parametrize("family", list(TINY))
def test_family_on_cuda_matches_cpu(family: str) -> None:
    """A 30-token prompt (past every tiny sliding window and chunk) and 12 greedy tokens."""
    from modelc.runtime.arch import build
    from modelc.runtime.backends.cuda_llama import CudaLlama

    ir = load_model(TINY[family]())
    dev = gpu_path(ir, _exact_gpu, max_concurrent=2)
    if isinstance(dev, CudaLlama):  # the device-resident forward
        dev.dev.exact = True
    ref = build(ir, make_backend("cpu-exact"))
    prompt = np.random.default_rng(5).integers(0, min(ref.n_vocab, 300), 30).tolist()
    err = same_as_reference(ref, dev, prompt, 12)
    print(f"{family}: {type(dev).__name__}, top-10 log-prob error {err:.2e}")


@pytest.mark.parametrize("family", ["gptoss", "lfm2"])
def test_engine_runs_a_family_op_by_op(family: str, caplog: pytest.LogCaptureFixture) -> None:
    """``--device cuda`` through the engine's own choice (:func:`modelc.engine.build_runtime`):
    a family the device-resident forward lacks runs op by op on the GPU, one log line says
    why, and it answers as the CPU backend does (a 12-token prompt: GEMV products, f32)."""
    import logging

    from modelc.engine import EngineOptions, build_runtime
    from modelc.runtime.arch import build
    from modelc.runtime.arch.decoder import Decoder
    from modelc.runtime.backends.cuda_backend import CudaBackend

    ir = load_model(TINY[family]())
    with caplog.at_level(logging.WARNING, logger="modelc"):
        model, _ = build_runtime(ir, EngineOptions(device="cuda"))
    assert isinstance(model, Decoder) and isinstance(model.be, CudaBackend)
    assert [r.getMessage().count("runs op by op") for r in caplog.records] == [1]
    prompt = np.random.default_rng(6).integers(0, 300, 12).tolist()
    same_as_reference(build(ir, make_backend("cpu-exact")), model, prompt, 8)
