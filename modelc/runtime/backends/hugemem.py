"""Memory for the weights' repacked copies, backed by 2 MiB pages where the OS has them.

Batch-1 decode streams every weight byte once a token.  numpy advises the kernel to back
an allocation with transparent huge pages only from 4 MiB, and then from wherever malloc's
mapping starts; a 1B llama's attention matrices (2-3 MB each) and the unaligned ends of
the rest stayed on 4 KiB pages, a third of its repacked weights.  Each of those pages
costs the decode loop a TLB miss (a two-level walk under a hypervisor) and stops the
hardware prefetcher at its edge.  :class:`HugeArena` hands out arrays from 2 MiB-aligned
anonymous mappings advised ``MADV_HUGEPAGE``, packed one after another, so all of them
sit in huge pages (THP ``madvise`` mode, the common default; ``never`` leaves plain
pages, as before).  Where ``madvise`` does not exist (macOS, Windows) it is numpy's
allocator.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

HUGE = 2 << 20  # the huge page size of x86-64 and of most arm64 kernels
CHUNK = 64 << 20  # one mapping at a time; the untouched rest of the last one costs nothing
ALIGN = 64  # each array starts on a cache line


def _region(nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """``nbytes`` (a multiple of ``HUGE``) of fresh zero memory, 2 MiB-aligned, advised
    into huge pages; the view holds its mapping, which goes when the last view does."""
    m = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # not shmem
    raw = np.frombuffer(m, np.uint8)
    skip = -raw.ctypes.data % HUGE  # the mapping is page-aligned, so skip is too
    m.madvise(mmap.MADV_HUGEPAGE, skip, nbytes)
    return raw[skip : skip + nbytes]


class HugeArena:
    """A bump allocator over huge-page regions; arrays live as long as anything holds
    them (each keeps its region's mapping), so there is nothing to free."""

    def __init__(self, chunk: int = CHUNK) -> None:
        self.enabled = hasattr(mmap, "MADV_HUGEPAGE")
        self._chunk = chunk
        self._buf: np.ndarray[Any, np.dtype[np.uint8]] | None = None
        self._off = 0

    def empty(self, shape: tuple[int, ...], dtype: Any = np.uint8) -> np.ndarray[Any, Any]:
        """An uninitialised (in fact zeroed) C-contiguous array."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        if not self.enabled or n == 0:
            return np.empty(shape, dt)
        need = -(-n // ALIGN) * ALIGN
        if self._buf is None or self._off + need > self._buf.size:
            self._buf = _region(max(self._chunk, -(-need // HUGE) * HUGE))
            self._off = 0
        a: np.ndarray[Any, Any] = self._buf[self._off : self._off + n].view(dt).reshape(shape)
        self._off += need
        return a
