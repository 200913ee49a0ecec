"""Per-sequence recurrent state: the memory of a layer that keeps a fixed-size state in
place of keys and values (Qwen3.5's Gated DeltaNet; later Mamba-2 and short convolutions).

A layer declares what it keeps as named shapes (:data:`StateShapes`: layer ->
``{"conv": (width-1, channels), "ssm": (heads, d_k, d_v)}``); the model makes one
:class:`SeqState` per sequence beside its KV cache (``KVCache.state``), zeros at position 0,
freed with the cache.  A batched step hands each sequence's rows its own state, so a
sequence reads and writes only its own memory.

A state, unlike a KV cache, cannot forget its last tokens: it holds the sum of them all.
So a step that asks for the logits of several of its tokens (a speculative draft being
verified) keeps **checkpoints**, the state after each of its tokens but the last
(:meth:`SeqState.keep`); :meth:`SeqState.truncate` to one of those positions restores it
(what llama.cpp's recurrent memory does with its per-sequence cells).  Going back
anywhere else raises :class:`~modelc.errors.UsageError`: the engine never does (a
context shift is refused).

With ``boundary`` set (the prefix cache's block size) a state also keeps its **last
boundary checkpoint**, the state at the last position that is a multiple of
``boundary`` (:meth:`SeqState.mark`, :meth:`SeqState.checkpoint`): the prefix cache
stores it with the block ending there, and a sequence whose prompt starts with those
blocks starts from it (:meth:`SeqState.restore`), as llama.cpp's server keeps state
checkpoints for its prompt cache.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from modelc.errors import UsageError
from modelc.runtime.backend import F32Array

__all__ = ["SeqState", "StateShapes"]

# per recurrent layer: the named arrays it keeps and their shapes
StateShapes = Mapping[int, Mapping[str, tuple[int, ...]]]


class SeqState:
    """One sequence's recurrent state, every recurrent layer; ``n``: tokens it holds."""

    def __init__(self, shapes: StateShapes) -> None:
        self.shapes = shapes
        self.first = min(shapes) if shapes else 0  # the first recurrent layer
        self.n = 0
        self._arrays: dict[int, dict[str, F32Array]] = {}
        self._snaps: dict[int, dict[int, dict[str, F32Array]]] = {}  # position -> layer -> ...
        self.boundary = 0  # keep the state at multiples of this many tokens (0: none)
        self._marks: dict[int, tuple[int, dict[str, F32Array]]] = {}  # layer -> (pos, ...)
        self.reset()

    def reset(self) -> None:
        """Back to position 0 (zeros)."""
        self._arrays = {
            li: {k: np.zeros(s, np.float32) for k, s in named.items()}
            for li, named in self.shapes.items()
        }
        self._snaps = {}
        self._marks = {}
        self.n = 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for named in self._arrays.values() for a in named.values())

    def layer(self, li: int) -> dict[str, F32Array]:
        """Layer ``li``'s arrays, updated in place by the layer."""
        return self._arrays[li]

    def begin(self, li: int, n0: int) -> None:
        """A layer starts a step at position ``n0``: the first recurrent layer drops the
        previous step's checkpoints."""
        if li == self.first:
            self._snaps = {}
        self.n = n0

    def keep(self, li: int, pos: int, arrays: Mapping[str, F32Array]) -> None:
        """Checkpoint of layer ``li`` after ``pos`` tokens (copies of ``arrays``)."""
        self._snaps.setdefault(pos, {})[li] = {k: np.array(a) for k, a in arrays.items()}

    def mark(self, li: int, pos: int, arrays: Mapping[str, F32Array]) -> None:
        """Boundary checkpoint of layer ``li`` after ``pos`` tokens (copies)."""
        self._marks[li] = (pos, {k: np.array(a) for k, a in arrays.items()})

    def saves(self, pos: int, draft: bool) -> bool:
        """Whether the state after ``pos`` tokens is checkpointed: a draft's token (not the
        step's last), or a boundary."""
        return draft or bool(self.boundary and pos % self.boundary == 0)

    def save(self, li: int, pos: int, draft: bool, arrays: Mapping[str, F32Array]) -> None:
        """The checkpoints :meth:`saves` asks for, of layer ``li`` after ``pos`` tokens."""
        if draft:
            self.keep(li, pos, arrays)
        if self.boundary and pos % self.boundary == 0:
            self.mark(li, pos, arrays)

    def save_points(self, m: int, draft: bool) -> list[int]:
        """The counts ``e`` (1 .. m) of a step's tokens after which the state is
        checkpointed (:meth:`saves` of position ``n + e``), ascending; ``draft``: the step
        verifies a draft (every token but the last)."""
        points = set(range(1, m)) if draft else set()
        if self.boundary:
            points.update(range(self.boundary - self.n % self.boundary, m + 1, self.boundary))
        return sorted(points)

    def scan(
        self,
        li: int,
        m: int,
        draft: bool,
        conv_x: F32Array,
        ssm: F32Array | None,
        step: Callable[[int, int], object],
    ) -> None:
        """Layer ``li``'s ``m`` tokens of a step through ``step(t0, t1)`` (tokens t0 ..
        t1 - 1 into the layer's state), in pieces that end where :meth:`save_points` asks
        for a checkpoint, saved there: the convolution's last inputs, rows e .. of
        ``conv_x`` (w-1+m, channels), and ``ssm`` (none for a convolution alone)."""
        keep, t0 = len(conv_x) - m, 0
        for e in self.save_points(m, draft):
            if e > t0:
                step(t0, e)
            arrays = {"conv": conv_x[e : e + keep]}
            if ssm is not None:
                arrays["ssm"] = ssm
            self.save(li, self.n + e, draft and e < m, arrays)
            t0 = e
        if t0 < m:
            step(t0, m)

    def checkpoint(self) -> tuple[int, dict[int, dict[str, F32Array]]] | None:
        """The last boundary checkpoint (position, layer -> arrays), if every layer has it."""
        pos = {p for p, _ in self._marks.values()}
        if set(self._marks) != set(self._arrays) or len(pos) != 1:
            return None
        return pos.pop(), {li: a for li, (_, a) in self._marks.items()}

    def restore(self, n: int, arrays: Mapping[int, Mapping[str, F32Array]]) -> None:
        """Start from a checkpoint at position ``n`` (a prefix-cache hit)."""
        for li, named in arrays.items():
            for k, a in named.items():
                self._arrays[li][k][...] = a
        self._marks = {li: (n, {k: np.array(a) for k, a in d.items()}) for li, d in arrays.items()}
        self._snaps = {}
        self.n = n

    def advance(self, n: int) -> None:
        self.n = n

    def truncate(self, n: int) -> None:
        """Back to position ``n``: now, or a checkpoint of the last step."""
        # a rejected draft's boundary
        self._marks = {li: m for li, m in self._marks.items() if m[0] <= n}
        if n == self.n:
            return
        snap = self._snaps.get(n)
        if snap is None or set(snap) != set(self._arrays):
            raise UsageError(
                f"a recurrent state at position {self.n} cannot go back to {n}: only to "
                "a position of its last step, whose checkpoints it keeps"
            )
        for li, named in snap.items():
            for k, a in named.items():
                self._arrays[li][k][...] = a
        self._snaps = {}
        self.n = n
