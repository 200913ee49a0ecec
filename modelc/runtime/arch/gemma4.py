"""Gemma 4's layer kinds, as hooks of the one decoder (:mod:`modelc.runtime.arch.decoder`).

* **Layers of two shapes**: global layers have their own head size and KV head count.  The
  KV cache has one shape, the largest head size and KV head count (every count dividing
  it): a smaller layer's keys and values are stored zero-padded to that head size, each KV
  head repeated so that query head ``h`` still meets its own (``h // (n_head / n_kv)``);
  its queries are zero-padded alike and its output cut back.  Zeros add nothing to Q·K
  nor to the output's kept part, so this is exact; it costs the padding's memory.
* **KV sharing**: the last ``n_kv_shared`` layers compute no keys or values; each attends
  over the cache layer of the last earlier layer of its kind (windowed or global), written
  earlier in the same step, so the cache has a layer per producing layer only.
* **V norms** (RMS, no weight) and **values from keys** (``attention_k_eq_v``: a global
  layer with no ``attn_v`` takes the key projection's output, before the K norm).
* **Per-layer input embeddings**: ``(per_layer_token_embd[ids] * sqrt(p) +
  rms_norm(per_layer_model_proj x / sqrt(d))) / sqrt(2)``, (n, layers, p), made once a
  step from the scaled embeddings ``x``; after its FFN layer ``i`` adds
  ``post_norm(proj(gelu(inp_gate x) * inputs[:, i]))``, then multiplies by its
  ``layer_output_scale``.
* **A mixture beside the FFN** (26B-A4B): the FFN's output normed by ``post_ffw_norm_1``
  plus the experts' of the same residual (``pre_ffw_norm_2`` before, ``post_ffw_norm_2``
  after); the router sees the residual RMS-normed times ``ffn_gate_inp.scale`` / sqrt(d),
  softmax, top-k renormalised, each expert's output times its ``ffn_down_exps.scale``;
  experts GELU(gate) * up, gate and up fused in ``ffn_gate_up_exps``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelc.errors import UnsupportedError
from modelc.formats.ir import HParams, ModelIR
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.model import SeqChunk, TensorSource, attend, check_rows

__all__ = ["Gemma4Layers", "LayerAttn", "gemma4_layers"]

Angles = tuple[F32Array, F32Array]


@dataclass(slots=True)
class LayerAttn:
    """One layer's attention weights; a KV-sharing layer has no wk / k_norm."""

    wq: Weight  # (n_head*hd, d)
    wk: Weight | None  # (nkv*hd, d)
    wv: Weight | None  # (nkv*hd, d); None: the values are the keys' projection
    q_norm: F32Array  # (hd,)
    k_norm: F32Array | None  # (hd,)


@dataclass(slots=True)
class PerLayerEmbd:
    """Per-layer input embeddings: the model's tables and each layer's weights."""

    tok: Weight  # (vocab, n_layer*p)
    proj: Weight  # (n_layer*p, d)
    proj_norm: F32Array  # (p,)
    gate: list[Weight]  # per layer (p, d)
    out: list[Weight]  # per layer (d, p)
    post_norm: list[F32Array]  # per layer (d,)


@dataclass(slots=True)
class SideExperts:
    """A layer's mixture beside its FFN: router, scales, experts (row views), norms."""

    router: Weight  # (n_expert, d)
    router_scale: F32Array  # (d,)
    expert_scale: F32Array  # (n_expert,)
    gate: list[Weight]  # n_expert x (ff, d)
    up: list[Weight]  # n_expert x (ff, d)
    down: list[Weight]  # n_expert x (d, ff)
    post_norm_1: F32Array  # (d,): the FFN's output
    pre_norm_2: F32Array  # (d,): the experts' input
    post_norm_2: F32Array  # (d,): the experts' output
    n_used: int


