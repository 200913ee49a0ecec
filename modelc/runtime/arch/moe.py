"""Mixtures of experts: a router picks each token's experts (llama.cpp's ``build_moe_ffn``).

In place of ffn_gate / ffn_up / ffn_down a mixture layer has a router ffn_gate_inp
(n_expert, d) and the experts stacked in ffn_gate_exps / ffn_up_exps (n_expert, ff, d) and
ffn_down_exps (n_expert, d, ff): each token goes through its ``n_expert_used`` most probable
experts (softmax over all), their outputs weighted by those probabilities renormalised to
sum to 1 (Mixtral as ``llama``, ``qwen3moe``).

A mixture with a :class:`~modelc.formats.ir.Routing` (``deepseek2``) routes as llama.cpp's
``build_moe_ffn``: softmax or sigmoid scores; the choice made on the scores plus
``exp_probs_b`` (V3's correction bias) among the ``n_group_used`` groups whose two best
such scores sum highest; the chosen scores as weights, renormalised if ``norm``, times
``scale``; and the shared experts (``ffn_{gate,up,down}_shexp``) added for every token.

A shared expert of ``qwen35moe`` (ffn_gate_inp_shexp (1, d) beside the shared expert's
weights) is scaled by ``sigmoid(h . gate_inp_shexp)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from modelc.errors import FormatError
from modelc.formats.ir import Routing
from modelc.runtime.arch.moe_oai import OaiBiases, load_oai, oai_moe_ffn
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.model import IntArray, TensorSource

__all__ = ["Experts", "load_experts", "moe_ffn", "route_logits"]


@dataclass(slots=True)
class Experts:
    """A mixture-of-experts FFN: the router and each expert's matrices (row views)."""

    router: Weight  # (n_expert, d)
    gate: list[Weight]  # n_expert x (ff, d)
    up: list[Weight]  # n_expert x (ff, d)
    down: list[Weight]  # n_expert x (d, ff)
    n_used: int  # experts a token goes through
    routing: Routing | None = None  # None: softmax top-k renormalised
    bias: F32Array | None = None  # (n_expert,) added to the scores for the choice only
    shared: tuple[Weight, Weight, Weight] | None = None  # shared experts' gate, up, down
    shared_gate: Weight | None = None  # (1, d): sigmoid of it scales the shared expert
    oai: OaiBiases | None = None  # gpt-oss: biases, the clamped SwiGLU (moe_oai)
    backend: Backend | None = None  # computes them where not the model's (--n-cpu-moe)


def load_experts(
    src: TensorSource, i: int, n_used: int, routing: Routing | None = None
) -> Experts | None:
    """Block ``i``'s experts, or None for a dense block."""
    p = f"blk.{i}."
    if not src.has(p + "ffn_gate_inp.weight"):
        return None
    shared = shared_gate = None
    if src.has(p + "ffn_up_shexp.weight"):  # shared experts (deepseek2, qwen35moe)
        shared = tuple(src.weight(f"{p}ffn_{n}_shexp.weight") for n in ("gate", "up", "down"))
        if src.has(p + "ffn_gate_inp_shexp.weight"):  # qwen35moe: its sigmoid gate
            shared_gate = src.weight(p + "ffn_gate_inp_shexp.weight")
    experts = Experts(
        router=src.weight(p + "ffn_gate_inp.weight"),
        gate=src.experts(p + "ffn_gate_exps.weight"),
        up=src.experts(p + "ffn_up_exps.weight"),
        down=src.experts(p + "ffn_down_exps.weight"),
        n_used=n_used,
        routing=routing,
        bias=src.vec(p + "exp_probs_b.bias") if src.has(p + "exp_probs_b.bias") else None,
        shared=shared,  # type: ignore[arg-type]
        shared_gate=shared_gate,
        oai=load_oai(src, i),
    )
    n = experts.router.shape[0]
    if not 0 < n_used <= n or not len(experts.gate) == len(experts.up) == len(experts.down) == n:
        raise FormatError(
            f"blk.{i}: {n} router rows, {len(experts.gate)} experts and "
            f"{n_used} used a token do not agree",
            path=src.ir.source.path,
        )
    return experts


