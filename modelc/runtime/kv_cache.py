"""Per-sequence key/value cache, with f32, f16, int8 and mixed storage, and memory accounting.

A :class:`KVCache` holds, for one sequence and every layer, the keys and values of
the tokens seen so far: cache slot ``i`` is absolute position ``i`` (positions stay
compact after a context shift, see below).

Storage modes (:class:`KVMode`):

* ``f32``: exact.
* ``f16``: IEEE half precision (round to nearest even on write), 2 bytes an element,
  llama.cpp's and Ollama's default.  :meth:`KVCache.read` returns the float16 storage
  itself; the attention kernels read it directly (widening each element exactly), so
  decode attention reads half the bytes of ``f32``.  Values beyond +-65504 would
  become infinite; keys and values of the supported models are far below that.
* ``int8``: every token's key/value vector is stored per head as int8 with one f32
  scale per group of ``GROUP`` (32) elements, symmetric (``scale = max|x| / 127``):
  ``(slots, n_head_kv, head_dim)`` int8 plus ``(slots, n_head_kv, head_dim/32)`` f32, the
  granularity of GGML's Q8_0 (one scale per whole head was measured to flip far more
  greedy tokens: keys have outlier channels).  Attention reads the dequantized values,
  including for the tokens written in the same step.
* ``mixed``: int8 for everything plus an f32 ring buffer holding the most recent
  ``hot_window`` tokens exactly; attention reads exact values for the hot window and
  dequantized ones for older tokens.

Storage grows in blocks of ``BLOCK`` tokens up to ``max_tokens``.  If a
:class:`KVBudget` is given, every growth is charged to it (and released by
:meth:`KVCache.free`), so the engine can bound total KV memory across sequences.

Context shift (StreamingLLM style, as llama.cpp does it): :meth:`KVCache.shift`
keeps the first ``n_keep`` "anchor" tokens, drops the next ``n_discard`` and moves the
rest down, so positions stay compact (``0 .. n-1``).  Keys of a RoPE model were
rotated at their old positions; the architecture's ``shift_context`` re-rotates
the moved keys by ``-n_discard`` through :meth:`KVCache.update_keys` (rotations
compose additively, so this is exact up to rounding; for f16 and int8 storage the
keys are rotated in f32 and stored again, rounded to the storage type).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelc.errors import CapacityError, UsageError
from modelc.runtime.backend import F16Array, F32Array, KVArray

BLOCK = 256
GROUP = 32  # int8 elements per scale (a whole head when head_dim is not a multiple)


class KVMode(enum.StrEnum):
    """How a cache stores keys and values (``--kv-cache``)."""

    F32 = "f32"
    F16 = "f16"
    INT8 = "int8"
    MIXED = "mixed"

    @property
    def quantized(self) -> bool:
        """int8 storage, read back through a dequantization scratch."""
        return self in (KVMode.INT8, KVMode.MIXED)


@dataclass(frozen=True, slots=True)
class KVShape:
    n_layer: int
    n_head_kv: int
    head_dim: int

    @property
    def group(self) -> int:
        return GROUP if self.head_dim % GROUP == 0 else self.head_dim

    def bytes_per_token(self, mode: KVMode) -> int:
        """Bytes one token occupies in the cache (keys + values, all layers), ring excluded."""
        if mode is KVMode.F32:
            per_head = self.head_dim * 4
        elif mode is KVMode.F16:
            per_head = self.head_dim * 2
        else:
            per_head = self.head_dim + 4 * (self.head_dim // self.group)
        return 2 * self.n_layer * self.n_head_kv * per_head


class KVBudget:
    """Bytes of KV memory shared by all sequences; caches charge their growth to it."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit = int(limit_bytes)
        self.used = 0

    @property
    def free(self) -> int:
        return self.limit - self.used

    def reserve(self, n: int) -> None:
        if self.used + n > self.limit:
            raise CapacityError(
                f"KV cache memory budget exhausted ({self.used + n} > {self.limit} bytes); "
                "wait for running requests to finish or raise the KV memory limit"
            )
        self.used += n

    def release(self, n: int) -> None:
        self.used -= n
        assert self.used >= 0


