"""A decoder layer's weights as :class:`~modelc.runtime.backends.cuda_llama.CudaLlama`
holds them on the GPU (:class:`DevLayer`), and a mixture's experts (:class:`DevExperts`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from modelc.runtime.arch.decoder import DecoderBlock
from modelc.runtime.arch.decoder_block import block_mats
from modelc.runtime.arch.moe import Experts, route_logits
from modelc.runtime.arch.moe_oai import OaiBiases, swiglu_oai
from modelc.runtime.backends.cuda_backend import CudaBackend


class DevLayer:
    """One decoder layer's weights on the GPU (Q/K/V stacked, gate/up stacked), its norms,
    biases, window and RoPE frequencies; a mixture's experts as :class:`DevExperts`."""

    def __init__(self, be: CudaBackend, b: DecoderBlock, window: int, inv_freq: Any) -> None:
        cp = be.cp

        def vec(a: Any) -> Any:
            return None if a is None else cp.asarray(a)

        self.attn_norm = vec(b.attn_norm)  # (d,), or None: post-norms only (olmo2)
        self.ffn_norm = vec(b.ffn_norm)
        self.wqkv = be.dev.upload([b.wq, b.wk, b.wv])
        self.wo = be.dev.upload([b.wo])
        self.experts: DevExperts | None = None
        if b.experts is not None:
            self.experts = DevExperts(be, b.experts)
            self.wgu = self.wdown = None
            self.ff = 0  # the experts' buffers are their own
        else:
            assert b.w_gate is not None and b.w_up is not None and b.w_down is not None
            self.wgu = be.dev.upload([b.w_gate, b.w_up])
            self.wdown = be.dev.upload([b.w_down])
            self.ff = int(b.w_gate.shape[0])
        bias = None if b.bq is None else np.concatenate([b.bq, b.bk, b.bv])
        self.bias = None if bias is None else cp.asarray(bias)
        # (hd,) each (per head), or (nh hd,) and (nkv hd,) (over the whole projection: olmo2)
        self.q_norm, self.k_norm = vec(b.q_norm), vec(b.k_norm)
        self.post_attn_norm = vec(b.post_attn_norm)  # (d,) or None
        self.sinks, self.bo = vec(b.sinks), vec(b.bo)  # gpt-oss: (nh,) and (d,), or None
        self.post_ffw_norm = vec(b.post_ffw_norm)
        self.window, self.inv_freq = window, inv_freq

    def norm_qk(
        self, dev: Any, qkv: Any, n: int, heads: tuple[int, int, int], eps: float, whole: bool
    ) -> None:
        """The layer's Q/K norms of the first n rows of qkv, in place (none without them):
        per head (qwen3, gemma3), or (``whole``: olmo2) over the whole projection, as two
        row norms of Q's columns, then K's."""
        if self.q_norm is None:
            return
        nh, nkv, hd = heads
        if not whole:
            dev.head_norm(qkv, n, nh, nkv, hd, self.q_norm, self.k_norm, eps)
            return
        nq, nk = nh * hd, nkv * hd
        for part, w in ((qkv[:n, :nq], self.q_norm), (qkv[:n, nq : nq + nk], self.k_norm)):
            dev.rms_norm(part, None, n, w, eps, part)

    @property
    def nbytes(self) -> int:
        mats = (self.wqkv, self.wo, self.wgu, self.wdown)
        n = sum(w.nbytes for w in mats if w is not None)
        return n + (self.experts.nbytes if self.experts is not None else 0)


class DevExperts:
    """A mixture's FFN on the GPU: the router's logits, then each row's experts and their
    weights chosen on the host by the CPU's own :func:`~modelc.runtime.arch.moe.route_logits`
    from them (n x n_expert: small; softmax top-k renormalised as llama.cpp's
    ``build_moe_ffn`` -- the softmax of the chosen logits alone, as gpt-oss weighs them --
    or sigmoid scores, a bias for the choice, groups, scaled weights: GLM-4.5, DeepSeek);
    each chosen expert's gate+up and down; gpt-oss's (:mod:`~modelc.runtime.arch.moe_oai`)
    router and expert biases and clamped SwiGLU; shared experts (and qwen35moe's sigmoid
    gate on them) on every row.  Which experts a step uses is a host decision, so such a
    model's steps run without CUDA graphs."""

    def __init__(self, be: CudaBackend, e: Experts) -> None:
        self.e, self.softmax = e, be.softmax  # the routing's description, the host's softmax
        self.shared = None if e.shared is None else DevShared(be, e)
        self.router = be.dev.upload([e.router])  # (n_expert, d)
        self.gu = [be.dev.upload([g, u]) for g, u in zip(e.gate, e.up, strict=True)]
        self.down = [be.dev.upload([w]) for w in e.down]  # (d, ff) each
        self.ff = int(e.gate[0].shape[0])
        self.oai = None if e.oai is None else DevOai(be.cp, e.oai)

    @property
    def nbytes(self) -> int:
        n = self.router.nbytes + sum(w.nbytes for w in (*self.gu, *self.down))
        return n + (self.shared.nbytes if self.shared is not None else 0)

    def run(self, dev: Any, cp: Any, h: Any, n: int, x: Any) -> None:
        """x[:n] += the experts' FFN of h[:n] (both (rows, d) on the device)."""
        oai = self.oai
        logits = cp.empty((n, self.router.rows), np.float32)
        dev.matmul(self.router, h, n, logits)
        if oai is not None:
            logits += oai.router
        top_h, w_h = route_logits(self.e, logits.get(), self.softmax)  # the CPU's rule
        w = cp.asarray(w_h)
        for ex in np.unique(top_h):
            rows, slot = np.nonzero(top_h == ex)
            rd = cp.asarray(rows)
            m = len(rows)
            xe = cp.ascontiguousarray(h[rd])  # (m, d)
            gu = cp.empty((m, 2 * self.ff), np.float32)
            dev.matmul(self.gu[ex], xe, m, gu)
            y = cp.empty((m, h.shape[1]), np.float32)
            if oai is not None:
                g = oai.act(gu, int(ex), self.ff)
                dev.matmul(self.down[ex], g, m, y)
                y += oai.down[ex]
            else:
                swiglu_down(dev, cp, gu, m, self.ff, self.down[ex], y)
            y *= w[rd, cp.asarray(slot)][:, None]
            x[rd] += y  # rows are distinct within one expert
        if self.shared is not None:
            self.shared.run(dev, cp, h, n, x)


