"""gemv.wgsl (few rows of x: threads along a weight row, their parts summed in workgroup
memory) against matmul.wgsl (a thread a weight row) and the numpy reference: every weight
type with a shader, 1..8 rows of x, odd sizes, the residual add (``acc``) into a strided
output at a column offset, a weight split over the binding limit, and rows past the
dispatch grid's x limit.  Tolerances as test_webgpu.py's (float32 sums in other orders).
The resident decoder's tests (test_webgpu_resident.py) run with it on, the default."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import pytest

from modelc.formats.ir import DType
from modelc.runtime.backend import Weight
from tests.test_webgpu import REF, RNG, close, weight

pytest.importorskip("wgpu")

from modelc.runtime.backends import webgpu_device
from modelc.runtime.backends.webgpu import DEQ, GEMV_ROWS, WebGPUBackend, gemv_rows
from modelc.runtime.backends.webgpu_device import Job
from tests.runtime_support import webgpu_backend

if not os.environ.get("XDG_RUNTIME_DIR"):  # Mesa's WSI warns without one
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="modelc-xdg-")

FLOATS = (DType.F32, DType.F16, DType.BF16)


@pytest.fixture(scope="module")
def gpu() -> WebGPUBackend:
    """The adapter's backend with decode products on gemv.wgsl, as on a GPU."""
    be = webgpu_backend()
    be.gemv_rows = GEMV_ROWS
    return be  # type: ignore[no-any-return]


def _both(gpu: WebGPUBackend, w: Weight, x: np.ndarray[Any, Any]) -> list[np.ndarray[Any, Any]]:
    """x @ W.T by gemv.wgsl, then by matmul.wgsl (each checked to have run)."""
    res = []
    saved = gpu.gemv_rows
    try:
        for rows, entry in ((8, "gemv"), (0, "matmul")):
            gpu.gemv_rows = rows
            xb = gpu.gpu.put("t_x", np.ascontiguousarray(x, np.float32))
            (d,) = gpu.matmul_dispatches(w, xb, len(x), gpu.gpu.scratch("t_o", 4))[:1]
            assert d.pipeline.label.endswith("." + entry)
            res.append(gpu.matmul(w, x))
    finally:
        gpu.gemv_rows = saved
    return res


@pytest.mark.parametrize("dtype", list(DEQ), ids=lambda d: d.name)
def test_gemv_equals_matmul_and_numpy(gpu: WebGPUBackend, dtype: DType) -> None:
    # odd row counts; float rows not a multiple of 4 wide; quants of 1 block, an odd count
    # of blocks and more blocks than a row has threads (64 x 32 weights)
    if dtype in FLOATS:
        shapes = [(37, 70), (5, 3), (9, 1030)]
    elif "K" in dtype.name:
        shapes = [(37, 512), (3, 256), (11, 2816)]
    else:
        shapes = [(37, 96), (3, 32), (11, 2080)]
    for rows, cols in shapes:
        w = weight(dtype, rows, cols)
        for n in range(1, 9):
            x = RNG.standard_normal((n, cols)).astype(np.float32)
            new, old = _both(gpu, w, x)
            want = REF.matmul(w, x)
            close(new, want)
            close(old, want)


@pytest.mark.parametrize("dtype", [DType.Q4_K, DType.Q8_0, DType.F16], ids=lambda d: d.name)
@pytest.mark.parametrize("acc", [False, True])
def test_gemv_acc_stride_and_column_offset(gpu: WebGPUBackend, dtype: DType, acc: bool) -> None:
    """Into columns 5 .. 5+rows of a wider output (the resident decoder's gate/up halves),
    added to what it holds where ``acc`` (the residual); the other columns untouched."""
    rows, cols, width, col0 = 21, 256, 40, 5
    w = weight(dtype, rows, cols)
    for n in (1, 2, 5, 8):
        x = RNG.standard_normal((n, cols)).astype(np.float32)
        before = RNG.standard_normal((n, width)).astype(np.float32)
        with gpu.gpu.lock:
            xb = gpu.gpu.put("t_x", x)
            ob = gpu.gpu.put("t_out", before)
            job = Job(gpu.matmul_dispatches(w, xb, n, ob, acc=acc, stride=width, col0=col0))
            assert all(d.pipeline.label.endswith(".gemv") for d in job.dispatches)
            job.reads.append((ob[0], before.nbytes))
            (data,) = gpu.gpu.run(job)
        got = np.frombuffer(data, np.float32).reshape(n, width)
        want = before.copy()
        prod = REF.matmul(w, x)
        want[:, col0 : col0 + rows] = prod + (before[:, col0 : col0 + rows] if acc else 0)
        np.testing.assert_array_equal(got[:, :col0], before[:, :col0])
        np.testing.assert_array_equal(got[:, col0 + rows :], before[:, col0 + rows :])
        close(got[:, col0 : col0 + rows], want[:, col0 : col0 + rows], 4e-6)


def test_gemv_weight_split_over_the_binding_limit(gpu: WebGPUBackend) -> None:
    w = weight(DType.Q8_0, 50, 128)  # 136 bytes a row: 7 rows a buffer of 1024 bytes
    saved = gpu.gpu.max_binding
    gpu.gpu.max_binding = 1024
    try:
        chunks = gpu._chunks(w)
    finally:
        gpu.gpu.max_binding = saved
    assert len(chunks) == 8
    for n in (1, 3, 8):
        x = RNG.standard_normal((n, 128)).astype(np.float32)
        new, old = _both(gpu, w, x)
        close(new, REF.matmul(w, x))
        close(old, REF.matmul(w, x))


def test_gemv_rows_past_the_grid_limit(gpu: WebGPUBackend, monkeypatch: Any) -> None:
    """Workgroups past the x limit go on in y (``gxs``): the limit lowered to 7."""
    monkeypatch.setattr(webgpu_device, "MAX_GROUPS", 7)
    for dtype, rows, cols in ((DType.Q4_0, 100, 2048), (DType.F32, 300, 36)):
        w = weight(dtype, rows, cols)  # 64 threads a row; 8 threads a row, 8 rows a group
        x = RNG.standard_normal((3, cols)).astype(np.float32)
        xb = gpu.gpu.put("t_x", x)
        (d,) = gpu.matmul_dispatches(w, xb, 3, gpu.gpu.scratch("t_o", 4))
        assert d.groups[0] == 7 and d.groups[1] > 1
        new, old = _both(gpu, w, x)
        close(new, REF.matmul(w, x))
        close(old, REF.matmul(w, x))


def test_gemv_rows_setting(monkeypatch: Any) -> None:
    monkeypatch.delenv("MODELC_WEBGPU_GEMV", raising=False)
    assert gemv_rows() == 8 and gemv_rows(cpu=True) == 0  # a CPU adapter keeps matmul.wgsl
    monkeypatch.setenv("MODELC_WEBGPU_GEMV", "0")
    assert gemv_rows() == 0
    monkeypatch.setenv("MODELC_WEBGPU_GEMV", "4")
    assert gemv_rows(cpu=True) == 4
    monkeypatch.setenv("MODELC_WEBGPU_GEMV", "x")
    with pytest.raises(Exception, match="MODELC_WEBGPU_GEMV"):
        gemv_rows()