def quantize_int8(
    x: F32Array, group: int = GROUP
) -> tuple[np.ndarray[Any, np.dtype[np.int8]], F32Array]:
    """x (n, h, d) f32 -> int8 (n, h, d) and scales (n, h, d/group), symmetric per group."""
    n, h, d = x.shape
    xg = x.reshape(n, h, d // group, group)
    scale = (np.max(np.abs(xg), axis=-1) / 127.0).astype(np.float32)  # (n, h, g)
    inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
    q = np.clip(np.rint(xg * inv[..., None]), -127, 127).astype(np.int8)
    return q.reshape(n, h, d), scale


def dequantize_int8(
    q: np.ndarray[Any, np.dtype[np.int8]], scale: F32Array, out: F32Array
) -> F32Array:
    """int8 (n, h, d) * scales (n, h, g) -> out (n, h, d) f32."""
    n, h, d = q.shape
    g = scale.shape[-1]
    np.multiply(
        q.reshape(n, h, g, d // g),
        scale[..., None],
        out=out.reshape(n, h, g, d // g),
        casting="unsafe",
    )
    return out


class _Store:
    """One tensor kind (K or V) of one layer, in the cache's storage mode."""

    def __init__(self, mode: KVMode, h: int, d: int, hot: int) -> None:
        self.mode, self.h, self.d, self.hot = mode, h, d, hot
        self.f32: F32Array = np.zeros((0, h, d), np.float32)  # (slots, h, d)  f32 mode
        self.f16: F16Array = np.zeros((0, h, d), np.float16)  # (slots, h, d)  f16 mode
        self.q = np.zeros((0, h, d), np.int8)  # (slots, h, d)  int8 / mixed
        self.group = GROUP if d % GROUP == 0 else d
        self.scale: F32Array = np.zeros((0, h, d // self.group), np.float32)  # (slots, h, g)
        # mixed: exact copies of the last `hot` positions, slot = pos % hot
        self.ring: F32Array = np.zeros((hot if mode is KVMode.MIXED else 0, h, d), np.float32)
        self.ring_pos = np.full(len(self.ring), -1, np.int64)  # position each ring slot holds

    def grow(self, cap: int) -> None:
        if self.mode is KVMode.F32:
            new = np.zeros((cap, self.h, self.d), np.float32)
            new[: len(self.f32)] = self.f32
            self.f32 = new
        elif self.mode is KVMode.F16:
            half = np.zeros((cap, self.h, self.d), np.float16)
            half[: len(self.f16)] = self.f16
            self.f16 = half
        else:
            q = np.zeros((cap, self.h, self.d), np.int8)
            q[: len(self.q)] = self.q
            s = np.zeros((cap, self.h, self.d // self.group), np.float32)
            s[: len(self.scale)] = self.scale
            self.q, self.scale = q, s

    def write(self, pos: int, x: KVArray) -> None:
        """x (n, h, d) at positions pos .. pos+n-1 (f32, or f16 as read back from a cache)."""
        n = len(x)
        if self.mode is KVMode.F32:
            self.f32[pos : pos + n] = x
            return
        if self.mode is KVMode.F16:
            self.f16[pos : pos + n] = x  # rounds to nearest even
            return
        x = x.astype(np.float32, copy=False)
        self.q[pos : pos + n], self.scale[pos : pos + n] = quantize_int8(x, self.group)
        if self.mode is KVMode.MIXED:
            first = max(0, n - self.hot)
            for i in range(first, n):  # at most `hot` rows
                slot = (pos + i) % self.hot
                self.ring[slot] = x[i]
                self.ring_pos[slot] = pos + i

    def read(self, n: int, scratch: F32Array) -> KVArray:
        """Positions 0 .. n-1 (n, h, d): a view (f32, f16) or dequantized into scratch (f32)."""
        if self.mode is KVMode.F32:
            return self.f32[:n]
        if self.mode is KVMode.F16:
            return self.f16[:n]
        out = dequantize_int8(self.q[:n], self.scale[:n], scratch[:n])
        if self.mode is KVMode.MIXED:
            for p in range(max(0, n - self.hot), n):
                if self.ring_pos[p % self.hot] == p:
                    out[p] = self.ring[p % self.hot]
        return out

    def move(self, src: int, dst: int, n: int) -> None:
        """Move slots src..src+n-1 to dst..dst+n-1 (dst < src)."""
        if self.mode is KVMode.F32:
            self.f32[dst : dst + n] = self.f32[src : src + n]
            return
        if self.mode is KVMode.F16:
            self.f16[dst : dst + n] = self.f16[src : src + n]
            return
        self.q[dst : dst + n] = self.q[src : src + n]
        self.scale[dst : dst + n] = self.scale[src : src + n]
        if self.mode is KVMode.MIXED:
            # ring slots are keyed by position: re-key the exact rows that moved
            held = [(int(p), self.ring[i].copy()) for i, p in enumerate(self.ring_pos) if p >= dst]
            for p, _ in held:
                self.ring_pos[p % self.hot] = -1
            for p, row in sorted(held):
                if p >= src:
                    slot = (p - (src - dst)) % self.hot
                    self.ring[slot] = row
                    self.ring_pos[slot] = p - (src - dst)

    def forget_from(self, n: int) -> None:
        """Invalidate exact ring copies of positions >= n (after a truncation)."""
        self.ring_pos[self.ring_pos >= n] = -1

    @property
    def nbytes(self) -> int:
        return int(
            self.f32.nbytes + self.f16.nbytes + self.q.nbytes + self.scale.nbytes + self.ring.nbytes
        )


class KVCache:
    """Keys and values of one sequence, all layers. ``n`` tokens cached = next position."""

    def __init__(
        self,
        shape: KVShape,
        max_tokens: int,
        mode: KVMode | str = KVMode.F32,
        *,
        hot_window: int = 256,
        budget: KVBudget | None = None,
    ) -> None:
        self.shape = shape
        self.mode = KVMode(mode)
        if max_tokens <= 0:
            raise UsageError(f"KV cache size must be positive, got {max_tokens}")
        if self.mode is KVMode.MIXED and hot_window <= 0:
            raise UsageError(f"mixed KV cache needs a positive hot window, got {hot_window}")
        self.max_tokens = max_tokens
        self.hot_window = hot_window if self.mode is KVMode.MIXED else 0
        self.budget = budget
        self._charged = 0
        self._empty()
        self._charge()

    def _empty(self) -> None:
        h, d, hot = self.shape.n_head_kv, self.shape.head_dim, self.hot_window
        self.n = 0
        self.capacity = 0
        self._k = [_Store(self.mode, h, d, hot) for _ in range(self.shape.n_layer)]
        self._v = [_Store(self.mode, h, d, hot) for _ in range(self.shape.n_layer)]
        # dequantization scratch for one layer's K and V (int8 / mixed): (capacity, h, d)
        self._scratch_k: F32Array = np.zeros((0, h, d), np.float32)
        self._scratch_v: F32Array = np.zeros((0, h, d), np.float32)

    # -- memory ----------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes held by this cache (storage, ring buffers and dequantization scratch)."""
        return (
            sum(s.nbytes for s in self._k)
            + sum(s.nbytes for s in self._v)
            + self._scratch_k.nbytes
            + self._scratch_v.nbytes
        )

    def _charge(self) -> None:
        new = self.nbytes
        if self.budget is not None and new > self._charged:
            self.budget.reserve(new - self._charged)
        self._charged = new

    def free(self) -> None:
        """Drop all storage (the cache is empty and unbudgeted after) and give its bytes back."""
        if self.budget is not None:
            self.budget.release(self._charged)
        self.budget = None
        self._charged = 0
        self._empty()

    def reserve(self, n_tokens: int) -> None:
        """Make room for ``n_tokens`` cached tokens in total (grows in blocks)."""
        if n_tokens > self.max_tokens:
            raise UsageError(
                f"sequence of {n_tokens} tokens exceeds the KV cache size {self.max_tokens}; "
                "shorten the prompt or shift the context"
            )
        if n_tokens <= self.capacity:
            return
        cap = min(self.max_tokens, -(-n_tokens // BLOCK) * BLOCK)
        extra = (cap - self.capacity) * self.shape.bytes_per_token(self.mode)
        if self.mode.quantized:
            extra += 2 * (cap - self.capacity) * self.shape.n_head_kv * self.shape.head_dim * 4
        if self.budget is not None and extra > self.budget.free:
            self.budget.reserve(extra)  # raises CapacityError before anything is allocated
        for s in (*self._k, *self._v):
            s.grow(cap)
        if self.mode.quantized:
            h, d = self.shape.n_head_kv, self.shape.head_dim
            self._scratch_k = np.zeros((cap, h, d), np.float32)
            self._scratch_v = np.zeros((cap, h, d), np.float32)
        self.capacity = cap
        self._charge()

    # -- the forward pass ------------------------------------------------------------
    def write(self, layer: int, pos: int, k: KVArray, v: KVArray) -> None:
        """k, v (n, n_head_kv, head_dim) at positions pos .. pos+n-1 (room reserved).

        f32, or f16 values read back from a cache (the prefix cache stores what
        :meth:`read` returns); stored rounded to the cache's mode."""
        assert pos + len(k) <= self.capacity
        self._k[layer].write(pos, k)
        self._v[layer].write(pos, v)

    @property
    def dtype(self) -> np.dtype[Any]:
        """What :meth:`read` returns: float16 for an f16 cache, float32 otherwise."""
        return np.dtype(np.float16 if self.mode is KVMode.F16 else np.float32)

    def storage(self, layer: int) -> tuple[KVArray, KVArray] | None:
        """Layer ``layer``'s K and V storage itself, (capacity, n_head_kv, head_dim) each, for
        a backend to write new rows into and read in place (``attention_append``); ``None``
        for the quantized modes, whose rows go through :meth:`write` and :meth:`read`."""
        k, v = self._k[layer], self._v[layer]
        if self.mode is KVMode.F32:
            return k.f32, v.f32
        if self.mode is KVMode.F16:
            return k.f16, v.f16
        return None

    def read(self, layer: int, n: int) -> tuple[KVArray, KVArray]:
        """Keys and values of positions 0 .. n-1, (n, n_head_kv, head_dim) each.

        Views of the storage for f32 and f16 caches (float16 for f16: no copy, the
        attention kernels read it as is); for int8 and mixed, f32 values dequantized
        into a scratch buffer that the next ``read`` of any layer overwrites."""
        return (
            self._k[layer].read(n, self._scratch_k),
            self._v[layer].read(n, self._scratch_v),
        )

    def advance(self, n_new: int) -> None:
        """Commit ``n_new`` tokens written by the forward pass."""
        self.n += n_new

    def truncate(self, n: int) -> None:
        """Forget tokens from position ``n`` on (speculation rollback, prefix reuse)."""
        if not 0 <= n <= self.n:
            raise UsageError(f"cannot truncate a KV cache of {self.n} tokens to {n}")
        for st in (*self._k, *self._v):
            st.forget_from(n)
        self.n = n

    # -- context shift ---------------------------------------------------------------
    def shift(self, n_keep: int, n_discard: int) -> None:
        """Drop tokens ``n_keep .. n_keep+n_discard-1``; later tokens move down by n_discard."""
        if n_keep < 0 or n_discard <= 0 or n_keep + n_discard > self.n:
            raise UsageError(
                f"bad context shift: keep {n_keep}, discard {n_discard} of {self.n} tokens"
            )
        src, dst = n_keep + n_discard, n_keep
        for s in (*self._k, *self._v):
            s.move(src, dst, self.n - src)
        self.n -= n_discard

    def update_keys(self, start: int, fn: Callable[[F32Array], None]) -> None:
        """Apply ``fn`` in place to the keys of positions start .. n-1, every layer."""
        for st in self._k:
            if st.mode is KVMode.F32:
                fn(st.f32[start : self.n])
                continue
            x = st.read(self.n, self._scratch_k)[start:].astype(np.float32)  # a copy
            fn(x)
            st.write(start, x)
