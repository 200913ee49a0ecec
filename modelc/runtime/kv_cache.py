"""Per-sequence key/value cache, with f32, f16, int8 and mixed storage, and memory accounting.

A :class:`KVCache` holds, for one sequence and every layer, the keys and values of
the tokens seen so far: storage row ``i`` of a layer is absolute position ``i``
(positions stay compact after a context shift, see below), except in a windowed layer.
The storage itself (one :class:`~modelc.runtime.kv_store.KVStore` per layer and tensor
kind) is in ``kv_store``.

Sliding-window layers (``windows``, from the architecture: Mistral's ``sliding_window``,
Gemma 2/3's local layers): a query at position ``p`` of a layer with window ``w`` sees
positions ``p-w+1 .. p`` only, so in f32 and f16 caches such a layer keeps at most
``w + window_keep + window_slack`` rows (64 + 256 by default; llama.cpp's SWA cache keeps
the window plus one ubatch).  Row ``i`` is position ``base + i``, ``base`` per layer
(:meth:`KVCache.held_from`); when a step would outgrow that, :meth:`KVCache.reserve`
moves the rows of positions ``n-w+1-window_keep ..`` (the step's first query, at ``n``,
sees from ``n-w+1``) to the front in one copy, once every ``window_slack`` tokens of
decoding, so the cost is amortised.  The ``window_keep`` rows before the window let a
rollback go that far back and let the prefix cache copy out whole blocks.  The
attention kernels need no change: they take :meth:`KVCache.start` (``n - base``) as the
first query's position, and a window and causality are relative; keys were rotated at
their absolute positions before being stored, so moving rows changes nothing.  A chunk
longer than the slack grows the layer to ``w - 1 + window_keep + chunk`` rows until the
next move.  :meth:`KVCache.truncate` back to any position reached since the last
``reserve`` (a speculative step's drafts), or up to ``window_keep`` before it, always
works; further back than a windowed layer still holds, and a :meth:`KVCache.shift` whose window would need anchors already dropped
(:meth:`KVCache.max_discard`), raise :class:`~modelc.errors.WindowError`.  Every
storage mode is windowed alike (int8's scales move with their rows, the mixed ring's
exact rows are re-keyed to their new rows; the dequantization scratch holds the most
rows any layer does); a cache made with ``windows=None`` (``full=True`` in
``new_cache``) keeps every position of every layer.

Storage modes (:class:`KVMode`): ``f32`` exact; ``f16`` (llama.cpp's and Ollama's
default) IEEE half precision rounded to nearest even, read by the attention kernels
directly (half the bytes of ``f32``); ``int8`` a key/value vector per head as int8 with an
f32 scale a group of ``GROUP`` (32) elements, symmetric, GGML Q8_0's granularity (one
scale a head flipped far more greedy tokens: keys have outlier channels), read
dequantized; ``mixed`` int8 plus an f32 ring of the latest ``hot_window`` tokens read
exactly.

Storage grows in blocks of ``BLOCK`` tokens up to ``max_tokens``.  If a
:class:`KVBudget` is given, every growth is charged to it (a windowed layer's shrink, and
:meth:`KVCache.free`, release), so the engine can bound total KV memory across sequences;
:meth:`KVCache.nbytes_at` is what a sequence of a given length holds (windowed layers
bounded), the engine's per-request KV cost.

Context shift (StreamingLLM style, as llama.cpp does it): :meth:`KVCache.shift`
keeps the first ``n_keep`` "anchor" tokens, drops the next ``n_discard`` and moves the
rest down, so positions stay compact (``0 .. n-1``).  Keys of a RoPE model were
rotated at their old positions; the architecture's ``shift_context`` re-rotates
the moved keys by ``-n_discard`` through :meth:`KVCache.update_keys` (rotations
compose additively, so this is exact up to rounding; for f16 and int8 storage the
keys are rotated in f32 and stored again, rounded to the storage type).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from modelc.errors import UsageError, WindowError
from modelc.runtime.backend import F32Array, KVArray
from modelc.runtime.kv_store import (
    GROUP,
    KVBudget,
    KVMode,
    KVShape,
    KVStore,
    dequantize_int8,
    quantize_int8,
)
from modelc.runtime.seq_state import SeqState

__all__ = [
    "BLOCK",
    "GROUP",
    "WINDOW_KEEP",
    "WINDOW_SLACK",
    "KVBudget",
    "KVCache",
    "KVMode",
    "KVShape",
    "dequantize_int8",
    "quantize_int8",
]

BLOCK = 256
WINDOW_SLACK = 256  # rows a windowed layer grows into between two moves (see reserve)
WINDOW_KEEP = 64  # rows it keeps before its window (rollbacks, prefix-cache blocks)


class KVCache:
    """Keys and values of one sequence, all layers. ``n`` tokens cached = next position.

    ``windows``: each layer's sliding window (0: global attention), as the architecture
    attends; ``None`` or all zeros keeps every position of every layer (``full`` storage).
    A windowed layer keeps at most ``window + window_keep + window_slack`` rows (see the
    module docstring), in every mode (int8 and mixed move their scales, and mixed its
    ring of exact rows, with the rows)."""

    def __init__(
        self,
        shape: KVShape,
        max_tokens: int,
        mode: KVMode | str = KVMode.F32,
        *,
        hot_window: int = 256,
        budget: KVBudget | None = None,
        windows: Sequence[int] | None = None,
        window_slack: int = WINDOW_SLACK,
        window_keep: int = WINDOW_KEEP,
    ) -> None:
        self.shape = shape
        self.mode = KVMode(mode)
        if max_tokens <= 0:
            raise UsageError(f"KV cache size must be positive, got {max_tokens}")
        if self.mode is KVMode.MIXED and hot_window <= 0:
            raise UsageError(f"mixed KV cache needs a positive hot window, got {hot_window}")
        wins = tuple(int(w) for w in windows) if windows else (0,) * shape.n_layer
        bad = len(wins) != shape.n_layer or any(w < 0 for w in wins)
        if bad or window_slack < 1 or window_keep < 0:
            raise UsageError(f"bad KV cache windows {wins} (slack {window_slack})")
        self.max_tokens = max_tokens
        self.hot_window = hot_window if self.mode is KVMode.MIXED else 0
        self.budget = budget
        self.windows = wins
        self.window_slack = window_slack
        self.window_keep = window_keep
        # the windows that bound storage: only where they save rows
        self.bounded = tuple(w if w + window_keep + window_slack < max_tokens else 0 for w in wins)
        self._windowed = any(self.bounded)
        self._charged = 0
        self.state: SeqState | None = None  # recurrent layers' state (the model sets it)
        self._empty()
        self._charge()

    def _empty(self) -> None:
        h, d, hot = self.shape.n_head_kv, self.shape.head_dim, self.hot_window
        self.n = 0
        self.capacity = 0  # rows of a global layer (positions 0 .. capacity-1)
        self._base = [0] * self.shape.n_layer  # position of storage row 0, per layer
        self._k = [KVStore(self.mode, h, d, hot) for _ in range(self.shape.n_layer)]
        dv = 0 if self.shape.shared_values else d  # shared: empty value stores
        self._v = [KVStore(self.mode, h, dv, hot) for _ in range(self.shape.n_layer)]
        # dequantization scratch for one layer's K and V (int8 / mixed): (capacity, h, d)
        self._scratch_k: F32Array = np.zeros((0, h, d), np.float32)
        self._scratch_v: F32Array = np.zeros((0, h, dv), np.float32)

    # -- windowed layers -------------------------------------------------------------
    def held_from(self, layer: int) -> int:
        """The first position layer ``layer`` still holds (storage row 0): 0 unless windowed."""
        return self._base[layer] if self.bounded[layer] else 0

    def rows(self, layer: int) -> int:
        """Rows layer ``layer`` has allocated (a windowed layer's stay near its window)."""
        return self._k[layer].rows

    def start(self, layer: int) -> int:
        """The storage row of position ``n`` in layer ``layer`` (what attention kernels take
        as the first new query's position: windows and causality are relative)."""
        return self.n - self.held_from(layer)

    def needed_from(self, layer: int, n: int) -> int:
        """The first position a query at position ``n`` sees in layer ``layer``."""
        w = self.bounded[layer]
        return max(0, n - w + 1) if w else 0

    def _check_held(self, n: int) -> None:
        """Raise :class:`WindowError` unless every layer holds what position ``n`` needs (only
        windowed layers can lack it)."""
        if not self._windowed:
            return
        for layer in range(self.shape.n_layer):
            if self.held_from(layer) > self.needed_from(layer, n):
                what = f"truncate a KV cache of {self.n} tokens to {n}"
                raise WindowError(
                    f"cannot {what}: layer {layer} (window {self.bounded[layer]}) holds positions "
                    f"from {self.held_from(layer)} only, position {n} needs "
                    f"{self.needed_from(layer, n)} on"
                )

    def _rows_for(self, layer: int, n_tokens: int, chunk: int) -> int:
        """Rows layer ``layer`` allocates for a sequence of ``n_tokens`` fed ``chunk`` at a time."""
        full = min(self.max_tokens, -(-n_tokens // BLOCK) * BLOCK)
        w = self.bounded[layer]
        return min(full, max(self._limit(w), w - 1 + self.window_keep + chunk)) if w else full

    def _limit(self, w: int) -> int:
        """Rows a layer of window ``w`` outgrows before it drops some."""
        return w + self.window_keep + self.window_slack

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

    def nbytes_at(self, n_tokens: int, chunk: int = WINDOW_SLACK) -> int:
        """What :attr:`nbytes` reaches for a sequence of ``n_tokens`` tokens fed at most
        ``chunk`` tokens a step (windowed layers stop growing; the engine's KV cost)."""
        sh, n_tokens = self.shape, max(0, n_tokens)
        per_row = sh.bytes_per_token(self.mode) // sh.n_layer
        total = sum(self._rows_for(li, n_tokens, chunk) for li in range(sh.n_layer)) * per_row
        slots = sh.n_head_kv * sh.head_dim
        if self.mode.quantized:  # scratch: the most rows a layer holds
            rows = max(self._rows_for(li, n_tokens, chunk) for li in range(sh.n_layer))
            total += sh.kinds * rows * slots * 4
        return total + sh.kinds * sh.n_layer * self.hot_window * slots * 4  # mixed: rings

    def _charge(self) -> None:
        new = self.nbytes
        if self.budget is not None and new > self._charged:
            self.budget.reserve(new - self._charged)
        elif self.budget is not None:
            self.budget.release(self._charged - new)
        self._charged = new

    def free(self) -> None:
        """Drop all storage (the cache is empty and unbudgeted after) and give its bytes back."""
        if self.budget is not None:
            self.budget.release(self._charged)
        self.budget = None
        self._charged = 0
        self._empty()
        self.state = None  # a recurrent state's memory goes too

    def reserve(self, n_tokens: int) -> None:
        """Make room for ``n_tokens`` cached tokens in total (grows in blocks).

        A windowed layer first drops the rows more than ``window_keep`` before what a query
        at position ``n`` sees, once it would outgrow ``window + window_keep +
        window_slack`` rows (one move to the front, every ``window_slack`` tokens or so; a
        chunk longer than the slack grows it for a while)."""
        if n_tokens > self.max_tokens:
            raise UsageError(
                f"sequence of {n_tokens} tokens exceeds the KV cache size {self.max_tokens}; "
                "shorten the prompt or shift the context"
            )
        if n_tokens <= self.capacity and not self._windowed:  # a decode step's usual case
            return
        plan: list[tuple[int, int, int]] = []  # (layer, new rows, new base)
        per_row = self.shape.bytes_per_token(self.mode) // self.shape.n_layer
        extra = 0
        cap = min(self.max_tokens, -(-n_tokens // BLOCK) * BLOCK)
        for li, w in enumerate(self.bounded):
            rows, base = self._k[li].rows, self._base[li]
            lo = max(base, self.n - w + 1 - self.window_keep)  # kept: the window and more
            over = w > 0 and lo > base and max(rows, n_tokens - base) > self._limit(w)
            if n_tokens - base <= rows and not over:
                continue
            new_rows = max(rows, cap)
            if w:
                base = lo if over else base
                new_rows = min(cap, max(self._limit(w), n_tokens - base))
                new_rows = new_rows if over else max(new_rows, rows)
            plan.append((li, new_rows, base))
            extra += max(0, new_rows - rows) * per_row
        h, d = self.shape.n_head_kv, self.shape.head_dim
        planned = {li: rows for li, rows, _ in plan}
        most = max(planned.get(li, st.rows) for li, st in enumerate(self._k))  # a layer's rows
        scratch = most if self.mode.quantized and most > len(self._scratch_k) else 0
        extra += self.shape.kinds * max(0, scratch - len(self._scratch_k)) * h * d * 4
        if self.budget is not None and extra > self.budget.free:
            self.budget.reserve(extra)  # raises CapacityError before anything is allocated
        for li, new_rows, base in plan:
            src = base - self._base[li]
            keep = max(0, min(self.n - base, new_rows)) if src else None
            self._k[li].resize(new_rows, src, keep)
            self._v[li].resize(new_rows, src, keep)
            self._base[li] = base
        if scratch:
            self._scratch_k = np.zeros((scratch, h, d), np.float32)
            self._scratch_v = np.zeros((scratch, h, self._v[0].d), np.float32)
        self.capacity = max(s.rows for s in self._k)
        if plan or scratch:
            self._charge()

    def fill(self, n: int, get: Callable[[int, int], tuple[KVArray, KVArray]]) -> None:
        """Load positions 0 .. n-1 into this empty cache (a prefix-cache hit): ``get(layer,
        first)`` returns that layer's keys and values of positions ``first .. n-1``, with
        ``first`` = :meth:`needed_from` (0, or what a windowed layer's next query sees)."""
        if self.n:
            raise UsageError("only an empty KV cache can be filled")
        for li in range(self.shape.n_layer):
            self._base[li] = self.needed_from(li, n)  # no rows are held: any base will do
        self.reserve(n)
        for li in range(self.shape.n_layer):
            k, v = get(li, self.held_from(li))
            self.write(li, self.held_from(li), k, v)
        self.advance(n)

    def read_blocks(self, n: int, start: int, bt: int) -> KVArray | None:
        """Positions ``start`` .. ``n`` - 1 (whole ``bt``-token blocks) of every layer in one
        new host array ``(blocks, kinds, n_layer, bt, n_head_kv, head_dim)``: each block's
        keys and values contiguous views, kept by the prefix cache uncopied; None where a
        windowed layer no longer holds ``start``."""
        s, nb = self.shape, (n - start) // bt
        if any(self.held_from(li) > start for li in range(s.n_layer)):
            return None
        out = np.empty((nb, s.kinds, s.n_layer, bt, s.n_head_kv, s.head_dim), self.dtype)
        for li, kv in enumerate(self.read_all(nb * bt + start, start)):
            for kind in range(s.kinds):
                out[:, kind, li] = kv[kind].reshape(nb, bt, s.n_head_kv, s.head_dim)
        return out

    def read_all(self, n: int, start: int = 0) -> Iterator[tuple[KVArray, KVArray]]:
        """:meth:`read` of every layer in turn, positions ``max(start, held_from(layer))``
        .. ``n`` - 1 (none where a windowed layer holds none); a pair is good until the next
        is taken (an int8 cache's scratch; a device cache: one copy's views)."""
        s = self.shape
        for li in range(s.n_layer):
            h0 = self.held_from(li)
            if n <= max(start, h0):
                z = np.zeros((0, s.n_head_kv, s.head_dim), self.dtype)
                yield z, z
            else:
                k, v = self.read(li, n)
                yield k[max(start - h0, 0) :], v[max(start - h0, 0) :]

    # -- the forward pass ------------------------------------------------------------
    def write(self, layer: int, pos: int, k: KVArray, v: KVArray) -> None:
        """k, v (n, n_head_kv, head_dim) at positions pos .. pos+n-1 (room reserved; for a
        windowed layer, ``pos`` at or after :meth:`held_from`).

        f32, or f16 values read back from a cache (the prefix cache stores what
        :meth:`read` returns); stored rounded to the cache's mode."""
        row = pos - self.held_from(layer)
        assert row >= 0 and row + len(k) <= self._k[layer].rows
        self._k[layer].write(row, k)
        if not self.shape.shared_values:
            self._v[layer].write(row, v)

    @property
    def dtype(self) -> np.dtype[Any]:
        """What :meth:`read` returns: float16 for an f16 cache, float32 otherwise."""
        return np.dtype(np.float16 if self.mode is KVMode.F16 else np.float32)

    def storage(self, layer: int) -> tuple[KVArray, KVArray] | None:
        """Layer ``layer``'s K and V storage itself, (rows, n_head_kv, head_dim) each, for
        a backend to write new rows into and read in place (``attention_append``, with
        :meth:`start` as the first new row); ``None`` for the quantized modes, whose rows
        go through :meth:`write` and :meth:`read`.  With shared values, the keys twice."""
        k = self._k[layer]
        v = k if self.shape.shared_values else self._v[layer]
        if self.mode is KVMode.F32:
            return k.f32, v.f32
        if self.mode is KVMode.F16:
            return k.f16, v.f16
        return None

    def read(self, layer: int, n: int) -> tuple[KVArray, KVArray]:
        """Keys and values of positions ``held_from(layer)`` .. n-1 (0 .. n-1 for a global
        layer), (rows, n_head_kv, head_dim) each.

        Views of the storage for f32 and f16 caches (float16 for f16: no copy, the
        attention kernels read it as is); for int8 and mixed, f32 values dequantized
        into a scratch buffer that the next ``read`` of any layer overwrites.  With
        shared values, the keys twice."""
        rows = n - self.held_from(layer)
        if self.shape.shared_values:
            k = self._k[layer].read(rows, self._scratch_k)
            return k, k
        return (
            self._k[layer].read(rows, self._scratch_k),
            self._v[layer].read(rows, self._scratch_v),
        )

    def advance(self, n_new: int) -> None:
        """Commit ``n_new`` tokens written by the forward pass."""
        self.n += n_new
        if self.state is not None:
            self.state.advance(self.n)

    def truncate(self, n: int) -> None:
        """Forget tokens from position ``n`` on (speculation rollback, prefix reuse).

        A windowed layer drops rows only in :meth:`reserve`, and only those more than
        ``window_keep`` before what the step's first query sees, so rolling back to any
        position reached since the last ``reserve`` (a step's drafts, which is all the
        engine does) always works; going back further than a windowed layer still holds
        raises :class:`WindowError` and changes nothing."""
        if not 0 <= n <= self.n:
            raise UsageError(f"cannot truncate a KV cache of {self.n} tokens to {n}")
        self._check_held(n)
        if self.state is not None:  # a checkpoint of the last step, or UsageError
            self.state.truncate(n)
        self._forget_from(n)
        self.n = n

    def _forget_from(self, n: int) -> None:
        """The storage's part of :meth:`truncate` (rows from ``n`` on)."""
        for st in (*self._k, *self._v):
            st.forget_from(n)

    # -- context shift ---------------------------------------------------------------
    def max_discard(self, n_keep: int) -> int:
        """The most tokens after ``n_keep`` anchors :meth:`shift` can drop: all of them
        unless a windowed layer would then need anchors it no longer holds; none with a
        recurrent state (it cannot forget tokens)."""
        most = 0 if self.state is not None else self.n - n_keep
        for li, w in enumerate(self.bounded):
            held = min(n_keep, self._base[li])  # anchors 0 .. held-1 are gone
            if w and held > 0:  # then the window after the shift must not reach them
                most = min(most, self.n - w + 1 - held)
        return max(0, most)

    def shift(self, n_keep: int, n_discard: int) -> None:
        """Drop tokens ``n_keep .. n_keep+n_discard-1``; later tokens move down by n_discard.

        Raises :class:`WindowError` (changing nothing) past :meth:`max_discard`."""
        if n_keep < 0 or n_discard <= 0 or n_keep + n_discard > self.n:
            raise UsageError(
                f"bad context shift: keep {n_keep}, discard {n_discard} of {self.n} tokens"
            )
        if n_discard > self.max_discard(n_keep):
            raise WindowError(
                f"cannot shift out {n_discard} tokens after {n_keep}: a windowed layer would "
                f"need anchors it dropped (at most {self.max_discard(n_keep)})"
            )
        src, dst = n_keep + n_discard, n_keep
        for li in range(self.shape.n_layer):
            base = self.held_from(li)
            if base <= n_keep:  # anchors held from base on: the usual move
                move = (src - base, dst - base, self.n - src)
            else:  # no anchor held: the kept tail goes to row 0
                first = max(base, src)
                move = (first - base, 0, self.n - first)
                self._base[li] = first - n_discard
            for s in (self._k[li], self._v[li]):
                s.move(*move)
        self.n -= n_discard

    def update_keys(self, start: int, fn: Callable[[F32Array], None]) -> None:
        """Apply ``fn`` in place to the keys of positions start .. n-1, every layer (a
        windowed layer's held ones only: ``fn`` must act on each row alike)."""
        for li, st in enumerate(self._k):
            first = max(start, self.held_from(li)) - self.held_from(li)
            rows = self.n - self.held_from(li)
            if st.mode is KVMode.F32:
                fn(st.f32[first:rows])
                continue
            x = st.read(rows, self._scratch_k)[first:].astype(np.float32)  # a copy
            fn(x)
            st.write(first, x)


class DeviceKVCache(KVCache):
    """What a sequence's KV cache in a device's memory (CUDA, WebGPU) shares: f16 or f32
    only, every layer keeps every position (a sliding window only masks), grown in
    ``BLOCK``-token steps charged to the budget as a host cache of the same mode, the
    model's forward reading and writing the storage itself (``storage`` is None; ``write``
    / ``read`` copy through the host for the prefix cache and context shifts).  A subclass
    keeps its device handle before calling this ``__init__`` (``_empty`` runs in it);
    ``where``: its refusal's words for the device (``with --device cuda; use f16 or f32``)."""

    def __init__(
        self,
        shape: KVShape,
        max_tokens: int,
        mode: KVMode | str,
        *,
        budget: KVBudget | None,
        where: str,
    ) -> None:
        if KVMode(mode) not in (KVMode.F16, KVMode.F32):
            raise UsageError(f"--kv-cache {KVMode(mode).value} is not supported {where}")
        super().__init__(shape, max_tokens, mode, budget=budget)

    def _grown(self, n_tokens: int) -> int:
        """What ``reserve(n_tokens)`` grows to (0: held), its bytes reserved (or CapacityError)."""
        if n_tokens > self.max_tokens:
            raise UsageError(
                f"sequence of {n_tokens} tokens exceeds the KV cache size {self.max_tokens}; "
                "shorten the prompt or shift the context"
            )
        if n_tokens <= self.capacity:
            return 0
        cap = min(self.max_tokens, -(-n_tokens // BLOCK) * BLOCK)
        extra = (cap - self.capacity) * self.shape.bytes_per_token(self.mode)
        if self.budget is not None and extra > self.budget.free:
            self.budget.reserve(extra)
        return cap

    def storage(self, layer: int) -> tuple[KVArray, KVArray] | None:
        return None  # device memory: the model writes and reads it itself

    def _forget_from(self, n: int) -> None:
        pass  # the rows past n stay until overwritten; n is the length

    def _check_shift(self, n_keep: int, n_discard: int) -> None:
        if n_keep < 0 or n_discard <= 0 or n_keep + n_discard > self.n:
            raise UsageError(
                f"bad context shift: keep {n_keep}, discard {n_discard} of {self.n} tokens"
            )
