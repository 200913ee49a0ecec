"""Gemma 4's dense layer kinds in the resident WebGPU step (:mod:`.webgpu_llama`), the
device side of :mod:`modelc.runtime.arch.gemma4`'s hooks, with the CPU's arithmetic (the
attention's recording is :func:`.webgpu_attn.record_g4_attention`, beside the others):

* **two head shapes, one cache**: a layer's queries, keys and values are projected, normed
  and rotated at its own head size and KV head count, then reshaped to the cache's (the
  largest head size, zeros past a narrower head; each KV head repeated to the largest
  count: ``heads.wgsl``), attended there (scale 1: the Q/K norms carry it) and the output
  cut back to the layer's head size before W_o;
* **KV sharing**: the last layers project no keys or values and attend over the cache
  layer of the last earlier layer of their kind, written earlier in the same step;
* **V norms** (weightless, per head) and **values from keys** (a global layer without
  ``attn_v`` takes the key projection's output before the K norm: the product run twice);
* **per-layer input embeddings**, made once a step after the scaled embeddings, and after
  each layer ``post_norm(proj(gelu(inp_gate x) * inputs[:, i]))`` added into the residual,
  then its output scale.

* **a mixture beside the FFN** (the 26B-A4B): the router reads the residual RMS-normed
  times its scale / sqrt(d), softmax top-k renormalised, each weight times its expert's
  scale; the experts (GELU, :class:`~.webgpu_moe.MoeLayer`) read the residual normed by
  ``pre_ffw_norm_2``; the FFN's output normed by ``post_ffw_norm_1`` plus the mixture's by
  ``post_ffw_norm_2``, then the layer's post-FFN norm, added into the residual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from modelc.runtime.arch.gemma4 import Gemma4Layers, SideExperts
from modelc.runtime.arch.moe import Experts
from modelc.runtime.backend import Weight
from modelc.runtime.backends.webgpu_device import Dispatch, Gpu, Job, aligned, flat, u32s, vec
from modelc.runtime.backends.webgpu_moe import MoeLayer

if TYPE_CHECKING:
    from modelc.runtime.backends.webgpu_llama import WebGpuLlama

# the decoder's features this runs (webgpu_layer.WEBGPU_RUNS)
GEMMA4_RUNS = frozenset(
    {
        "head_shapes",
        "kv_sharing",
        "v_norm",
        "values_from_keys",
        "proportional_rope",
        "per_layer_embd",
        "layer_scale",
        "side_experts",
    }
)


def _dense_mats(g4: Gemma4Layers) -> list[Weight]:
    """Its attention's and per-layer inputs' matrices."""
    out: list[Weight] = []
    for a in g4.attn:
        out += [w for w in (a.wq, a.wk, a.wv) if w is not None]
    if g4.ple is not None:
        out += [g4.ple.tok, g4.ple.proj, *g4.ple.gate, *g4.ple.out]
    return out


def g4_mats(g4: Gemma4Layers) -> list[Weight]:
    """Every matrix a Gemma 4 step reads beyond the blocks' output and FFN products (of a
    mixture beside the FFN: its router's and one expert's, for their types)."""
    side = [w for e in g4.side if e is not None for w in (e.router, e.gate[0], e.up[0], e.down[0])]
    return _dense_mats(g4) + side


def g4_widths(g4: Gemma4Layers, n_head: int) -> set[int]:
    """The row widths its shaders see (each must be a multiple of 4 to run here)."""
    hc, kc = g4.cache_head_dim, g4.cache_kv_heads
    w = {hc, kc * hc, n_head * hc}
    for hd, kv in zip(g4.head_dims, g4.kv_heads, strict=True):
        w |= {hd, kv * hd, n_head * hd}
    p = 0 if g4.ple is None else len(g4.ple.proj_norm)
    w |= {int(e.gate[0].shape[0]) for e in g4.side if e is not None}
    return w | ({p, len(g4.attn) * p} if p else set())


@dataclass(slots=True)
class G4Attn:
    """One layer's attention on the device: its shapes, cache layer and norms."""

    hd: int  # its head size
    kv: int  # its KV head count
    source: int  # the cache layer it writes (or, KV sharing, reads)
    wq: Weight
    wk: Weight | None  # None: KV sharing
    wv: Weight | None  # None with wk: values from keys
    q_norm: Any
    k_norm: Any


