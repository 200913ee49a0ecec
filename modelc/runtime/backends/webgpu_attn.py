"""The attention of a resident WebGPU step's layer (:class:`~.webgpu_llama.WebGpuLlama`'s
``_record``): a GQA layer's projections, norms and RoPE (:func:`record_attention`), and for
it and latent attention alike each sequence's new cache rows and the attention over its
cache (:func:`record_attend`)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from modelc.runtime.backends.webgpu_device import Dispatch, Job, flat, u32s
from modelc.runtime.backends.webgpu_kv import WebGpuKVCache
from modelc.runtime.backends.webgpu_layer import Layer
from modelc.runtime.model import SeqChunk

if TYPE_CHECKING:
    from modelc.runtime.backends.webgpu_llama import WebGpuLlama


def record_attention(
    m: WebGpuLlama,
    job: Job,
    ly: Layer,
    li: int,
    bufs: dict[str, tuple[Any, ...]],
    tables: dict[bool, tuple[Any, ...]],
    hin: Any,
    n: int,
    f16: bool,
    sstride: int,
    chunk: int,
    batch: Sequence[SeqChunk],
    slices: list[slice],
    stores: list[list[int]],
    attns: list[int],
) -> None:
    """A GQA layer's attention of ``hin`` added into x (its Q/K/V, their biases and
    norms, RoPE, the cache's new rows and the attention, the output product)."""
    nh, nkv, hd, hn = m.nh, m.nkv, m.hd, m.hn
    qw, kw = nh * hd, nkv * hd
    x, h, q, k, v = (bufs[name] for name in ("x", "h", "q", "k", "v"))
    whole = m.spec.qk_norm_whole
    rope = m._pipe("rope", "rope")
    for w, out in ((ly.wq, q), (ly.wk, k), (ly.wv, v)):
        m._matmul(job, w, hin, n, out)
    if ly.bias is not None:
        for bias, out, width in zip(ly.bias, (q, k, v), (qw, kw, kw), strict=True):
            m._elem(job, "add_bias", n * width, {1: bias, 2: out}, width)
    if ly.qk_norm is not None:  # each head's row of q, then of k, in place
        for wn, buf, heads in zip(ly.qk_norm, (q, k), (nh, nkv), strict=True):
            rows, width = (n, heads * hd) if whole else (n * heads, hd)
            m._norm(job, None, wn, rows, buf, width=width)
    if not m.nope[li]:  # queries and keys (at k's offset) in one dispatch
        gx, gy, gxs = flat(n * (nh + nkv) * hn)
        params = u32s(n, nh, hd, hn, int(m.neox), gxs, nkv, k[2] // 4)
        c_b, s_b, _, _ = tables[m.local[li]]
        job.add(Dispatch(rope, {2: c_b, 3: s_b, 5: bufs["qk"]}, params, 4, (gx, gy, 1)))
    if m.spec.qk_l2_norm and m.spec.qk_l2_norm[li]:  # weightless (llama 4)
        for buf, heads in ((q, nh), (k, nkv)):
            m._norm(job, None, m.ones, n * heads, buf, width=hd)
    if m.spec.attn_temp and m.spec.attn_temp_layers[li]:  # sharper far out
        m._elem(job, "scale_rows", n * qw, {1: bufs["temp"], 2: q}, qw)
    att = bufs["attn"]
    record_attend(m, job, batch, slices, stores, attns, bufs, li, ly, f16, sstride, chunk,
                 (q, k, v, att), (nh, nkv, hd))  # fmt: skip
    m._after_attention(job, ly, att, n, x, h)


def record_attend(
    m: WebGpuLlama,
    job: Job,
    batch: Sequence[SeqChunk],
    slices: list[slice],
    stores: list[list[int]],
    attns: list[int],
    bufs: dict[str, tuple[Any, ...]],
    li: int,
    ly: Layer,
    f16: bool,
    sstride: int,
    chunk: int,
    qkvo: tuple[Any, Any, Any, Any],
    heads: tuple[int, int, int],
) -> None:
    """Each sequence's new rows of k and v into its cache layer, then the attention of
    its rows of q over its cache into o (``heads``: query heads, KV heads, head size)."""
    q, k, v, att = qkvo
    nh, nkv, hd = heads
    kw = nkv * hd
    store = m._pipe("kv_store", "kv_store")
    attn = m._pipe("attention", "attention", "half", "attention")
    for c, sl, slots in zip(batch, slices, stores, strict=True):
        cache = c.cache
        assert isinstance(cache, WebGpuKVCache)
        layer = (cache.buf, cache.layer_bytes(), cache._at(li, 0, 0))
        v_off = cache.rows_alloc * kw
        rows = sl.stop - sl.start
        gx, gy, gxs = flat(rows * kw // 2)
        params = u32s(sl.start, rows, cache.n, kw, 0, v_off, int(f16), gxs)
        slots.append(len(job.dispatches))
        job.add(Dispatch(store, {0: k, 1: v, 2: layer}, params, 3, (gx, gy, 1)))
        seen = bufs[f"info{m.windows[li]}"] if m.windows[li] else bufs["info"]
        if m.chunks[li]:
            seen = bufs[f"chunk{m.chunks[li]}"]
        sinks = m.dummy if ly.sinks is None else ly.sinks  # gpt-oss's sink logits
        abind = {0: q, 1: layer, 2: layer, 3: att, 5: seen, 6: bufs["scores"], 7: sinks}
        for row0 in range(sl.start, sl.stop, chunk):
            part = min(chunk, sl.stop - row0)
            params = struct.pack(
                "<7I2f3I", row0, nh, nkv, hd, int(f16), sstride, int(ly.sinks is not None),
                m.scale, m.softcap, 0, v_off, 0,
            )  # fmt: skip
            attns.append(len(job.dispatches))
            job.add(Dispatch(attn, abind, params, 4, (part, nh, 1)))
