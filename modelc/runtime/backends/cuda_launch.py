"""Kernel launches that keep the GIL: ``cuLaunchKernel`` called through ``ctypes.PyDLL``.

CuPy gives the GIL up around every launch (as around every CUDA call), and a launch
takes microseconds; but in a server the event loop holds the GIL most of the time, so
the step thread waits to get it back after each one (0.3-1 ms a hand-back measured on
an H100 host at 64 streams, `bench/gil_probe.py`), and an eager step of ~250 launches
spent most of its time waiting.  :class:`Kernel` wraps CuPy's compiled function: its
arguments are packed here (device arrays as their pointers, numpy scalars as their
bytes) and launched on the current stream, with the GIL held (launches are queued, not
waited on; captured into a graph as CuPy's are).  An argument it cannot pack (a Python
number: CuPy picks its C type) goes through CuPy's own launch.

Opt-in until a GPU run has checked it (``MODELC_CUDA_LAUNCH=gil``; the default, ``cupy``,
sends every launch through CuPy, and calls cuBLAS giving the GIL up, as before): written
and its packing tested on the CPU (tests/test_cuda_route.py) in a session whose GPU time
ran out before the call that would have run the GPU tests with it.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

CUDA_ERROR_INVALID_CONTEXT = 201
# (kind, size) of a numpy scalar -> struct code, padded to an 8-byte slot
_CODES = {
    ("i", 4): "i4x",
    ("i", 8): "q",
    ("u", 4): "I4x",
    ("u", 8): "Q",
    ("f", 4): "f4x",
    ("f", 8): "d",
}


def pack(args: Sequence[Any], array: type[Any]) -> bytes | None:
    """The kernel's arguments in 8-byte slots, or None when one is not packable here:
    ``array`` instances (device arrays) as their data pointers, numpy scalars as their
    bytes (little-endian)."""
    fmt, vals = ["<"], []
    for a in args:
        if isinstance(a, array):
            fmt.append("Q")
            vals.append(a.data.ptr)
        elif isinstance(a, np.generic):
            code = _CODES.get((a.dtype.kind, a.dtype.itemsize))
            if code is None:
                return None
            fmt.append(code)
            vals.append(a.item())
        else:
            return None
    return struct.pack("".join(fmt), *vals)


def dims(d: int | Sequence[int]) -> tuple[int, int, int]:
    """A grid or block as three dimensions."""
    t = (int(d),) if isinstance(d, int | np.integer) else tuple(int(x) for x in d)
    return (*t, 1, 1, 1)[:3]  # type: ignore[return-value]


class Launcher:
    """libcuda's ``cuLaunchKernel`` (``lib``: the library's path), called keeping the GIL."""

    def __init__(self, cp: Any, lib: str = "libcuda.so.1") -> None:
        self.cp = cp
        self.lib = ctypes.PyDLL(lib)
        u, p = ctypes.c_uint, ctypes.c_void_p
        self.lib.cuLaunchKernel.argtypes = [p, u, u, u, u, u, u, u, p, p, p]
        self.lib.cuLaunchKernel.restype = ctypes.c_int

    def wrap(self, fn: Any) -> Kernel:
        return Kernel(self, fn)


class Kernel:
    """A compiled kernel (CuPy's ``RawKernel`` or ``Function``), called as CuPy's: ``(grid,
    block, args)``."""

    __slots__ = ("fn", "launcher", "ptr")

    def __init__(self, launcher: Launcher, fn: Any) -> None:
        # CuPy's RawModule.get_function gives a RawKernel (its ``kernel``: the Function,
        # compiled for the current device, whose ``ptr`` is the CUfunction); a Function
        # is its own
        self.launcher, self.fn = launcher, fn
        self.ptr = getattr(fn, "kernel", fn).ptr

    def __call__(
        self, grid: int | Sequence[int], block: int | Sequence[int], args: Sequence[Any],
        shared_mem: int = 0,
    ) -> None:  # fmt: skip
        lc = self.launcher
        blob = pack(args, lc.cp.ndarray)
        if blob is None:
            self.fn(grid, block, tuple(args), shared_mem=shared_mem)
            return
        n = len(args)
        buf = ctypes.create_string_buffer(blob, 8 * n)
        at = ctypes.addressof(buf)
        params = (ctypes.c_void_p * n)(*range(at, at + 8 * n, 8))
        g, b = dims(grid), dims(block)
        stream = lc.cp.cuda.get_current_stream().ptr
        rc = lc.lib.cuLaunchKernel(self.ptr, *g, *b, shared_mem, stream, params, None)
        if rc == CUDA_ERROR_INVALID_CONTEXT:  # a thread CuPy has not yet set up
            self.fn(grid, block, tuple(args), shared_mem=shared_mem)
        elif rc:
            raise RuntimeError(f"cuLaunchKernel failed (CUDA error {rc})")


def keep_gil() -> bool:
    """Whether launches and cuBLAS calls keep the GIL (``MODELC_CUDA_LAUNCH=gil``)."""
    return os.environ.get("MODELC_CUDA_LAUNCH", "cupy") == "gil"


def kernels(cp: Any, fns: dict[str, Any]) -> dict[str, Any]:
    """``fns`` launched through :class:`Kernel` with :func:`keep_gil`, else (or where
    libcuda cannot be opened) as they are."""
    if not keep_gil():
        return fns
    try:
        lc = Launcher(cp)
    except OSError:
        return fns
    return {name: lc.wrap(f) for name, f in fns.items()}
