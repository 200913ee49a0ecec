"""Storage of one layer's keys or values (one tensor kind) in a KV cache's mode.

:class:`KVStore` holds ``(rows, n_head_kv, head_dim)`` in f32, f16 or int8 (with per-group
scales, and for ``mixed`` an exact f32 ring of the most recent positions); row ``i`` is
whatever position the owning :class:`~modelc.runtime.kv_cache.KVCache` maps to it (the
position itself, or ``position - base`` for a windowed layer, see kv_cache).  The int8
helpers, the cache's :class:`KVShape` and the engine-wide :class:`KVBudget` live here too
(``kv_cache`` re-exports them).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelc.errors import CapacityError
from modelc.runtime.backend import F16Array, F32Array, KVArray

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
    """A cache's layout: per layer and token ``n_head_kv`` keys of ``head_dim``, and as
    many values; with ``shared_values`` (multi-head latent attention) no values of their
    own: the model reads them from the keys (one latent a token, as llama.cpp keeps it)."""

    n_layer: int
    n_head_kv: int
    head_dim: int
    shared_values: bool = False

    @property
    def kinds(self) -> int:
        """Tensors a layer stores: keys and values, or the keys alone."""
        return 1 if self.shared_values else 2

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
        return self.kinds * self.n_layer * self.n_head_kv * per_head


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


class KVStore:
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

    @property
    def rows(self) -> int:
        """Rows allocated."""
        return len(self.f32) + len(self.f16) + len(self.q)

    def resize(self, cap: int, src: int = 0, n: int | None = None) -> None:
        """Reallocate to ``cap`` rows, keeping rows ``src .. src+n-1`` (default: all that
        fit) as rows ``0 .. n-1``; with ``cap`` unchanged, they are moved in place."""
        n = min(self.rows - src, cap) if n is None else n
        if cap == self.rows:
            if src:
                self.move(src, 0, n)
            return
        if self.mode is KVMode.F32:
            new = np.zeros((cap, self.h, self.d), np.float32)
            new[:n] = self.f32[src : src + n]
            self.f32 = new
        elif self.mode is KVMode.F16:
            half = np.zeros((cap, self.h, self.d), np.float16)
            half[:n] = self.f16[src : src + n]
            self.f16 = half
        else:
            q = np.zeros((cap, self.h, self.d), np.int8)
            q[:n] = self.q[src : src + n]
            s = np.zeros((cap, self.h, self.d // self.group), np.float32)
            s[:n] = self.scale[src : src + n]
            self.q, self.scale = q, s
            if src and self.mode is KVMode.MIXED:
                self._rekey(src, 0)

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
            self._rekey(src, dst)

    def _rekey(self, src: int, dst: int) -> None:
        """Ring slots are keyed by row: once rows ``src ..`` moved to ``dst ..`` (dst < src),
        drop the exact copies of the rows from ``dst`` on and re-key those that moved."""
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
