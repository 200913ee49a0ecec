"""Choosing a backend by name: the one place that knows every implementation.

The protocol (:mod:`modelc.runtime.backend`) imports none of them, and each is imported
here only when asked for: CuPy, wgpu and the compiled kernels load with the backend that
needs them, and no backend module imports another's.
"""

from __future__ import annotations

from modelc.runtime.backend import Backend

NAMES = ("auto", "cpu", "numpy", "cuda", "webgpu", "metal")


def get_backend(name: str = "auto", *, threads: int | None = None) -> Backend:
    """``cpu`` (compiled Cython kernels), ``numpy`` (reference twins), ``auto`` (cpu if
    built), ``webgpu`` (WGSL shaders on any Metal/Vulkan/D3D12 adapter) or ``metal`` (the
    same, on a Metal adapter only); a missing GPU adapter is a one-line UsageError.
    ``cuda``: NVRTC kernels through CuPy (a one-line UsageError without CuPy or a GPU).
    ``threads``: the CPU kernels' threads (default ``MODELC_THREADS`` or every core)."""
    if name == "cuda":
        from modelc.runtime.backends.cuda_backend import CudaBackend

        return CudaBackend()
    if name in ("webgpu", "metal"):
        from modelc.runtime.backends.webgpu import WebGPUBackend

        return WebGPUBackend(require="Metal" if name == "metal" else None)
    if name in ("auto", "cpu"):
        try:
            from modelc.runtime.backends.cpu import CpuBackend
        except ImportError:
            if name == "cpu":
                raise
        else:
            return CpuBackend(threads=threads)
    from modelc.runtime.backends.numpy_ref import NumpyBackend

    return NumpyBackend()
