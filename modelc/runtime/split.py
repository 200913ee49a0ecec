"""A model split between devices by layers (llama.cpp's ``--n-gpu-layers``): the first
layers on one backend (the GPU), the rest on another (the CPU kernels), one step flowing
through both.

Each part is a :class:`ModelPart`: layers ``first .. stop-1`` of the one model
description (:meth:`~modelc.runtime.arch.decoder.Decoder.keep_layers`, which
:class:`~modelc.runtime.backends.cuda_llama.CudaLlama` reads too), with caches of its own
layers; one part holds the output norm and head (its ``head``).  :class:`SplitLM` is the
:class:`~modelc.runtime.model.CausalLM` the engine drives: a step runs the first part from
the token ids, hands its hidden state ``(rows, d)`` to the next, and the last part's
logits are the step's, or, where the head is another part's (the GPU's, in
``--n-gpu-layers``), the last part gives the hidden state of the rows whose logits are
wanted and that part computes them (:meth:`ModelPart.head_logits`): GPU layers, CPU
layers, GPU head.  A sequence's cache is a :class:`SplitKVCache`: one cache per part,
seen by the engine and the prefix cache as one cache of every layer (layer ``i`` is layer
``i - first`` of the part that runs it), so lengths, truncation, context shifts and
prefix-cache blocks stay those of the whole model.  In CI the numpy backend stands in for
the GPU.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from modelc.errors import UnsupportedError, UsageError, WindowError
from modelc.formats.ir import HParams, ModelIR
from modelc.runtime.arch.decoder import Decoder
from modelc.runtime.backend import Backend, F32Array, KVArray
from modelc.runtime.kv_cache import WINDOW_SLACK, KVBudget, KVCache, KVMode, KVShape
from modelc.runtime.model import CausalLM, SeqChunk


@runtime_checkable
class ModelPart(Protocol):
    """Layers ``first .. stop-1`` of a causal LM on one backend."""

    architecture: str
    hparams: HParams
    n_vocab: int
    n_ctx: int
    first: int
    stop: int
    head: bool  # it computes the logits (head_logits): one part of a split

    def new_cache(
        self,
        mode: KVMode | str = KVMode.F32,
        *,
        max_tokens: int | None = None,
        hot_window: int = 256,
        budget: KVBudget | None = None,
        full: bool = False,
    ) -> KVCache:
        """An empty cache of this part's layers."""
        ...

    def forward_part(self, batch: Sequence[SeqChunk], hidden: F32Array | None) -> F32Array:
        """One step from the token ids (``first`` 0) or the hidden state (rows, d); the
        hidden state after ``stop - 1`` (rows, d), or where the model ends the logits
        (``head``) or else the hidden state of the rows whose logits are wanted (r, d)."""
        ...

    def head_logits(self, hidden: F32Array) -> F32Array:
        """The logits (r, vocab) of the hidden state (r, d) after the last layer (``head``)."""
        ...

    def shift_context(self, cache: KVCache, n_keep: int, n_discard: int) -> None:
        """As :meth:`~modelc.runtime.model.LanguageModel.shift_context`, on its layers."""
        ...


class SplitKVCache(KVCache):
    """One sequence's cache of every layer, held as one cache per part (in order)."""

    def __init__(self, parts: Sequence[KVCache]) -> None:  # no super(): the parts hold it all
        self.parts = tuple(parts)
        first = self.parts[0]
        if (
            len({(p.mode, p.max_tokens, p.shape.n_head_kv, p.shape.head_dim) for p in self.parts})
            > 1
        ):
            raise UsageError("the parts of a split cache differ in mode, length or heads")
        self.shape = KVShape(
            sum(p.shape.n_layer for p in self.parts),
            first.shape.n_head_kv,
            first.shape.head_dim,
            first.shape.shared_values,
        )
        self.mode, self.max_tokens, self.hot_window = first.mode, first.max_tokens, first.hot_window
        self.window_keep, self.budget, self.state = first.window_keep, first.budget, None
        self.bounded = tuple(w for p in self.parts for w in p.bounded)
        self._windowed = any(self.bounded)
        # layer -> (its part, its layer there)
        self._at = [(p, li) for p in self.parts for li in range(p.shape.n_layer)]

    @property  # type: ignore[override]
    def n(self) -> int:
        return self.parts[0].n

    @n.setter
    def n(self, value: int) -> None:
        for p in self.parts:
            p.n = value

    @property  # type: ignore[override]
    def capacity(self) -> int:
        return min(p.capacity for p in self.parts)

    @capacity.setter
    def capacity(self, value: int) -> None:
        raise AttributeError("a split cache's capacity is its parts'")

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def nbytes_at(self, n_tokens: int, chunk: int = WINDOW_SLACK) -> int:
        return sum(p.nbytes_at(n_tokens, chunk) for p in self.parts)

    # -- per layer: the part that holds it ---------------------------------------------
    def held_from(self, layer: int) -> int:
        part, li = self._at[layer]
        return part.held_from(li)

    def rows(self, layer: int) -> int:
        part, li = self._at[layer]
        return part.rows(li)

    def needed_from(self, layer: int, n: int) -> int:
        part, li = self._at[layer]
        return part.needed_from(li, n)

    def storage(self, layer: int) -> tuple[KVArray, KVArray] | None:
        part, li = self._at[layer]
        return part.storage(li)

    def write(self, layer: int, pos: int, k: KVArray, v: KVArray) -> None:
        part, li = self._at[layer]
        part.write(li, pos, k, v)

    def read(self, layer: int, n: int) -> tuple[KVArray, KVArray]:
        part, li = self._at[layer]
        return part.read(li, n)

    # -- the whole sequence: every part ------------------------------------------------
    def free(self) -> None:
        for p in self.parts:
            p.free()
        self.budget = None

    def reserve(self, n_tokens: int) -> None:
        for p in self.parts:
            p.reserve(n_tokens)

    def advance(self, n_new: int) -> None:
        for p in self.parts:
            p.advance(n_new)

    def fill(self, n: int, get: Callable[[int, int], tuple[KVArray, KVArray]]) -> None:
        def shifted(offset: int) -> Callable[[int, int], tuple[KVArray, KVArray]]:
            return lambda li, first: get(offset + li, first)

        offset = 0
        for p in self.parts:
            p.fill(n, shifted(offset))
            offset += p.shape.n_layer

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.n:
            raise UsageError(f"cannot truncate a KV cache of {self.n} tokens to {n}")
        for p in self.parts:  # every part checked before any changes
            p._check_held(n)
        for p in self.parts:
            p.truncate(n)

    def max_discard(self, n_keep: int) -> int:
        return min(p.max_discard(n_keep) for p in self.parts)

    def check_shift(self, n_keep: int, n_discard: int) -> None:
        """Raise what :meth:`shift` would before any part changes."""
        if n_keep < 0 or n_discard <= 0 or n_keep + n_discard > self.n:
            raise UsageError(
                f"bad context shift: keep {n_keep}, discard {n_discard} of {self.n} tokens"
            )
        if n_discard > self.max_discard(n_keep):
            raise WindowError(
                f"cannot shift out {n_discard} tokens after {n_keep}: a windowed layer would "
                f"need anchors it dropped (at most {self.max_discard(n_keep)})"
            )

    def shift(self, n_keep: int, n_discard: int) -> None:
        self.check_shift(n_keep, n_discard)
        for p in self.parts:
            p.shift(n_keep, n_discard)

    def update_keys(self, start: int, fn: Callable[[F32Array], None]) -> None:
        for p in self.parts:
            p.update_keys(start, fn)


