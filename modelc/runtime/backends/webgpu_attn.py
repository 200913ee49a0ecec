"""The attention of a resident WebGPU step's layer (:class:`~.webgpu_llama.WebGpuLlama`'s
``_record``), added into the residual stream: a GQA layer's (:func:`record_attention`:
projections, biases, norms, RoPE), latent attention's (:func:`record_latent_attention`,
:mod:`~.webgpu_mla`) or a Gemma 4 layer's (:func:`record_g4_attention`,
:mod:`~.webgpu_gemma4`), all through one RoPE dispatch (:func:`_rope`), each sequence's new
cache rows and the attention over its cache (:func:`_attend`) and the output product."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from modelc.runtime.backends.webgpu_device import Dispatch, Job, aligned, flat, u32s
from modelc.runtime.backends.webgpu_kv import WebGpuKVCache
from modelc.runtime.backends.webgpu_layer import Layer
from modelc.runtime.model import SeqChunk

if TYPE_CHECKING:
    from modelc.runtime.backends.webgpu_llama import WebGpuLlama


@dataclass(slots=True)
class StepRec:
    """What recording one step's layers shares: the job, the step's buffers and RoPE
    tables (by whether a layer has a base of its own), its sequences and their rows, the
    indices of the dispatches whose uniforms vary between steps of one shape (``stores``
    a sequence, ``attns``), the cache mode and the attention's scores stride and chunk."""

    job: Job
    bufs: dict[str, tuple[Any, ...]]
    tables: dict[bool, tuple[Any, ...]]
    batch: Sequence[SeqChunk]
    slices: list[slice]
    stores: list[list[int]]
    attns: list[int]
    n: int
    f16: bool
    sstride: int
    chunk: int


