"""Kernel launches through ctypes: keeping the GIL (``cuLaunchKernel`` through
``ctypes.PyDLL``), and with programmatic dependent launch (``cuLaunchKernelEx``).

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

Programmatic dependent launch: every kernel launched through ``cuLaunchKernelEx`` with it
allowed (``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``): the
next kernel of a step may start while the one before it ends, each kernel waiting for its
predecessor's results at its ``ENTER()`` (:mod:`.cuda_src`; the GEMVs prefetch their weight
rows into L2 before that), so a decode step's ~10 kernels a layer overlap their launch,
ramp and drain.  Captured into the step's CUDA graphs as programmatic edges (CUDA 12.3+).
On by default on Hopper and later (compute capability 9.0+; ``MODELC_CUDA_PDL=0`` turns it
off): an H100's batch-1 decode of a 1.1B 1.12-1.18x faster with it (bench/RESULTS.md,
session 30).  With ``MODELC_CUDA_LAUNCH=gil`` too, launched keeping the GIL, else giving it
up as CuPy does.
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


Packer = tuple[struct.Struct, tuple[bool, ...]]  # the slots' layout, which are arrays
# by the arguments' types (a kernel is called with the same ones launch after launch)
_PACKERS: dict[tuple[type[Any], ...], Packer | None] = {}


def _packer(types: tuple[type[Any], ...], array: type[Any]) -> Packer | None:
    """How arguments of ``types`` pack, or None when one does not pack here."""
    key = (array, *types)
    if key in _PACKERS:
        return _PACKERS[key]
    fmt, arrays, out = ["<"], [], None
    for t in types:
        if issubclass(t, array):
            fmt.append("Q")
            arrays.append(True)
            continue
        dt = np.dtype(t) if issubclass(t, np.generic) else None
        code = None if dt is None else _CODES.get((dt.kind, dt.itemsize))
        if code is None:
            break
        fmt.append(code)
        arrays.append(False)
    else:
        out = (struct.Struct("".join(fmt)), tuple(arrays))
    _PACKERS[key] = out
    return out


def pack(args: Sequence[Any], array: type[Any]) -> bytes | None:
    """The kernel's arguments in 8-byte slots, or None when one is not packable here:
    ``array`` instances (device arrays) as their data pointers, numpy scalars as their
    bytes (little-endian)."""
    pk = _packer(tuple(map(type, args)), array)
    if pk is None:
        return None
    st, arrays = pk
    return st.pack(*[a.data.ptr if arr else a for a, arr in zip(args, arrays, strict=True)])


def dims(d: int | Sequence[int]) -> tuple[int, int, int]:
    """A grid or block as three dimensions."""
    t = (int(d),) if isinstance(d, int | np.integer) else tuple(int(x) for x in d)
    return (*t, 1, 1, 1)[:3]  # type: ignore[return-value]


CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: an id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuLaunchKernelEx's first argument)."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.c_void_p),
        ("n_attrs", ctypes.c_uint),
    ]


def pdl_attribute() -> LaunchAttribute:
    """Programmatic stream serialization allowed (the value's first int: 1)."""
    a = LaunchAttribute()
    a.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    a.value = struct.pack("<i", 1).ljust(64, b"\0")
    return a


class Launcher:
    """libcuda's ``cuLaunchKernel`` (``lib``: the library's path), called keeping the GIL
    (``gil``) or giving it up; ``pdl``: ``cuLaunchKernelEx`` with programmatic dependent
    launch allowed."""

    def __init__(
        self, cp: Any, lib: str = "libcuda.so.1", *, gil: bool = True, pdl: bool = False
    ) -> None:
        self.cp = cp
        self.lib = ctypes.PyDLL(lib) if gil else ctypes.CDLL(lib)
        u, p = ctypes.c_uint, ctypes.c_void_p
        self.lib.cuLaunchKernel.argtypes = [p, u, u, u, u, u, u, u, p, p, p]
        self.lib.cuLaunchKernel.restype = ctypes.c_int
        self.pdl = pdl
        if pdl:
            self.lib.cuLaunchKernelEx.argtypes = [p, p, p, p]
            self.lib.cuLaunchKernelEx.restype = ctypes.c_int
            self.attr = pdl_attribute()

    def launch(self, fn: int, g: tuple[int, int, int], b: tuple[int, int, int], shared_mem: int,
               stream: int, params: Any) -> int:  # fmt: skip
        """cuLaunchKernel(Ex)'s result code."""
        if not self.pdl:
            return int(self.lib.cuLaunchKernel(fn, *g, *b, shared_mem, stream, params, None))
        cfg = LaunchConfig((ctypes.c_uint * 3)(*g), (ctypes.c_uint * 3)(*b), shared_mem, stream)
        cfg.attrs, cfg.n_attrs = ctypes.addressof(self.attr), 1
        return int(self.lib.cuLaunchKernelEx(ctypes.byref(cfg), fn, params, None))

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
        rc = lc.launch(self.ptr, g, b, shared_mem, stream, params)
        if rc == CUDA_ERROR_INVALID_CONTEXT:  # a thread CuPy has not yet set up
            self.fn(grid, block, tuple(args), shared_mem=shared_mem)
        elif rc:
            raise RuntimeError(f"cuLaunchKernel{'Ex' if lc.pdl else ''} failed (CUDA error {rc})")


def keep_gil() -> bool:
    """Whether launches and cuBLAS calls keep the GIL (``MODELC_CUDA_LAUNCH=gil``)."""
    return os.environ.get("MODELC_CUDA_LAUNCH", "cupy") == "gil"


def pdl(cp: Any) -> bool:
    """Whether kernels launch with programmatic dependent launch: ``MODELC_CUDA_PDL=1`` or
    ``0``; by default on a GPU of compute capability 9.0 or more (Hopper on), where
    ``griddepcontrol`` exists (``ENTER()`` compiles to nothing before it)."""
    v = os.environ.get("MODELC_CUDA_PDL", "auto")
    if v in ("0", "1"):
        return v == "1"
    return int(cp.cuda.Device().compute_capability) >= 90


def kernels(cp: Any, fns: dict[str, Any]) -> dict[str, Any]:
    """``fns`` launched through :class:`Kernel` with :func:`keep_gil` or :func:`pdl`, else
    (or where libcuda cannot be opened) as they are."""
    use_pdl = pdl(cp)
    if not (keep_gil() or use_pdl):
        return fns
    try:
        lc = Launcher(cp, gil=keep_gil(), pdl=use_pdl)
    except (OSError, AttributeError):  # no libcuda, or one without cuLaunchKernelEx
        return fns
    return {name: lc.wrap(f) for name, f in fns.items()}
