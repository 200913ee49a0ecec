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
host, for context shifts.  The prefix cache's blocks are read out by
:meth:`read_blocks` on the model's stream and kept in GPU memory (:func:`device_prefix`),
where a hit fills a new cache on the device (:meth:`fill_blocks`) and a finished
sequence's insert costs one copy kernel queued behind the steps, no wait for a copy to the
host on the event loop (the host copy: ~5.6 MB a finished 256-token sequence of a 1.1B,
15 % of a 64-stream server's tok/s); ``MODELC_CUDA_PREFIX=host`` copies them to the host.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from modelc.errors import CapacityError, UsageError
from modelc.runtime.backend import F32Array, KVArray
from modelc.runtime.kv_cache import DeviceKVCache, KVBudget, KVMode, KVShape


def device_prefix() -> bool:
    """Whether a GPU cache's prefix-cache blocks stay in GPU memory (the default,
    ``MODELC_CUDA_PREFIX=device``; ``host`` copies them to the host)."""
    return os.environ.get("MODELC_CUDA_PREFIX", "device") != "host"


class CudaKVCache(DeviceKVCache):
    """Keys and values of one sequence on the GPU (f16 or f32); ``stream``: the model's,
    which the prefix cache's copies are queued on, ordered with the steps (None: CuPy's
    current one)."""

    def __init__(
        self,
        cp: Any,
        shape: KVShape,
        max_tokens: int,
        mode: KVMode | str = KVMode.F16,
        *,
        budget: KVBudget | None = None,
        stream: Any = None,
    ) -> None:
        self.cp = cp
        self.stream = stream
        self.device_blocks = device_prefix()  # read_blocks keeps them in GPU memory
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

    def _on_stream(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext() if self.stream is None else self.stream

    def read_blocks(self, n: int, start: int, bt: int) -> Any:
        """As :meth:`KVCache.read_blocks`: ordered block by block on the device, then one
        copy to the host (copying each block out of a stacked array on the host took ~8 %
        of a loaded GPU server's step thread, session 39); with :func:`device_prefix`, the
        device array itself (the copy queued on the model's stream, nothing waited for)."""
        s = self.shape
        with self._on_stream():
            x = self.buf[:, : s.kinds, start:n].reshape(
                s.n_layer, s.kinds, (n - start) // bt, bt, s.n_head_kv, s.head_dim
            )
            blocks = x.transpose(2, 1, 0, 3, 4, 5).copy()
            return blocks if self.device_blocks else self.cp.asnumpy(blocks)

    def fill_blocks(self, n: int, blocks: Sequence[tuple[Any, Any]]) -> None:
        """Load positions 0 .. n-1 into this empty cache from device-resident prefix-cache
        blocks (keys and values ``(n_layer, bt, n_head_kv, head_dim)`` each, in order),
        copied on the device, on the model's stream (nothing waited for)."""
        if self.n:
            raise UsageError("only an empty KV cache can be filled")
        bt = n // len(blocks)
        with self._on_stream():
            self.reserve(n)
            for i, (k, v) in enumerate(blocks):
                self.buf[:, 0, i * bt : (i + 1) * bt] = k
                self.buf[:, 1, i * bt : (i + 1) * bt] = v
        self.advance(n)

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
