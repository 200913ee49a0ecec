"""Weights as the CPU kernels read them: uint8 row views, the per-array memo that keeps
them (and the repacked copies) between calls, and whether a weight is file-mapped."""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from modelc.formats.ir import row_bytes
from modelc.runtime.backend import Weight

__all__ = ["file_mapped", "memo", "memo_hit", "raw_rows"]

T = TypeVar("T")


def raw_rows(w: Weight) -> np.ndarray[Any, Any]:
    """The weight as uint8 (rows, row_bytes), the layout every C kernel reads."""
    data = np.asarray(w.data)
    if not data.flags.c_contiguous:
        data = np.ascontiguousarray(data)
    rows, cols = w.shape
    raw = data.view(np.uint8).reshape(rows, -1)
    if raw.shape[1] != row_bytes(w.dtype, cols):
        raise ValueError(
            f"weight {w.dtype} {w.shape}: rows hold {raw.shape[1]} bytes, expected {row_bytes(w.dtype, cols)}"
        )
    return raw


def memo_hit(
    cache: dict[int, tuple[np.ndarray[Any, Any], T]], data: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], T] | None:
    """The entry ``memo`` keeps for ``data`` (this very array), or None."""
    hit = cache.get(id(data))
    return hit if hit is not None and hit[0] is data else None


def memo(
    cache: dict[int, tuple[np.ndarray[Any, Any], T]],
    data: np.ndarray[Any, Any],
    limit: int,
    make: Callable[[], tuple[T, bool]],
) -> T:
    """What ``make`` derives from a weight's ``data``, kept per array (by identity, the
    array itself held so its id is not reused) when ``make`` says it may be; the cache is
    emptied at ``limit`` entries (weights made afresh per call must not grow it forever)."""
    hit = memo_hit(cache, data)
    if hit is not None:
        return hit[1]
    value, keep = make()
    if keep:
        if len(cache) >= limit:
            cache.clear()
        cache[id(data)] = (data, value)
    return value


def file_mapped(a: np.ndarray[Any, Any]) -> bool:
    """Whether ``a`` is a read-only view of a file mapping (np.memmap, mmap.mmap), whose
    pages the OS can drop and read back: never true of memory the process owns."""
    if a.flags.writeable:
        return False
    base: Any = a
    while base is not None:
        if isinstance(base, np.memmap | mmap.mmap):
            return True
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return False