def moe_ffn(be: Backend, e: Experts, h: F32Array, out: F32Array) -> F32Array:
    """The experts' FFN of the rows of ``h`` (n, d) into ``out``: each row through its
    ``e.n_used`` most probable experts, weighted by their renormalised probabilities (or
    as ``e.routing`` says), plus the shared experts."""
    if e.oai is not None:
        return oai_moe_ffn(be, e, h, out)
    top, w = route(be, e, h)
    _experts(be, e, h, top, w, out)
    if e.shared is not None:
        gate, up, down = e.shared
        g, u = be.matmul_many((gate, up), h)
        y = be.matmul(down, be.silu_mul(g, u, out=g))  # (n, d)
        if e.shared_gate is not None:  # qwen35moe: scaled by sigmoid(h . gate_inp_shexp)
            y *= 1.0 / (1.0 + np.exp(-be.matmul(e.shared_gate, h)))
        out += y
    return out


def route(be: Backend, e: Experts, h: F32Array) -> tuple[IntArray, F32Array]:
    """Each row's experts (n, used) and their weights (n, used)."""
    return route_logits(e, be.matmul(e.router, h), be.softmax)


def route_logits(
    e: Experts, logits: F32Array, softmax: Callable[[F32Array], F32Array]
) -> tuple[IntArray, F32Array]:
    """:func:`route` from the router's logits (n, n_expert) on the host (the CUDA mixture's
    choice too: :class:`~modelc.runtime.backends.cuda_layer.DevExperts`)."""
    r = e.routing
    if r is None:
        p = softmax(logits)
        top = np.argsort(-p, axis=1, kind="stable")[:, : e.n_used]  # (n, used)
        w = np.take_along_axis(p, top, axis=1)
        w /= w.sum(axis=1, keepdims=True)
        return top, w
    sigmoid = r.gating == "sigmoid"
    p = (np.float32(1) / (np.float32(1) + np.exp(-logits))) if sigmoid else softmax(logits)
    pick = p + e.bias if e.bias is not None else p.copy()  # (n, n_expert)
    if r.n_group > 1:  # only the groups whose two best scores sum highest
        groups = pick.reshape(len(logits), r.n_group, -1)  # (n, n_group, per group)
        score = np.sort(groups, axis=2)[:, :, -2:].sum(axis=2)  # (n, n_group)
        best = np.argsort(-score, axis=1, kind="stable")[:, : r.n_group_used]
        keep = np.zeros(score.shape, bool)
        np.put_along_axis(keep, best, True, axis=1)
        groups[~keep] = -np.inf
    top = np.argsort(-pick, axis=1, kind="stable")[:, : e.n_used]
    w = np.take_along_axis(p, top, axis=1).astype(np.float32)
    if r.norm:  # llama.cpp clamps the sum to the smallest f16 normal
        w /= np.maximum(w.sum(axis=1, keepdims=True), np.float32(6.103515625e-5))
    if r.scale != 1.0:
        w *= np.float32(r.scale)
    return top, w


def _experts(
    be: Backend, e: Experts, h: F32Array, top: IntArray, w: F32Array, out: F32Array
) -> F32Array:
    """The chosen experts' outputs of the rows of ``h``, weighted, into ``out``."""
    if len(h) == 1:  # a decode step: the chosen experts' gates and ups in one call
        order = np.argsort(top[0])  # experts in id order, as the loop below sums them
        ids, k = top[0, order], len(order)
        gu = np.empty((2, k, e.gate[ids[0]].shape[0]), np.float32)  # gates, then ups
        outs = [gu[0, j : j + 1] for j in range(k)] + [gu[1, j : j + 1] for j in range(k)]
        be.matmul_many([e.gate[i] for i in ids] + [e.up[i] for i in ids], h, outs)
        g = be.silu_mul(gu[0], gu[1], out=gu[0])  # (k, ff)
        ys = np.empty((k, h.shape[1]), np.float32)
        for j, i in enumerate(ids):
            be.matmul(e.down[i], g[j : j + 1], out=ys[j : j + 1])
        ys *= w[0, order][:, None]
        out[0] = ys.sum(axis=0)  # row by row in id order, as the loop below adds them
        return out
    out[...] = 0.0
    for ex in np.unique(top):  # each expert once, on the rows routed to it
        rows, slot = np.nonzero(top == ex)
        xe = np.ascontiguousarray(h[rows])
        g, u = be.matmul_many((e.gate[ex], e.up[ex]), xe)
        g = be.silu_mul(g, u, out=g)
        y = be.matmul(e.down[ex], g)
        y *= w[rows, slot][:, None]
        out[rows] += y
    return out
