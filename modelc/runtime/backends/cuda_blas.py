"""cuBLAS called directly (``cublasGemmEx`` through CuPy's bindings) for the CUDA backend's
large-batch products: into preallocated outputs, accumulating with ``beta = 1``, with no
CuPy array made per call, so a whole decode step (these products included) can be
captured as one CUDA graph.  :func:`open_blas` checks it against ``cupy.matmul`` once and
returns None where the bindings differ (the backend then uses ``cupy.matmul``, eagerly).
"""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

CUDA_R_32F, CUDA_R_16F = 0, 2
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
OP_N, OP_T = 0, 1


class Blas:
    def __init__(self, cp: Any) -> None:
        self.cp = cp
        self.lib = importlib.import_module("cupy_backends.cuda.libs.cublas")
        self.handle = cp.cuda.device.get_cublas_handle()
        self.scalars = np.array([1.0, 0.0], np.float32)  # alpha, beta=0; beta=1 is alpha's
        # a workspace of our own: cuBLAS allocating one during a graph capture would fail it
        self.workspace = cp.empty(64 << 20, np.uint8)
        self._set_workspace = _workspace_setter(self.lib)
        self._set_workspace(self.handle, int(self.workspace.data.ptr), 64 << 20)

    def gemm(
        self, w: Any, f16: bool, x: Any, ldx: int, n: int, y: Any, ldy: int, acc: bool
    ) -> None:
        """``y[:n, :rows] (+)= x[:n] @ w.T``: w (rows, k) and x f16 (or f32), y f32; row-major
        with row strides ldx and ldy (elements)."""
        rows, k = int(w.shape[0]), int(w.shape[1])
        dt = CUDA_R_16F if f16 else CUDA_R_32F
        ptr = int(self.scalars.ctypes.data)
        self.lib.setStream(self.handle, self.cp.cuda.get_current_stream().ptr)
        # setStream puts cuBLAS back on its default workspace pool (cuBLAS's documentation):
        # ours again, every call
        self._set_workspace(self.handle, int(self.workspace.data.ptr), 64 << 20)
        self.lib.gemmEx(
            self.handle, OP_T, OP_N, rows, n, k, ptr, int(w.data.ptr), dt, k,
            int(x.data.ptr), dt, ldx, ptr if acc else ptr + 4, int(y.data.ptr), CUDA_R_32F,
            ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT,
        )  # fmt: skip


def _workspace_setter(lib: Any) -> Callable[[int, int, int], None]:
    """``cublasSetWorkspace(handle, ptr, size)``: CuPy's binding, else libcublas's own."""
    fn: Callable[[int, int, int], None] | None = getattr(lib, "setWorkspace", None)
    if fn is not None:
        return fn
    raw = ctypes.CDLL("libcublas.so.13").cublasSetWorkspace_v2

    def set_workspace(handle: int, ptr: int, size: int) -> None:
        rc = raw(ctypes.c_void_p(handle), ctypes.c_void_p(ptr), ctypes.c_size_t(size))
        if rc != 0:
            raise RuntimeError(f"cublasSetWorkspace failed ({rc})")

    return set_workspace


def open_blas(cp: Any) -> Blas | None:
    """A checked :class:`Blas`, or None when the direct call does not work here."""
    try:
        b = Blas(cp)
        rng = np.random.default_rng(0)
        w = cp.asarray(rng.standard_normal((48, 64)).astype(np.float32))
        x = cp.asarray(rng.standard_normal((5, 64)).astype(np.float32))
        y = cp.ones((5, 80), np.float32)
        b.gemm(w, False, x, 64, 5, y[:, 16:], 80, True)
        ref = 1.0 + x @ w.T
        ok = float(cp.abs(y[:, 16:] - ref).max()) < 1e-3 and float(cp.abs(y[:, :16] - 1).max()) == 0
        return b if ok else None
    except Exception:
        return None