@dataclass(slots=True)
class Gemma4Layers:
    """What a Gemma 4 model's layers need beyond the one decoder's."""

    head_dims: tuple[int, ...]  # per layer
    kv_heads: tuple[int, ...]  # per layer
    kv_source: tuple[int, ...]  # per layer: the cache layer it writes or reads
    n_cache_layers: int  # layers that write keys and values
    attn: list[LayerAttn]
    ple: PerLayerEmbd | None
    scales: list[F32Array | None]  # per layer: layer_output_scale (1,)
    eps: float
    side: list[SideExperts | None]  # per layer: a mixture beside the FFN

    @property
    def cache_head_dim(self) -> int:
        return max(self.head_dims)

    @property
    def cache_kv_heads(self) -> int:
        return max(self.kv_heads)

    @property
    def values_from_keys(self) -> bool:
        return any(a.wv is None and a.wk is not None for a in self.attn)

    def spec_fields(self, hp: HParams) -> dict[str, Any]:
        """The :class:`~modelc.runtime.arch.decoder.DecoderSpec` fields of these layers."""
        hd_g = hp.head_dim_global or hp.head_dim
        return {
            "head_dims": self.head_dims,
            "kv_heads": self.kv_heads,
            "kv_source": self.kv_source,
            "v_norm": True,
            "values_from_keys": self.values_from_keys,
            "rope_dims_global": hp.rope_dims_global if hp.rope_dims_global < hd_g else 0,
            "per_layer_embd": hp.n_embd_per_layer,
            "layer_scale": any(s is not None for s in self.scales),
            "side_experts": tuple(e is not None for e in self.side),
        }

    # -- attention -------------------------------------------------------------------
    def attention(
        self,
        be: Backend,
        li: int,
        h: F32Array,
        batch: Sequence[SeqChunk],
        slices: list[slice],
        rot: Angles,
        neox: bool,
        window: int,
    ) -> F32Array:
        """Layer ``li``'s attention of the normed rows ``h`` (n, d), before W_o: (n, n_head*hd)."""
        a, hd, nkv = self.attn[li], self.head_dims[li], self.kv_heads[li]
        n, nh = len(h), a.wq.shape[0] // hd
        ws = [w for w in (a.wq, a.wk, a.wv) if w is not None]
        q, *kv = be.matmul_many(ws, h)  # Q, then K and V where the layer has them
        q = be.rms_norm(q.reshape(n * nh, hd), a.q_norm, self.eps)
        q = q.reshape(n, nh, hd)
        be.rope(q, rot, neox)
        hc, kc = self.cache_head_dim, self.cache_kv_heads
        o = np.empty((n, nh, hc), np.float32)  # (n, n_head, cache hd)
        src = self.kv_source[li]
        if a.wk is None:  # KV sharing: the producing layer wrote this step's rows already
            _attend_cached(be, batch, src, _pad(q, nh, hc), o, window)
            return np.ascontiguousarray(o[:, :, :hd]).reshape(n, nh * hd)
        k = kv[0]  # (n, nkv*hd)
        v = kv[1] if a.wv is not None else k.copy()  # values from keys: before the K norm
        assert a.k_norm is not None
        k = be.rms_norm(k.reshape(n * nkv, hd), a.k_norm, self.eps).reshape(n, nkv, hd)
        ones = np.ones(hd, np.float32)
        v = be.rms_norm(v.reshape(n * nkv, hd), ones, self.eps).reshape(n, nkv, hd)
        be.rope(k, rot, neox)
        k, v, q = _pad(k, kc, hc), _pad(v, kc, hc), _pad(q, nh, hc)
        attend(be, batch, slices, src, q, k, v, 1.0, o, window)
        if hc == hd:
            return o.reshape(n, nh * hd)
        return np.ascontiguousarray(o[:, :, :hd]).reshape(n, nh * hd)

    def rerotate(
        self, be: Backend, k: F32Array, cache_layer: int, angles: Angles, neox: bool
    ) -> None:
        """Turn a cache layer's keys (rows, cache KV heads, cache hd) in place by ``angles``
        (a context shift): only the layer's own head size is rotated."""
        li = self.kv_source.index(cache_layer)
        hd = self.head_dims[li]
        if hd == k.shape[2]:
            be.rope(k, angles, neox)
            return
        part = np.ascontiguousarray(k[:, :, :hd])
        be.rope(part, angles, neox)
        k[:, :, :hd] = part

    # -- per-layer inputs and output scales -----------------------------------------
    def inputs(self, be: Backend, ids: np.ndarray[Any, Any], x: F32Array) -> F32Array | None:
        """The step's per-layer inputs (n, n_layer, p) from its ids and scaled embeddings."""
        e = self.ple
        if e is None:
            return None
        n, p = len(ids), len(e.proj_norm)
        tok = be.get_rows(e.tok, ids) * np.float32(math.sqrt(p))  # (n, L*p)
        proj = be.matmul(e.proj, x) * np.float32(1.0 / math.sqrt(x.shape[1]))  # (n, L*p)
        proj = be.rms_norm(proj.reshape(-1, p), e.proj_norm, self.eps).reshape(tok.shape)
        out: F32Array = ((proj + tok) * np.float32(1.0 / math.sqrt(2.0))).reshape(n, -1, p)
        return out

    def beside_ffn(self, be: Backend, li: int, x: F32Array, ffn: F32Array) -> F32Array:
        """Layer ``li``'s FFN output ``ffn`` (n, d) with its mixture's added, both normed (the
        residual ``x`` feeds the mixture); ``ffn`` itself when the layer has none."""
        e = self.side[li]
        if e is None:
            return ffn
        d = x.shape[1]
        r = be.rms_norm(x, np.ones(d, np.float32), self.eps) * e.router_scale
        r *= np.float32(1.0 / math.sqrt(d))
        p = be.softmax(be.matmul(e.router, r))  # (n, n_expert)
        top = np.argsort(-p, axis=1, kind="stable")[:, : e.n_used]  # (n, used)
        w = np.take_along_axis(p, top, axis=1)
        w = w / w.sum(axis=1, keepdims=True) * e.expert_scale[top]
        h = be.rms_norm(x, e.pre_norm_2, self.eps)
        moe = np.zeros_like(x)  # (n, d)
        for ex in np.unique(top):  # each expert once, on the rows routed to it
            rows, slot = np.nonzero(top == ex)
            xe = np.ascontiguousarray(h[rows])
            g, u = be.matmul_many((e.gate[ex], e.up[ex]), xe)
            g = be.gelu(g, out=g)
            g *= u
            moe[rows] += be.matmul(e.down[ex], g) * w[rows, slot][:, None]
        out: F32Array = be.rms_norm(ffn, e.post_norm_1, self.eps)
        out += be.rms_norm(moe, e.post_norm_2, self.eps)
        return out

    def after_layer(self, be: Backend, li: int, x: F32Array, inputs: F32Array | None) -> None:
        """In place on the residual ``x`` (n, d): the per-layer input, then the scale."""
        e = self.ple
        if e is not None and inputs is not None:
            g = be.gelu(be.matmul(e.gate[li], x))  # (n, p)
            g *= inputs[:, li, :]
            x += be.rms_norm(be.matmul(e.out[li], g), e.post_norm[li], self.eps)
        s = self.scales[li]
        if s is not None:
            x *= s[0]


