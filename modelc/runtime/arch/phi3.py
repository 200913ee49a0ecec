"""Phi-3 / Phi-3.5 (dense): the LLaMA forward with fused QKV and gate-up tensors, NeoX RoPE
and LongRoPE.

Tensors as llama.cpp's ``convert_hf_to_gguf.py`` writes them for ``phi3``: HF's
``self_attn.qkv_proj`` is ``blk.{i}.attn_qkv`` (Q rows, then K, then V) and
``mlp.gate_up_proj`` is ``blk.{i}.ffn_up`` with ``2 * n_ff`` rows (gate, then up); nothing
is permuted (llama.cpp runs phi3 with NeoX RoPE).  The runtime splits the fused matrices
into row views (no copy, quantized or not), so the LLaMA forward runs them unchanged.

LongRoPE (``rope_scaling.type`` ``longrope`` or the older ``su``): the frequencies are
divided by ``short_factor`` while a sequence is within ``original_max_position_embeddings``
and by ``long_factor`` past it, chosen per step from the sequence's length as
transformers' RoPE does; cos and sin are multiplied by ``sqrt(1 + ln(factor) /
ln(original))``.  Where a sequence crosses the original length it is recomputed from its
first token with the long factors, as transformers' ``generate`` does (the model keeps
each cache's token ids for that; a cache filled from elsewhere keeps its short-factor
keys).  llama.cpp instead picks once, from the context size.  The factors come from
:mod:`modelc.families.phi3` (``config.json``, or GGUF's ``rope_factors_*`` tensors).
``sliding_window`` is honoured as transformers does (llama.cpp turns Phi's window off).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelc.errors import UnsupportedError
from modelc.families.contract import longrope_inv_freq
from modelc.formats.ir import HParams, ModelIR
from modelc.runtime.arch.llama import Block, Llama, _opt
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.kv_cache import KVCache
from modelc.runtime.model import SeqChunk, TensorSource


def _rows(w: Weight, start: int, stop: int) -> Weight:
    """Rows ``start:stop`` of ``w`` as a Weight sharing its memory (rows are independent
    in every dtype, quantized blocks included)."""
    return Weight(w.dtype, (stop - start, w.shape[1]), w.data[start:stop])


def long_rope_after(hp: HParams) -> int:
    """Past how many positions LongRoPE's long factors take over (0: they never do)."""
    rs = hp.rope_scaling
    if rs.type == "longrope" and rs.long_factor and rs.long_factor != rs.short_factor:
        return rs.original_max_position
    return 0


class Phi3(Llama):
    architecture = "phi3"

    def __init__(self, ir: ModelIR, backend: Backend) -> None:
        super().__init__(ir, backend)
        rs = ir.hparams.rope_scaling
        # LongRoPE: steps whose sequence is longer use long_inv_freq
        self.long_after = long_rope_after(ir.hparams)
        if self.long_after:
            self.long_inv_freq = longrope_inv_freq(self.head_dim, ir.hparams.rope_theta, rs)
        # each cache's token ids, to recompute a sequence with the long factors
        self.history: weakref.WeakKeyDictionary[KVCache, list[int]] = weakref.WeakKeyDictionary()

    def forward(self, batch: Sequence[SeqChunk]) -> F32Array:
        """The LLaMA forward; with LongRoPE, a sequence whose step crosses the original
        context is recomputed from its first token with the long factors, as transformers'
        ``generate`` does, when its token ids are known (every token went through here)."""
        if not self.long_after:
            return super().forward(batch)
        batch = [self._restart_if_crossing(c) for c in batch]
        starts = [c.cache.n for c in batch]
        logits = super().forward(batch)
        for c, n0 in zip(batch, starts, strict=True):
            seen = self.history.setdefault(c.cache, [])
            del seen[n0:]  # a cache rolled back (speculation) keeps its prefix
            if len(seen) == n0:
                seen.extend(int(t) for t in c.tokens)
            else:  # filled from elsewhere (a prefix cache): ids unknown, stop tracking
                del self.history[c.cache]
        return logits

    def _restart_if_crossing(self, c: SeqChunk) -> SeqChunk:
        n0 = c.cache.n
        if not 0 < n0 <= self.long_after < n0 + len(c.tokens):
            return c
        seen = self.history.get(c.cache)
        if seen is None or len(seen) < n0:
            return c  # ids unknown: the cached keys keep the short factors
        prefix = seen[:n0]
        c.cache.shift(0, n0)  # empty; refilled with the long factors below
        rows = None if c.logit_rows is None else tuple(r + n0 for r in c.logit_rows)
        return SeqChunk(c.cache, [*prefix, *(int(t) for t in c.tokens)], rows)

    def make_block(self, src: TensorSource, i: int) -> Block:
        qkv = src.weight(f"blk.{i}.attn_qkv.weight")
        up = src.weight(f"blk.{i}.ffn_up.weight")
        nq, nkv = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        if qkv.shape[0] != nq + 2 * nkv or up.shape[0] % 2:
            raise UnsupportedError(
                f"phi3 block {i}: attn_qkv has {qkv.shape[0]} rows and ffn_up {up.shape[0]}; "
                f"the hyper-parameters need {nq + 2 * nkv} and an even count"
            )
        ff = up.shape[0] // 2
        return Block(
            attn_norm=src.vec(f"blk.{i}.attn_norm.weight"),
            wq=_rows(qkv, 0, nq),
            wk=_rows(qkv, nq, nq + nkv),
            wv=_rows(qkv, nq + nkv, nq + 2 * nkv),
            wo=src.weight(f"blk.{i}.attn_output.weight"),
            ffn_norm=src.vec(f"blk.{i}.ffn_norm.weight"),
            w_gate=_rows(up, 0, ff),
            w_up=_rows(up, ff, 2 * ff),
            w_down=src.weight(f"blk.{i}.ffn_down.weight"),
            bq=_opt(src, f"blk.{i}.attn_q.bias"),
            bk=_opt(src, f"blk.{i}.attn_k.bias"),
            bv=_opt(src, f"blk.{i}.attn_v.bias"),
        )

    def step_angles(
        self, batch: Sequence[SeqChunk], pos: np.ndarray[Any, Any]
    ) -> tuple[F32Array, F32Array]:
        short = self.be.rope_angles(pos, self.inv_freq)
        if not self.long_after:
            return short
        longer = [c.cache.n + len(c.tokens) > self.long_after for c in batch]
        if not any(longer):
            return short
        long = self.be.rope_angles(pos, self.long_inv_freq)
        if all(longer):
            return long
        rows = np.repeat(np.asarray(longer), [len(c.tokens) for c in batch])[:, None]
        cos = np.where(rows, long[0], short[0]).astype(np.float32)
        sin = np.where(rows, long[1], short[1]).astype(np.float32)
        return cos, sin
