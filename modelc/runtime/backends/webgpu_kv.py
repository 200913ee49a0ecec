"""A sequence's KV cache for the resident WebGPU decoder
(:class:`~modelc.runtime.backends.webgpu_llama.WebGpuLlama`): one device buffer a
sequence, each layer's K and V at an aligned binding offset."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from modelc.errors import UsageError
from modelc.runtime.backend import F32Array, KVArray
from modelc.runtime.backends.webgpu_device import Gpu
from modelc.runtime.kv_cache import DeviceKVCache, KVBudget, KVMode, KVShape

ALIGN_ROWS = 128  # cache positions are allocated in multiples of this (binding offsets)


class WebGpuKVCache(DeviceKVCache):
    """Keys and values of one sequence in one device buffer, f16 or f32: per layer K then V,
    ``(n_layer, 2, rows, n_head_kv, head_dim)`` with ``rows`` the capacity rounded up to
    :data:`ALIGN_ROWS` (so each layer starts at an aligned binding offset).  Grown in
    ``BLOCK``-token steps and charged to the engine's budget as a host cache of the same
    mode; :meth:`write` / :meth:`read` copy through the host (prefix cache, context shift)."""

    def __init__(
        self,
        gpu: Gpu,
        shape: KVShape,
        max_tokens: int,
        mode: KVMode | str = KVMode.F16,
        *,
        budget: KVBudget | None = None,
    ) -> None:
        self.gpu = gpu
        where = "by the resident WebGPU decoder; use f16 or f32 (or MODELC_WEBGPU_RESIDENT=0)"
        super().__init__(shape, max_tokens, mode, budget=budget, where=where)

    def _empty(self) -> None:
        self.n = 0
        self.capacity = 0
        self.rows_alloc = 0
        self.buf: Any = None
        self._base = [0] * self.shape.n_layer

    @property
    def nbytes(self) -> int:
        return self.capacity * self.shape.bytes_per_token(self.mode)

    @property
    def width(self) -> int:
        return self.shape.n_head_kv * self.shape.head_dim

    @property
    def elem(self) -> int:
        return 2 if self.mode is KVMode.F16 else 4

    def layer_bytes(self) -> int:
        """Bytes of one layer's K and V (the binding of a layer)."""
        return 2 * self.rows_alloc * self.width * self.elem

    def _at(self, layer: int, kv: int, pos: int) -> int:
        """Byte offset of position ``pos`` of layer ``layer``'s K (kv 0) or V (kv 1)."""
        return ((2 * layer + kv) * self.rows_alloc + pos) * self.width * self.elem

    def reserve(self, n_tokens: int) -> None:
        cap = self._grown(n_tokens)
        if not cap:
            return
        rows = -(-cap // ALIGN_ROWS) * ALIGN_ROWS
        per_layer = 2 * rows * self.width * self.elem
        if per_layer > self.gpu.max_binding:
            raise UsageError(
                f"WebGPU: a KV cache layer of {cap} positions ({per_layer >> 20} MiB) is over "
                f"the adapter's {self.gpu.max_binding >> 20} MiB binding limit; lower "
                "--max-context, or MODELC_WEBGPU_RESIDENT=0"
            )
        new = self.gpu.storage_buffer(self.shape.n_layer * per_layer, "kv_cache")
        if self.buf is not None and self.n:
            old_rows, self.rows_alloc = self.rows_alloc, rows
            n_bytes = self.n * self.width * self.elem
            copies = []
            for li in range(self.shape.n_layer):
                for kv in (0, 1):
                    src = ((2 * li + kv) * old_rows) * self.width * self.elem
                    copies.append((self.buf, src, new, self._at(li, kv, 0), n_bytes))
            self.gpu.copy_regions(copies)
        if self.buf is not None:
            self.buf.destroy()
        self.buf, self.rows_alloc, self.capacity = new, rows, cap
        self._charge()

    def free(self) -> None:
        if self.buf is not None:
            self.buf.destroy()
        super().free()

    def write(self, layer: int, pos: int, k: KVArray, v: KVArray) -> None:
        assert pos + len(k) <= self.capacity
        for kv, a in ((0, k), (1, v)):
            data = np.ascontiguousarray(a, self.dtype).reshape(-1).view(np.uint8)
            if data.nbytes:
                self.gpu.device.queue.write_buffer(self.buf, self._at(layer, kv, pos), data)

    def read(self, layer: int, n: int) -> tuple[KVArray, KVArray]:
        """Host copies of positions 0 .. n-1."""
        s = self.shape
        out = []
        for kv in (0, 1):
            raw = self.gpu.read_region(self.buf, self._at(layer, kv, 0), n * self.width * self.elem)
            out.append(np.frombuffer(raw, self.dtype).reshape(n, s.n_head_kv, s.head_dim).copy())
        return out[0], out[1]

    def shift(self, n_keep: int, n_discard: int) -> None:
        self._check_shift(n_keep, n_discard)
        src = n_keep + n_discard
        for li in range(self.shape.n_layer):  # through the host: a rare, whole-cache move
            k, v = self.read(li, self.n)
            self.write(li, n_keep, k[src:], v[src:])
        self.n -= n_discard

    def update_keys(self, start: int, fn: Callable[[F32Array], None]) -> None:
        for li in range(self.shape.n_layer):
            k, v = self.read(li, self.n)
            kf = k[start:].astype(np.float32)
            fn(kf)
            self.write(li, start, kf, v[start:])