def record_attention(m: WebGpuLlama, s: StepRec, ly: Layer, li: int, hin: Any) -> None:
    """A GQA layer's attention of ``hin`` added into x (its Q/K/V, their biases and
    norms, RoPE, the cache's new rows and the attention, the output product)."""
    job, bufs, n = s.job, s.bufs, s.n
    nh, nkv, hd = m.nh, m.nkv, m.hd
    qw, kw = nh * hd, nkv * hd
    q, k, v = bufs["q"], bufs["k"], bufs["v"]
    for w, out in ((ly.wq, q), (ly.wk, k), (ly.wv, v)):
        m._matmul(job, w, hin, n, out)
    if ly.bias is not None:
        for bias, out, width in zip(ly.bias, (q, k, v), (qw, kw, kw), strict=True):
            m._elem(job, "add_bias", n * width, {1: bias, 2: out}, width)
    if ly.qk_norm is not None:  # each head's row of q, then of k, in place
        whole = m.spec.qk_norm_whole
        for wn, buf, heads in zip(ly.qk_norm, (q, k), (nh, nkv), strict=True):
            rows, width = (n, heads * hd) if whole else (n * heads, hd)
            m._norm(job, None, wn, rows, buf, width=width)
    if not m.nope[li]:  # queries and keys (at k's offset) in one dispatch
        _rope(m, s, li, bufs["qk"], hd, (nh, nkv, k[2] // 4))
    if m.spec.qk_l2_norm and m.spec.qk_l2_norm[li]:  # weightless (llama 4)
        for buf, heads in ((q, nh), (k, nkv)):
            m._norm(job, None, m.ones, n * heads, buf, width=hd)
    if m.spec.attn_temp and m.spec.attn_temp_layers[li]:  # sharper far out
        m._elem(job, "scale_rows", n * qw, {1: bufs["temp"], 2: q}, qw)
    _attend(m, s, ly, li, (q, k, v, bufs["attn"]), (nh, nkv, hd), layer=m.cache_layer[li])
    _output(m, s, ly, bufs["attn"])


def record_latent_attention(m: WebGpuLlama, s: StepRec, ly: Layer, li: int, hin: Any) -> None:
    """A latent-attention layer's (DeepSeek's) of ``hin`` added into x: its queries and
    cached rows (:meth:`~.webgpu_mla.MlaLayer.project`, their RoPE tails rotated here),
    the attention over one KV head whose values are its keys, the values through V_b, the
    output product."""
    mla, bufs = ly.mla, s.bufs
    assert mla is not None
    width = mla.width

    def rotate(buf: Any, heads: int) -> None:  # each head's last rope values
        _rope(m, s, li, buf, width, (0, heads, mla.rank))

    mla.project(m, s.job, bufs, hin, s.n, rotate)
    kv = bufs["mla_kv"]
    _attend(m, s, ly, li, (bufs["mla_qq"], kv, kv, bufs["mla_o"]), (m.nh, 1, width))
    mla.values(m, s.job, bufs, s.n)
    _output(m, s, ly, bufs["mla_out"])


def record_g4_attention(m: WebGpuLlama, s: StepRec, ly: Layer, li: int, hin: Any) -> None:
    """A Gemma 4 layer's attention of ``hin`` added into x (:mod:`.webgpu_gemma4`): Q (and,
    unless it shares an earlier layer's, K and V: values from keys where it has no
    ``attn_v``) at its own head shape, normed (V without a weight) and rotated, reshaped to
    the cache's, the attention over its cache layer at scale 1, cut back before W_o."""
    g4 = m.g4
    assert g4 is not None
    a, job, bufs, n = g4.attn[li], s.job, s.bufs, s.n
    nh, hc, kc, hd, kv = g4.nh, g4.hc, g4.kc, a.hd, a.kv
    qk, v = bufs["g4qk"], bufs["g4v"]
    k = (qk[0], n * kv * hd * 4, aligned(n * nh * hc * 4, m.gpu.offset_align))  # as sizes()
    q = (qk[0], n * nh * hd * 4)
    m._matmul(job, a.wq, hin, n, q)
    m._norm(job, None, a.q_norm, n * nh, q, width=hd)
    produce = a.wk is not None
    if produce:
        assert a.wk is not None and a.k_norm is not None
        m._matmul(job, a.wk, hin, n, k)
        m._matmul(job, a.wv if a.wv is not None else a.wk, hin, n, v)  # before the K norm
        m._norm(job, None, a.k_norm, n * kv, k, width=hd)
        m._norm(job, None, m.ones, n * kv, v, width=hd)  # V norms: no weight
    _rope(m, s, li, qk, hd, (nh, kv if produce else 0, k[2] // 4))
    # to the cache's shape: zeros past the head, each KV head repeated
    g4.heads(m, job, q, bufs["q"], n, (nh, hc, hd, 1, 0))
    if produce:
        g4.heads(m, job, k, bufs["k"], n, (kc, hc, hd, kc // kv, 0))
        g4.heads(m, job, v, bufs["v"], n, (kc, hc, hd, kc // kv, 0))
    att = bufs["attn"]
    _attend(
        m, s, ly, li, (bufs["q"], bufs["k"], bufs["v"], att), (nh, kc, hc),
        layer=a.source, store=produce, scale=1.0,
    )  # fmt: skip
    if hd != hc:  # each head cut back to the layer's size
        g4.heads(m, job, att, bufs["g4o"], n, (nh, hd, hc, 1, 0))
        att = bufs["g4o"]
    _output(m, s, ly, att)


def _rope(
    m: WebGpuLlama, s: StepRec, li: int, buf: Any, hd: int, heads: tuple[int, int, int]
) -> None:
    """RoPE in place on ``buf``'s rows of heads ``hd`` wide, by layer ``li``'s table:
    ``heads`` (h, h2, off2): h heads from each row's start, then h2 more from element off2
    on (rope.wgsl's two blocks: a GQA layer's queries and keys, latent attention's tails)."""
    c_b, s_b, _, _, hn = s.tables[m.local[li]]
    h, h2, off2 = heads
    gx, gy, gxs = flat(s.n * (h + h2) * hn)
    params = u32s(s.n, h, hd, hn, int(m.neox), gxs, h2, off2)
    pipe = m._pipe("rope", "rope")
    s.job.add(Dispatch(pipe, {2: c_b, 3: s_b, 5: buf}, params, 4, (gx, gy, 1)))


def _attend(
    m: WebGpuLlama,
    s: StepRec,
    ly: Layer,
    li: int,
    qkvo: tuple[Any, Any, Any, Any],
    heads: tuple[int, int, int],
    *,
    layer: int | None = None,
    store: bool = True,
    scale: float | None = None,
) -> None:
    """Each sequence's new rows of k and v into its cache layer, then the attention of
    its rows of q over its cache into o (``heads``: query heads, KV heads, head size);
    ``layer``: the cache layer (default ``li``), ``store``: False to only read it (Gemma
    4's KV sharing: written earlier in the step), ``scale``: the scores' (default the
    model's)."""
    job, bufs = s.job, s.bufs
    q, k, v, att = qkvo
    nh, nkv, hd = heads
    kw = nkv * hd
    put = m._pipe("kv_store", "kv_store")
    attn = m._pipe("attention", "attention", "half", "attention")
    for c, sl, slots in zip(s.batch, s.slices, s.stores, strict=True):
        cache = c.cache
        assert isinstance(cache, WebGpuKVCache)
        at = (cache.buf, cache.layer_bytes(), cache._at(li if layer is None else layer, 0, 0))
        v_off = cache.rows_alloc * kw
        rows = sl.stop - sl.start
        if store:
            gx, gy, gxs = flat(rows * kw // 2)
            params = u32s(sl.start, rows, cache.n, kw, 0, v_off, int(s.f16), gxs)
            slots.append(len(job.dispatches))
            job.add(Dispatch(put, {0: k, 1: v, 2: at}, params, 3, (gx, gy, 1)))
        seen = bufs[f"info{m.windows[li]}"] if m.windows[li] else bufs["info"]
        if m.chunks[li]:
            seen = bufs[f"chunk{m.chunks[li]}"]
        sinks = m.dummy if ly.sinks is None else ly.sinks  # gpt-oss's sink logits
        abind = {0: q, 1: at, 2: at, 3: att, 5: seen, 6: bufs["scores"], 7: sinks}
        for row0 in range(sl.start, sl.stop, s.chunk):
            part = min(s.chunk, sl.stop - row0)
            params = struct.pack(
                "<7I2f3I", row0, nh, nkv, hd, int(s.f16), s.sstride, int(ly.sinks is not None),
                m.scale if scale is None else scale, m.softcap, 0, v_off, 0,
            )  # fmt: skip
            s.attns.append(len(job.dispatches))
            job.add(Dispatch(attn, abind, params, 4, (part, nh, 1)))


def _output(m: WebGpuLlama, s: StepRec, ly: Layer, att: Any) -> None:
    """The output product of the attention ``att`` added into x, and its bias."""
    x, h = s.bufs["x"], s.bufs["h"]
    m._residual(s.job, ly.wo, att, s.n, x, h, ly.post[0])
    if ly.bo is not None:  # the output's bias (gpt-oss), into the residual stream
        m._elem(s.job, "add_bias", s.n * m.d, {1: ly.bo, 2: x}, m.d)