class Gemma4Step:
    """A Gemma 4 model's weights beyond the one decoder's, and the dispatches that use them."""

    def __init__(self, gpu: Gpu, g4: Gemma4Layers, n_head: int) -> None:
        self.layers, self.nh = g4, n_head
        self.hc, self.kc = g4.cache_head_dim, g4.cache_kv_heads
        self.attn = []
        for i, a in enumerate(g4.attn):
            k_norm = None if a.k_norm is None else vec(gpu, a.k_norm, "k_norm")
            shape = (g4.head_dims[i], g4.kv_heads[i], g4.kv_source[i])
            self.attn.append(G4Attn(*shape, a.wq, a.wk, a.wv, vec(gpu, a.q_norm, "q_norm"), k_norm))
        self.ple = g4.ple
        self.p = 0 if g4.ple is None else len(g4.ple.proj_norm)
        self.ple_norms = (
            []
            if g4.ple is None
            else [vec(gpu, g4.ple.proj_norm, "ple_norm")]
            + [vec(gpu, w, "ple_post") for w in g4.ple.post_norm]
        )
        self.scales = [None if s is None else float(s[0]) for s in g4.scales]
        self.n_layer = len(g4.attn)
        # the mixtures beside the FFN: experts as MoeLayer runs them, and their norms
        self.side = [None if e is None else _Side(gpu, e) for e in g4.side]
        self.moes = [x.moe for x in self.side if x is not None]

    def mats(self) -> list[Weight]:
        """The matrices its dispatches read (a mixture's stacked, as MoeLayer reads them)."""
        return _dense_mats(self.layers) + [w for moe in self.moes for w in moe.mats()]

    def sizes(self, n: int, align: int) -> dict[str, int]:
        """The step's extra buffers (bytes): unpadded Q (then K at an aligned offset) and V,
        the attention output cut back, the per-layer inputs and their gate's rows."""
        qw, kw = self.nh * self.hc, self.kc * self.hc
        k_at = aligned(n * qw * 4, align)  # K after Q
        out = {"g4qk": k_at + n * kw * 4, "g4v": n * kw * 4, "g4o": n * qw * 4}
        if self.moes:  # the FFN's output, the router's and the experts' inputs, the mixture's
            d = self.moes[0].d
            out |= {k: n * d * 4 for k in ("g4ffn", "g4rin", "g4ein", "g4moe")}
        if self.p:
            lp = self.n_layer * self.p
            out |= {"ple_in": n * lp * 4, "ple_proj": n * lp * 4, "ple_gu": n * 2 * self.p * 4}
            out |= {"ple_act": n * self.p * 4}
        return out

    # -- the step ----------------------------------------------------------------------
    def heads(
        self,
        m: WebGpuLlama,
        job: Job,
        src: Any,
        out: Any,
        n: int,
        shape: tuple[int, int, int, int, int],
        istride: int = 0,
        ostride: int = 0,
        oc: int = 0,
    ) -> None:
        """``heads.wgsl``: ``shape`` (h_out, d_out, d_in, rep, h0); input rows ``istride``
        floats apart (0: its heads contiguous), output rows ``ostride`` apart (0: likewise)
        written from column ``oc``."""
        h_out, d_out, d_in, rep, h0 = shape
        istride = istride or (h_out // rep) * d_in
        ostride = ostride or h_out * d_out
        gx, gy, gxs = flat(n * h_out * d_out)
        params = u32s(n, h_out, d_out, d_in, rep, h0, istride, ostride, oc, gxs, 0, 0)
        job.add(
            Dispatch(m._pipe("heads", "reshape_heads"), {0: src, 1: out}, params, 2, (gx, gy, 1))
        )

    def record_inputs(self, m: WebGpuLlama, job: Job, bufs: dict[str, Any], n: int) -> None:
        """The step's per-layer inputs (n, n_layer, p) into ``ple_in``, from its ids and the
        scaled embeddings in x: ``(tok * sqrt(p) + rms_norm(proj x / sqrt(d))) / sqrt(2)``."""
        e = self.ple
        if e is None:
            return
        p, lp = self.p, self.n_layer * self.p
        tok, proj = bufs["ple_in"], bufs["ple_proj"]
        m._get_rows(job, e.tok, bufs["ids"], n, tok)
        m._elem(job, "scale", n * lp, {2: tok}, f=math.sqrt(p))
        m._matmul(job, e.proj, bufs["x"], n, proj)
        m._elem(job, "scale", n * lp, {2: proj}, f=1.0 / math.sqrt(m.d))
        m._norm(job, None, self.ple_norms[0], n * self.n_layer, proj, width=p)
        m._elem(job, "add_bias", n * lp, {1: proj, 2: tok}, n * lp)  # tok += proj
        m._elem(job, "scale", n * lp, {2: tok}, f=1.0 / math.sqrt(2.0))

    def record_after_layer(
        self, m: WebGpuLlama, job: Job, bufs: dict[str, Any], li: int, n: int
    ) -> None:
        """After layer ``li``'s FFN: its per-layer input added into x, then x times its scale."""
        e = self.ple
        x = bufs["x"]
        if e is not None:
            p, gu, act = self.p, bufs["ple_gu"], bufs["ple_act"]
            m._matmul(job, e.gate[li], x, n, gu, stride=2 * p)  # each row: gate, then input
            self.heads(m, job, bufs["ple_in"], gu, n, (1, p, p, 1, li), self.n_layer * p, 2 * p, p)
            m._elem(job, "gelu_mul", n * p, {0: gu, 1: gu, 2: act}, p)
            m._residual(job, e.out[li], act, n, x, bufs["h"], self.ple_norms[1 + li])
        s = self.scales[li]
        if s is not None:
            m._elem(job, "scale", n * m.d, {2: x}, f=s)

    def record_side_ffn(
        self, m: WebGpuLlama, job: Job, bufs: dict[str, Any], li: int, n: int, act: Any, ly: Any
    ) -> None:
        """Layer ``li``'s FFN output (its down product of ``act``) and its mixture beside,
        normed and added into x (see the module's docstring)."""
        side = self.side[li]
        assert side is not None
        x, h, ffn, moe = bufs["x"], bufs["h"], bufs["g4ffn"], bufs["g4moe"]
        m._matmul(job, ly.down, act, n, ffn)
        rin, ein = bufs["g4rin"], bufs["g4ein"]
        m._norm(job, x, side.router_scale, n, rin)  # rms_norm(x) * scale, as (x / rms) * s
        m._elem(job, "scale", n * m.d, {2: rin}, f=1.0 / math.sqrt(m.d))
        m._norm(job, x, side.pre_norm_2, n, ein)
        side.moe.record(
            m, job, bufs, ein, moe, n, "gelu_mul", router_in=rin, wscale=side.expert_scale,
            written=True,
        )  # fmt: skip
        m._norm(job, ffn, side.post_norm_1, n, h)  # h = norm(ffn) + norm(moe)
        m._add_norm(job, moe, side.post_norm_2, n, h)
        if ly.post[1] is not None:
            m._add_norm(job, h, ly.post[1], n, x)
        else:
            m._elem(job, "add_bias", n * m.d, {1: h, 2: x}, n * m.d)


class _Side:
    """A layer's mixture beside its FFN on the device."""

    def __init__(self, gpu: Gpu, e: SideExperts) -> None:
        self.moe = MoeLayer(gpu, Experts(e.router, e.gate, e.up, e.down, e.n_used))
        self.router_scale = vec(gpu, e.router_scale, "router_scale")
        self.expert_scale = vec(gpu, e.expert_scale, "expert_scale")
        self.pre_norm_2 = vec(gpu, e.pre_norm_2, "pre_norm_2")
        self.post_norm_1 = vec(gpu, e.post_norm_1, "post_norm_1")
        self.post_norm_2 = vec(gpu, e.post_norm_2, "post_norm_2")
