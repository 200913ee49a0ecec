"""LongRoPE (Phi-3 / Phi-3.5): short factors within the original context, long ones past it.

``rope_scaling.type`` ``longrope`` (or the older ``su``): the frequencies are divided by
``short_factor`` while a sequence is within ``original_max_position_embeddings`` and by
``long_factor`` past it, chosen per step from the sequence's length as transformers' RoPE
does; cos and sin are multiplied by ``sqrt(1 + ln(factor) / ln(original))``.  Where a
sequence crosses the original length it is recomputed from its first token with the long
factors, as transformers' ``generate`` does (each cache's token ids are kept for that; a
cache filled from elsewhere keeps its short-factor keys).  llama.cpp instead picks once,
from the context size.  The factors come from the family (``config.json``, or GGUF's
``rope_factors_*`` tensors).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelc.families.contract import longrope_inv_freq
from modelc.formats.ir import HParams
from modelc.runtime.backend import Backend, F32Array
from modelc.runtime.kv_cache import KVCache
from modelc.runtime.model import SeqChunk

Angles = tuple[F32Array, F32Array]


def long_rope_after(hp: HParams) -> int:
    """Past how many positions LongRoPE's long factors take over (0: they never do)."""
    rs = hp.rope_scaling
    if rs.type == "longrope" and rs.long_factor and rs.long_factor != rs.short_factor:
        return rs.original_max_position
    return 0


def short_factors_ctx(n_ctx: int, after: int) -> int:
    """The context a GPU's forward (CUDA's, WebGPU's) runs a model in: with LongRoPE long
    factors past ``after`` (:func:`long_rope_after`), no more than that, where its short
    factors hold, as llama.cpp does at that context size (those forwards keep no token
    ids to restart a sequence with the long factors)."""
    return min(n_ctx, after) if after else n_ctx


class LongRope:
    """The long factors of one model and the token ids of every cache that may cross."""

    def __init__(self, hp: HParams, rot_dim: int, after: int) -> None:
        self.after = after
        self.inv_freq = longrope_inv_freq(rot_dim, hp.rope_theta, hp.rope_scaling)
        self.history: weakref.WeakKeyDictionary[KVCache, list[int]] = weakref.WeakKeyDictionary()

    def restart_crossing(self, batch: Sequence[SeqChunk]) -> list[SeqChunk]:
        """The batch with every sequence that crosses the original length this step
        restarted from its first token (when its ids are known)."""
        return [self._restart(c) for c in batch]

    def _restart(self, c: SeqChunk) -> SeqChunk:
        n0 = c.cache.n
        if not 0 < n0 <= self.after < n0 + len(c.tokens):
            return c
        seen = self.history.get(c.cache)
        if seen is None or len(seen) < n0:
            return c  # ids unknown: the cached keys keep the short factors
        prefix = seen[:n0]
        c.cache.shift(0, n0)  # empty; refilled with the long factors
        rows = None if c.logit_rows is None else tuple(r + n0 for r in c.logit_rows)
        return SeqChunk(c.cache, [*prefix, *(int(t) for t in c.tokens)], rows)

    def remember(self, batch: Sequence[SeqChunk], starts: Sequence[int]) -> None:
        """Record the step's token ids of every cache whose earlier ids are known."""
        for c, n0 in zip(batch, starts, strict=True):
            seen = self.history.setdefault(c.cache, [])
            del seen[n0:]  # a cache rolled back (speculation) keeps its prefix
            if len(seen) == n0:
                seen.extend(int(t) for t in c.tokens)
            else:  # filled from elsewhere (a prefix cache): ids unknown, stop tracking
                del self.history[c.cache]

    def angles(
        self, be: Backend, batch: Sequence[SeqChunk], pos: np.ndarray[Any, Any], short: Angles
    ) -> Angles:
        """Each row's cos and sin: the long factors' for sequences past the original length."""
        longer = [c.cache.n + len(c.tokens) > self.after for c in batch]
        if not any(longer):
            return short
        long = be.rope_angles(pos, self.inv_freq)
        if all(longer):
            return long
        rows = np.repeat(np.asarray(longer), [len(c.tokens) for c in batch])[:, None]
        cos = np.where(rows, long[0], short[0]).astype(np.float32)
        sin = np.where(rows, long[1], short[1]).astype(np.float32)
        return cos, sin
