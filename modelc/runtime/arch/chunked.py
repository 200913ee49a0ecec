"""Chunked attention (Llama 4's RoPE layers): positions are cut into chunks of ``chunk``
and a query at position ``p`` sees only the keys of its own chunk, ``p - p % chunk .. p``
(transformers' ``create_chunked_causal_mask`` on the ``chunked_attention`` layers;
llama.cpp's ``LLAMA_SWA_TYPE_CHUNKED`` mask).

The attention kernels run unchanged: a sequence's new queries are split where a chunk
starts, and each piece attends causally over the cache rows from its chunk's first
position on (a view, no copy), its first query at row ``p - chunk_start``.  What a chunk
needs is within the last ``chunk`` positions, so the cache bounds such a layer as a
sliding window of ``chunk`` (:class:`~modelc.runtime.kv_cache.KVCache`'s ``windows``):
rollbacks, prefix-cache fills and context shifts keep what the windowed layers keep.
After a context shift the chunks follow the new (compacted) positions, as llama.cpp's
mask does after ``seq_add``.
"""

from __future__ import annotations

from collections.abc import Sequence

from modelc.formats.ir import HParams
from modelc.runtime.backend import Backend, F32Array, KVArray
from modelc.runtime.model import SeqChunk

__all__ = ["chunked_attend", "layer_chunks"]


def chunked_attend(
    be: Backend,
    batch: Sequence[SeqChunk],
    slices: Sequence[slice],
    layer: int,
    q: F32Array,
    k: F32Array,
    v: F32Array,
    scale: float,
    out: F32Array,
    chunk: int,
) -> None:
    """Layer ``layer``'s attention within chunks of ``chunk`` positions: each sequence
    writes its new K/V (n, n_head_kv, hd) to its cache, then every piece of queries
    within one chunk attends over that chunk's keys, all in one backend call; results go
    to ``out`` (n, n_head, hd)."""
    qs: list[F32Array] = []
    ks: list[KVArray] = []
    vs: list[KVArray] = []
    p0s: list[int] = []
    outs: list[F32Array] = []
    for c, sl in zip(batch, slices, strict=True):
        n0, m = c.cache.n, len(c.tokens)
        if m == 0:
            continue
        c.cache.write(layer, n0, k[sl], v[sl])
        kk, vv = c.cache.read(layer, n0 + m)  # (rows, n_head_kv, hd) from held_from
        base = c.cache.held_from(layer)
        p = n0
        while p < n0 + m:  # one piece a chunk: queries p .. end-1, keys first .. end-1
            first = p - p % chunk
            end = min(n0 + m, first + chunk)
            qs.append(q[sl][p - n0 : end - n0])
            outs.append(out[sl][p - n0 : end - n0])
            ks.append(kk[first - base : end - base])
            vs.append(vv[first - base : end - base])
            p0s.append(p - first)
            p = end
    if qs:
        be.attention_batch(qs, ks, vs, p0s, scale, outs=outs)


def layer_chunks(hp: HParams) -> tuple[int, ...]:
    """Each layer's chunk: ``attn_chunk`` on the RoPE layers, 0 on the NoPE ones (they see
    every position) and everywhere when the model has no chunks."""
    c = hp.attn_chunk
    return tuple(c if c and i not in hp.nope_layers else 0 for i in range(hp.n_layer))