class SplitLM(CausalLM):
    """A causal LM run by its parts in turn (the first from layer 0), each part's hidden
    state the next one's input, then the logits by the part with the head."""

    def __init__(self, parts: Sequence[ModelPart]) -> None:
        self.parts = tuple(parts)
        edges = [(p.first, p.stop) for p in self.parts]
        ends = (edges[0][0], edges[-1][1]) == (0, self.parts[-1].hparams.n_layer)
        if not ends or any(a[1] != b[0] for a, b in itertools.pairwise(edges)):
            raise UsageError(f"the parts of a split model do not chain: layers {edges}")
        heads = [p for p in self.parts if p.head]
        if len(heads) != 1:
            raise UsageError(f"a split model needs one part with the head, not {len(heads)}")
        self.head = head = heads[0]
        self.architecture, self.hparams, self.n_vocab = (
            head.architecture,
            head.hparams,
            head.n_vocab,
        )
        self.n_ctx = min(p.n_ctx for p in self.parts)
        self.kv_shape = self.new_cache(KVMode.F32, max_tokens=1).shape  # every layer's

    @property
    def n_layers(self) -> tuple[int, ...]:
        """The layers each part runs."""
        return tuple(p.stop - p.first for p in self.parts)

    def new_cache(
        self,
        mode: KVMode | str = KVMode.F32,
        *,
        max_tokens: int | None = None,
        hot_window: int = 256,
        budget: KVBudget | None = None,
        full: bool = False,
    ) -> KVCache:
        n = min(max_tokens or self.n_ctx, self.n_ctx)
        return SplitKVCache(
            [
                p.new_cache(mode, max_tokens=n, hot_window=hot_window, budget=budget, full=full)
                for p in self.parts
            ]
        )

    def forward(self, batch: Sequence[SeqChunk]) -> F32Array:
        """One step through every part, then the head where it is not the last part's;
        room is made in every part's cache first, so a step that does not fit changes no
        cache."""
        caches = [_split(c.cache) for c in batch]
        for c, cache in zip(batch, caches, strict=True):
            cache.reserve(cache.n + len(c.tokens))
        hidden: F32Array | None = None
        for i, part in enumerate(self.parts):
            chunks = [
                SeqChunk(cache.parts[i], c.tokens, c.logit_rows)
                for c, cache in zip(batch, caches, strict=True)
            ]
            hidden = part.forward_part(chunks, hidden)
        assert hidden is not None
        if self.head is not self.parts[-1]:  # the wanted rows' hidden state (r, d)
            hidden = self.head.head_logits(hidden)
        return hidden

    def shift_context(self, cache: KVCache, n_keep: int, n_discard: int) -> None:
        """Every part shifts and re-rotates its own layers."""
        split = _split(cache)
        split.check_shift(n_keep, n_discard)
        for part, pc in zip(self.parts, split.parts, strict=True):
            part.shift_context(pc, n_keep, n_discard)


def _split(cache: KVCache) -> SplitKVCache:
    if not isinstance(cache, SplitKVCache):
        raise UnsupportedError("a split model needs caches made by its own new_cache")
    return cache


def split_decoder(
    ir: ModelIR, n_first: int, first: Backend, rest: Backend, *, head_first: bool = False
) -> SplitLM:
    """``ir``'s first ``n_first`` layers on ``first``, the others on ``rest`` (the numpy
    backend standing in for a GPU, in CI); the output head with the last layer, or with
    ``head_first`` on ``first``."""
    a, b = Decoder(ir, first), Decoder(ir, rest)
    a.keep_layers(0, n_first, head=head_first)
    b.keep_layers(n_first, len(b.blocks), head=not head_first)
    return SplitLM([a, b])
