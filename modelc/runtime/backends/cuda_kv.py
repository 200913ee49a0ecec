"""A sequence's KV cache in GPU memory, behind the :class:`~modelc.runtime.kv_cache.KVCache`
interface the engine and the prefix cache use.

Storage is one device array ``(n_layer, 2, capacity, n_head_kv, head_dim)`` (K then V of
each layer) in f16 or f32, grown in ``BLOCK``-token steps up to ``max_tokens`` and charged
to the engine's :class:`~modelc.runtime.kv_cache.KVBudget` exactly as a host cache of the
same mode would be (``capacity * bytes_per_token``), so the scheduler's accounting and
admission are unchanged.  :meth:`CudaKVCache.free` drops the array (CuPy's pool reuses
its memory for the next sequence) and gives the bytes back to the budget.

The forward pass writes and reads the storage on the device (``base_ptr`` and
``capacity`` go into each step's metadata); :meth:`write` / :meth:`read` copy through the
host, for the prefix cache and context shifts only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from modelc.errors import CapacityError, UsageError
from modelc.runtime.backend import F32Array, KVArray
from modelc.runtime.kv_cache import DeviceKVCache, KVBudget, KVMode, KVShape


class CudaKVCache(DeviceKVCache):
    """Keys and values of one sequence on the GPU (f16 or f32)."""

    def __init__(
        self,
        cp: Any,
        shape: KVShape,
        max_tokens: int,
        mode: KVMode | str = KVMode.F16,
        *,
        budget: KVBudget | None = None,
    ) -> None:
        self.cp = cp
        where = "with --device cuda; use f16 or f32"
        super().__init__(shape, max_tokens, mode, budget=budget, where=where)

    def _empty(self) -> None:
        self.n = 0
        self.capacity = 0
        self.buf: Any = None
        self._base = [0] * self.shape.n_layer  # no windowed layers: KVCache.fill sets these

    @property
    def nbytes(self) -> int:
        return 0 if self.buf is None else int(self.buf.nbytes)

    @property
    def base_ptr(self) -> int:
        return 0 if self.buf is None else int(self.buf.data.ptr)

    def reserve(self, n_tokens: int) -> None:
        cap = self._grown(n_tokens)
        if not cap:
            return
        s = self.shape
        try:
            new = self.cp.empty((s.n_layer, 2, cap, s.n_head_kv, s.head_dim), self.dtype)
        except self.cp.cuda.memory.OutOfMemoryError as e:
            raise CapacityError(
                f"GPU memory is exhausted growing a KV cache to {cap} tokens; "
                "lower --max-concurrent or --max-context"
            ) from e
        if self.buf is not None:
            new[:, :, : self.capacity] = self.buf
        self.buf = new
        self.capacity = cap
        self._charge()

    def write(self, layer: int, pos: int, k: KVArray, v: KVArray) -> None:
        assert pos + len(k) <= self.capacity
        self.buf[layer, 0, pos : pos + len(k)] = self.cp.asarray(np.asarray(k, self.dtype))
        self.buf[layer, 1, pos : pos + len(v)] = self.cp.asarray(np.asarray(v, self.dtype))

    def fill(self, n: int, get: Callable[[int, int], tuple[KVArray, KVArray]]) -> None:
        """As :meth:`KVCache.fill`, in one copy to the device (not two a layer); every
        layer holds every position here (:class:`DeviceKVCache`), so each from 0."""
        if self.n:
            raise UsageError("only an empty KV cache can be filled")
        s = self.shape
        self.reserve(n)
        host = np.empty((s.n_layer, 2, n, s.n_head_kv, s.head_dim), self.dtype)
        for li in range(s.n_layer):
            host[li, 0], host[li, 1] = get(li, 0)
        self.buf[:, :, :n] = self.cp.asarray(host)
        self.cp.cuda.get_current_stream().synchronize()  # before a step on the model's stream
        self.advance(n)

    def read_stack(self, n: int, start: int = 0) -> KVArray | None:
        """(n_layer, 2, n - start, n_head_kv, head_dim): the storage's own layout, one copy."""
        if n <= start or self.buf is None:
            return None
        return self.cp.asnumpy(self.buf[:, :, start:n])  # type: ignore[no-any-return]

    def read_blocks(self, n: int, start: int, bt: int) -> KVArray | None:
        """As :meth:`KVCache.read_blocks`: ordered block by block on the device, then one
        copy to the host (copying each block out of a stacked array on the host took ~8 %
        of a loaded GPU server's step thread, session 39)."""
        s = self.shape
        x = self.buf[:, : s.kinds, start:n].reshape(
            s.n_layer, s.kinds, (n - start) // bt, bt, s.n_head_kv, s.head_dim
        )
        return self.cp.asnumpy(x.transpose(2, 1, 0, 3, 4, 5).copy())  # type: ignore[no-any-return]

    def read_all(self, n: int, start: int = 0) -> Iterator[tuple[KVArray, KVArray]]:
        """As :meth:`KVCache.read_all`, every layer copied to the host at once (each holds
        every position: :class:`DeviceKVCache`)."""
        host = self.read_stack(n, start)
        if host is None:
            yield from super().read_all(n, start)
            return
        for li in range(self.shape.n_layer):
            yield host[li, 0], host[li, 1]

    def read(self, layer: int, n: int) -> tuple[KVArray, KVArray]:
        """Host copies of positions 0 .. n-1 (the prefix cache keeps them)."""
        if n == 0 or self.buf is None:
            s = self.shape
            z = np.zeros((0, s.n_head_kv, s.head_dim), self.dtype)
            return z, z.copy()
        return self.cp.asnumpy(self.buf[layer, 0, :n]), self.cp.asnumpy(self.buf[layer, 1, :n])

    def shift(self, n_keep: int, n_discard: int) -> None:
        self._check_shift(n_keep, n_discard)
        src, m = n_keep + n_discard, self.n - n_keep - n_discard
        self.buf[:, :, n_keep : n_keep + m] = self.buf[:, :, src : src + m].copy()
        self.n -= n_discard

    def update_keys(self, start: int, fn: Callable[[F32Array], None]) -> None:
        for layer in range(self.shape.n_layer):
            k = self.buf[layer, 0, start : self.n].get().astype(np.float32)
            fn(k)
            self.buf[layer, 0, start : self.n] = self.cp.asarray(k.astype(self.dtype))