def _pad(x: F32Array, heads: int, hd: int) -> F32Array:
    """x (n, h, d) as (n, heads, hd): each head repeated heads/h times, zeros past d."""
    n, h, d = x.shape
    if h == heads and d == hd:
        return x
    out = np.zeros((n, heads, hd), np.float32)
    out[:, :, :d] = np.repeat(x, heads // h, axis=1)
    return out


def _attend_cached(
    be: Backend,
    batch: Sequence[SeqChunk],
    layer: int,
    q: F32Array,
    out: F32Array,
    window: int,
) -> None:
    """Attention of ``q`` (n, n_head, hd) over cache layer ``layer`` as it stands, this
    step's rows included (written by the layer that produces them); nothing written."""
    ks, vs, p0s, qs, outs = [], [], [], [], []
    r = 0
    for c in batch:
        m = len(c.tokens)
        kk, vv = c.cache.read(layer, c.cache.n + m)
        ks.append(kk)
        vs.append(vv)
        p0s.append(c.cache.start(layer))
        qs.append(np.ascontiguousarray(q[r : r + m]))
        outs.append(out[r : r + m])
        r += m
    be.attention_batch(qs, ks, vs, p0s, 1.0, outs=outs, window=window)


def _sources(hp: HParams, windows: Sequence[int]) -> tuple[tuple[int, ...], int]:
    """Each layer's cache layer and how many layers write one: the last ``n_kv_shared``
    read that of the last earlier layer of their kind (windowed or not)."""
    first = hp.n_layer - hp.n_kv_shared
    if hp.n_kv_shared and first <= 0:
        raise UnsupportedError(f"{hp.n_kv_shared} KV-sharing layers of {hp.n_layer} leave none")
    src = list(range(first))
    for li in range(first, hp.n_layer):
        same = [j for j in range(first) if bool(windows[j]) == bool(windows[li])]
        if not same:
            raise UnsupportedError(f"layer {li} shares the KV of no earlier layer of its kind")
        src.append(same[-1])
    return tuple(src), first


def gemma4_layers(ir: ModelIR, src: TensorSource, windows: Sequence[int]) -> Gemma4Layers:
    """The model's Gemma 4 parts (per-layer shapes, KV sharing, per-layer inputs)."""
    hp = ir.hparams
    glob = [not w for w in windows]
    hds = tuple((hp.head_dim_global or hp.head_dim) if g else hp.head_dim for g in glob)
    kvs = tuple((hp.n_head_kv_global or hp.n_head_kv) if g else hp.n_head_kv for g in glob)
    kv_max = max(kvs)
    if any(kv_max % k for k in kvs) or any(hp.n_head % k for k in kvs):
        raise UnsupportedError(f"KV head counts {sorted(set(kvs))} do not divide each other")
    sources, n_cache = _sources(hp, windows)
    attn = []
    for i in range(hp.n_layer):
        p = f"blk.{i}."
        wq = src.weight(p + "attn_q.weight")
        check_rows(ir, p + "attn_q.weight", wq, hp.n_head * hds[i])
        wk = src.weight(p + "attn_k.weight") if i < n_cache else None
        wv = (
            src.weight(p + "attn_v.weight")
            if wk is not None and src.has(p + "attn_v.weight")
            else None
        )
        for name, w in (("k", wk), ("v", wv)):
            if w is not None:
                check_rows(ir, f"{p}attn_{name}.weight", w, kvs[i] * hds[i])
        knorm = src.vec(p + "attn_k_norm.weight") if wk is not None else None
        attn.append(LayerAttn(wq, wk, wv, src.vec(p + "attn_q_norm.weight"), knorm))
    ple = None
    if hp.n_embd_per_layer:
        L = range(hp.n_layer)
        ple = PerLayerEmbd(
            tok=src.weight("per_layer_token_embd.weight"),
            proj=src.weight("per_layer_model_proj.weight"),
            proj_norm=src.vec("per_layer_proj_norm.weight"),
            gate=[src.weight(f"blk.{i}.inp_gate.weight") for i in L],
            out=[src.weight(f"blk.{i}.proj.weight") for i in L],
            post_norm=[src.vec(f"blk.{i}.post_norm.weight") for i in L],
        )
    scales = [
        src.vec(f"blk.{i}.layer_output_scale.weight")
        if src.has(f"blk.{i}.layer_output_scale.weight")
        else None
        for i in range(hp.n_layer)
    ]
    side = [_side_experts(src, i, hp.n_expert_used) for i in range(hp.n_layer)]
    return Gemma4Layers(hds, kvs, sources, n_cache, attn, ple, scales, hp.norm_eps, side)


def _side_experts(src: TensorSource, i: int, n_used: int) -> SideExperts | None:
    """Block ``i``'s mixture beside its FFN, or None."""
    p = f"blk.{i}."
    if not src.has(p + "ffn_gate_inp.weight"):
        return None
    gate_up = src.experts(p + "ffn_gate_up_exps.weight")  # each (2 ff, d): gate rows, up rows
    ff = gate_up[0].shape[0] // 2
    router = src.weight(p + "ffn_gate_inp.weight")
    if not 0 < n_used <= router.shape[0] or len(gate_up) != router.shape[0]:
        raise UnsupportedError(
            f"{p}: {router.shape[0]} router rows, {len(gate_up)} experts, {n_used} used a token"
        )
    return SideExperts(
        router=router,
        router_scale=src.vec(p + "ffn_gate_inp.scale"),
        expert_scale=src.vec(p + "ffn_down_exps.scale"),
        gate=[Weight(w.dtype, (ff, w.shape[1]), w.data[:ff]) for w in gate_up],
        up=[Weight(w.dtype, (ff, w.shape[1]), w.data[ff:]) for w in gate_up],
        down=src.experts(p + "ffn_down_exps.weight"),
        post_norm_1=src.vec(p + "post_ffw_norm_1.weight"),
        pre_norm_2=src.vec(p + "pre_ffw_norm_2.weight"),
        post_norm_2=src.vec(p + "post_ffw_norm_2.weight"),
        n_used=n_used,
    )


def proportional_inv_freq(head_dim: int, rot_dims: int, theta: float) -> F32Array:
    """Proportional RoPE's inverse frequencies (head_dim/2,): the first rot_dims/2 pairs at
    the whole head's frequencies, the rest 0 (they keep still)."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    inv[rot_dims // 2 :] = 0.0
    return inv.astype(np.float32)
