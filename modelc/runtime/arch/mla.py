"""Multi-head latent attention (DeepSeek V2/V3, ``deepseek2``), as llama.cpp runs it.

Per token the cache keeps one latent ``c`` (kv_rank, RMS-normed) and one rotated key part
``k_pe`` (rope_dim) shared by all heads: ``[c, k_pe]`` is the layer's only key row (one
KV "head" of ``kv_rank + rope_dim``) and its first ``kv_rank`` dimensions are the values
(:class:`~modelc.runtime.kv_cache.KVShape` ``shared_values``).  The heads' keys and values
are never formed: ``attn_k_b`` is absorbed into the queries and ``attn_v_b`` applied to
each head's attention-weighted latent::

    q = h Wq  |  norm(h Wq_a) Wq_b                (n, n_head, nope + rope)
    c, k_pe = norm((h Wkv_a)[:rank]), rope((h Wkv_a)[rank:])
    q' = [q_nope K_b[head], rope(q_pe)]          (n, n_head, rank + rope)
    o = softmax(q' [c, k_pe]^T * scale) [c, k_pe]    -> o[:, :, :rank] V_b[head]^T

which equals attention over the expanded keys ``[c K_b^T, k_pe]`` and values ``c V_b^T``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from modelc.formats.ir import HParams, LatentAttention, ModelIR
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.kv_cache import KVShape
from modelc.runtime.model import SeqChunk, TensorSource, attend, check_rows

__all__ = ["LatentBlock", "latent_attention", "latent_kv_shape", "load_latent"]


@dataclass(slots=True)
class LatentBlock:
    """One layer's MLA weights."""

    wq: Weight  # (n_head*(nope+rope), d), or (.., q_rank) after wq_a
    wq_a: Weight | None  # (q_rank, d)
    q_a_norm: F32Array | None  # (q_rank,)
    wkv_a: Weight  # (rank + rope, d)
    kv_a_norm: F32Array  # (rank,)
    k_b: F32Array  # (n_head, rank, nope): the keys' part without RoPE, per head, transposed
    v_b: F32Array  # (n_head, v_dim, rank)


def latent_kv_shape(n_layer: int, mla: LatentAttention) -> KVShape:
    """One row of latent + rotated key part a token and layer; values read from it."""
    return KVShape(n_layer, 1, mla.kv_rank + mla.rope_dim, shared_values=True)


def load_latent(ir: ModelIR, src: TensorSource, i: int, hp: HParams) -> LatentBlock:
    """Block ``i``'s MLA weights; an HF ``attn_kv_b`` is split as llama.cpp's converter does."""
    mla = hp.mla
    assert mla is not None
    p, nh, nope = f"blk.{i}.", hp.n_head, mla.nope_dim
    wkv_a = src.weight(p + "attn_kv_a_mqa.weight")
    check_rows(ir, p + "attn_kv_a_mqa.weight", wkv_a, mla.kv_rank + mla.rope_dim)
    if src.has(p + "attn_k_b.weight"):
        k_b = src.array(p + "attn_k_b.weight").reshape(nh, mla.kv_rank, nope)
        v_b = src.array(p + "attn_v_b.weight").reshape(nh, mla.v_dim, mla.kv_rank)
    else:
        kv_b = src.array(p + "attn_kv_b.weight").reshape(nh, nope + mla.v_dim, mla.kv_rank)
        k_b = np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1))
        v_b = np.ascontiguousarray(kv_b[:, nope:])
    lora = mla.q_rank > 0
    wq = src.weight(p + ("attn_q_b.weight" if lora else "attn_q.weight"))
    check_rows(ir, p + "attn_q.weight", wq, nh * (nope + mla.rope_dim))
    return LatentBlock(
        wq=wq,
        wq_a=src.weight(p + "attn_q_a.weight") if lora else None,
        q_a_norm=src.vec(p + "attn_q_a_norm.weight") if lora else None,
        wkv_a=wkv_a,
        kv_a_norm=src.vec(p + "attn_kv_a_norm.weight"),
        k_b=np.ascontiguousarray(k_b, np.float32),
        v_b=np.ascontiguousarray(v_b, np.float32),
    )


def latent_attention(
    be: Backend,
    b: LatentBlock,
    mla: LatentAttention,
    h: F32Array,
    batch: Sequence[SeqChunk],
    slices: list[slice],
    layer: int,
    angles: tuple[F32Array, F32Array],
    scale: float,
    eps: float,
) -> F32Array:
    """The attention of the rows of ``h`` (n, d), before the output matrix: (n, n_head*v_dim)."""
    n, rank, nope, rope = len(h), mla.kv_rank, mla.nope_dim, mla.rope_dim
    nh = b.k_b.shape[0]
    if b.wq_a is not None and b.q_a_norm is not None:
        h_q = be.rms_norm(be.matmul(b.wq_a, h), b.q_a_norm, eps)  # (n, q_rank)
        q = be.matmul(b.wq, h_q).reshape(n, nh, nope + rope)
    else:
        q = be.matmul(b.wq, h).reshape(n, nh, nope + rope)
    kv = be.matmul(b.wkv_a, h)  # (n, rank + rope)
    k = np.empty((n, 1, rank + rope), np.float32)  # the cached row: [latent, k_pe]
    k[:, 0, :rank] = be.rms_norm(np.ascontiguousarray(kv[:, :rank]), b.kv_a_norm, eps)
    k_pe = np.ascontiguousarray(kv[:, rank:]).reshape(n, 1, rope)
    be.rope(k_pe, angles, False)
    k[:, :, rank:] = k_pe
    qq = np.empty((n, nh, rank + rope), np.float32)  # [q_nope absorbed, q_pe]
    absorbed = np.matmul(
        q[:, :, :nope].transpose(1, 0, 2), b.k_b.transpose(0, 2, 1)
    )  # (nh, n, rank)
    qq[:, :, :rank] = absorbed.transpose(1, 0, 2)
    q_pe = np.ascontiguousarray(q[:, :, nope:])
    be.rope(q_pe, angles, False)
    qq[:, :, rank:] = q_pe
    o = np.empty((n, nh, rank + rope), np.float32)
    attend(be, batch, slices, layer, qq, k, k, scale, o)
    out = np.matmul(o[:, :, :rank].transpose(1, 0, 2), b.v_b.transpose(0, 2, 1))  # (nh, n, v)
    return np.ascontiguousarray(out.transpose(1, 0, 2)).reshape(n, nh * mla.v_dim)
