"""cuBLAS called directly (``cublasGemmEx`` through ctypes, on the libcublas CuPy loaded)
for the CUDA backend's large-batch products: into preallocated outputs, accumulating with
``beta = 1``, with no CuPy array made per call, so a whole decode step (these products
included) can be captured as one CUDA graph (CuPy's own cuBLAS bindings refuse any call
during a capture).  With ``MODELC_CUDA_LAUNCH=gil`` (:func:`.cuda_launch.keep_gil`) the
calls keep the GIL (``ctypes.PyDLL``): they only queue work, and giving the GIL up made a
server's step thread wait for the event loop after each of an eager step's ~90 products.
:func:`open_blas` checks it against ``cupy.matmul`` once and returns None where it does
not work (the backend then uses ``cupy.matmul``, eagerly).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from modelc.runtime.backends.cuda_launch import keep_gil

CUDA_R_32F, CUDA_R_16F = 0, 2
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
OP_N, OP_T = 0, 1


class Blas:
    def __init__(self, cp: Any) -> None:
        self.cp = cp
        # a handle first: CuPy loads libcublas making it, and ctypes finds it loaded
        cp.cuda.device.get_cublas_handle()
        self.lib = _libcublas()
        self.scalars = np.array([1.0, 0.0], np.float32)  # alpha, beta=0; beta=1 is alpha's
        # a workspace of our own: cuBLAS allocating one during a graph capture would fail it
        self.workspace = cp.empty(64 << 20, np.uint8)

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed (cuBLAS status {rc})")

    def gemm(
        self, w: Any, f16: bool, x: Any, ldx: int, n: int, y: Any, ldy: int, acc: bool
    ) -> None:
        """``y[:n, :rows] (+)= x[:n] @ w.T``: w (rows, k) and x f16 (or f32), y f32; row-major
        with row strides ldx and ldy (elements)."""
        rows, k = int(w.shape[0]), int(w.shape[1])
        dt = CUDA_R_16F if f16 else CUDA_R_32F
        ptr = int(self.scalars.ctypes.data)
        # the calling thread's handle (CuPy keeps one a thread): the server's steps run on
        # a worker thread, not the one that loaded the model
        lib, vp = self.lib, ctypes.c_void_p
        h = vp(self.cp.cuda.device.get_cublas_handle())
        self._check(
            lib.cublasSetStream_v2(h, vp(self.cp.cuda.get_current_stream().ptr)), "setStream"
        )
        # setStream puts cuBLAS back on its default workspace pool (cuBLAS's documentation):
        # ours again, every call
        ws = vp(self.workspace.data.ptr)
        self._check(lib.cublasSetWorkspace_v2(h, ws, ctypes.c_size_t(64 << 20)), "setWorkspace")
        self._check(
            lib.cublasGemmEx(
                h, OP_T, OP_N, rows, n, k, vp(ptr), vp(w.data.ptr), dt, k,
                vp(x.data.ptr), dt, ldx, vp(ptr if acc else ptr + 4), vp(y.data.ptr),
                CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT,
            ),
            "cublasGemmEx",
        )  # fmt: skip


def _libcublas() -> ctypes.CDLL:
    """libcublas as CuPy loaded it, called through ctypes: CuPy's own bindings refuse every
    call during a stream capture, which cuBLAS itself takes (with a workspace of the
    caller's)."""
    errors = []
    for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so"):
        try:
            lib = ctypes.PyDLL(name) if keep_gil() else ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
            continue
        lib.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.cublasSetWorkspace_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        i, p = ctypes.c_int, ctypes.c_void_p
        lib.cublasGemmEx.argtypes = [p, i, i, i, i, i, p, p, i, i, p, i, i, p, p, i, i, i, i]
        return lib
    raise OSError("; ".join(errors))


def open_blas(cp: Any) -> Blas | None:
    """A checked :class:`Blas`, or None when the direct call does not work here."""
    try:
        b = Blas(cp)
        rng = np.random.default_rng(0)
        w = cp.asarray(rng.standard_normal((48, 64)).astype(np.float32))
        x = cp.asarray(rng.standard_normal((5, 64)).astype(np.float32))
        y = cp.ones((5, 80), np.float32)
        b.gemm(w, False, x, 64, 5, y[:, 16:], 80, True)  # columns 16..63 of y's rows
        ref = 1.0 + x @ w.T
        inside = float(cp.abs(y[:, 16:64] - ref).max())
        outside = float(cp.abs(y[:, :16] - 1).max()) + float(cp.abs(y[:, 64:] - 1).max())
        return b if inside < 1e-3 and outside == 0 else None
    except Exception:
        return None