def swiglu_down(dev: Any, cp: Any, gu: Any, m: int, ff: int, down: Any, y: Any) -> None:
    """y[:m] = (silu(gate) * up) @ down.T for the gate+up product ``gu`` (m, 2 ff): a routed
    expert's and a shared expert's FFN after their gate+up product."""
    g = cp.empty((m, ff), np.float32)
    dev.act_mul(gu, m, ff, g)
    dev.matmul(down, g, m, y)


class DevShared:
    """A mixture's shared experts on the GPU (every row through them; qwen35moe: scaled by
    the sigmoid of the row's product with its gate), as :func:`~modelc.runtime.arch.moe.moe_ffn`."""

    def __init__(self, be: CudaBackend, e: Experts) -> None:
        assert e.shared is not None
        gate, up, down = e.shared
        self.gu, self.down = be.dev.upload([gate, up]), be.dev.upload([down])
        self.gate = None if e.shared_gate is None else be.dev.upload([e.shared_gate])
        self.ff = int(gate.shape[0])

    @property
    def nbytes(self) -> int:
        return self.gu.nbytes + self.down.nbytes + (self.gate.nbytes if self.gate else 0)

    def run(self, dev: Any, cp: Any, h: Any, n: int, x: Any) -> None:
        """x[:n] += the shared experts' SwiGLU of h[:n]."""
        gu = cp.empty((n, 2 * self.ff), np.float32)
        dev.matmul(self.gu, h, n, gu)
        y = cp.empty((n, h.shape[1]), np.float32)
        swiglu_down(dev, cp, gu, n, self.ff, self.down, y)
        if self.gate is not None:
            s = cp.empty((n, 1), np.float32)
            dev.matmul(self.gate, h, n, s)
            y *= 1.0 / (1.0 + cp.exp(-s))
        x[:n] += y


class DevOai:
    """gpt-oss's expert biases on the device, and its clamped SwiGLU: the CPU's own
    :func:`~modelc.runtime.arch.moe_oai.swiglu_oai` (its numpy calls run CuPy's on device
    arrays: NumPy's ``__array_ufunc__`` / ``__array_function__`` dispatch)."""

    def __init__(self, cp: Any, b: OaiBiases) -> None:
        self.router, self.gate, self.up = cp.asarray(b.router), cp.asarray(b.gate), cp.asarray(b.up)
        self.down, self.limit = cp.asarray(b.down), np.float32(b.limit)

    def act(self, gu: Any, ex: int, ff: int) -> Any:
        """swiglu_oai(g + b_gate, u + b_up) of expert ``ex``'s gate+up rows ``gu`` (m, 2 ff)."""
        return swiglu_oai(gu[:, :ff] + self.gate[ex], gu[:, ff:] + self.up[ex], self.limit)


def blocks_bytes(blocks: Sequence[DecoderBlock]) -> int:
    """The host bytes of the layers' weights (their matrices, a mixture's router, experts
    and shared experts): what the upload puts on the GPU."""
    n = sum(int(np.asarray(w.data).nbytes) for b in blocks for w in block_mats(b))
    for b in blocks:
        e = b.experts
        if e is not None:
            ws = (e.router, *e.gate, *e.up, *e.down, *(e.shared or ()), e.shared_gate)
            n += sum(int(np.asarray(w.data).nbytes) for w in ws if w is not None)
    return n


def pre_matmul(dev: Any, x: Any, h: Any, eps: float, n: int, norm: Any, w: Any, y: Any) -> None:
    """y[:n] = rms_norm(x) * norm @ w.T (through h), or x @ w.T where the layer has no
    pre-norm (olmo2: its norms come after attention and the FFN)."""
    if norm is None:
        dev.matmul(w, x, n, y)
    else:
        dev.norm_matmul(x, n, norm, eps, h, w, y)


def residual(
    dev: Any, x: Any, h: Any, eps: float, prod: tuple[Any, Any, int], post_norm: Any,
    q8: Any = None, bias: Any = None,
) -> None:  # fmt: skip
    """x += a @ w.T (+ bias: gpt-oss's attention output), or x += post_norm(a @ w.T (+ bias))
    (gemma; through h, free by then), for ``prod`` (w, a, n); ``q8``: a already quantized
    for the int8 GEMV."""
    w, a, n = prod
    if post_norm is None:
        dev.matmul(w, a, n, x, acc=True, q8=q8)
        if bias is not None:
            x[:n] += bias
    else:
        dev.matmul(w, a, n, h, q8=q8)
        if bias is not None:
            h[:n] += bias
        dev.rms_norm(h, None, n, post_norm, eps, x, acc=True)
