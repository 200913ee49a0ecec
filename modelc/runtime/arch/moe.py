"""Mixtures of experts: a router picks each token's experts (llama.cpp's ``build_moe_ffn``).

In place of ffn_gate / ffn_up / ffn_down a mixture layer has a router ffn_gate_inp
(n_expert, d) and the experts stacked in ffn_gate_exps / ffn_up_exps (n_expert, ff, d) and
ffn_down_exps (n_expert, d, ff): each token goes through its ``n_expert_used`` most probable
experts (softmax over all), their outputs weighted by those probabilities renormalised to
sum to 1 (Mixtral as ``llama``, ``qwen3moe``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modelc.errors import FormatError
from modelc.runtime.arch.moe_oai import OaiBiases, load_oai, oai_moe_ffn
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.model import TensorSource

__all__ = ["Experts", "load_experts", "moe_ffn"]


@dataclass(slots=True)
class Experts:
    """A mixture-of-experts FFN: the router and each expert's matrices (row views)."""

    router: Weight  # (n_expert, d)
    gate: list[Weight]  # n_expert x (ff, d)
    up: list[Weight]  # n_expert x (ff, d)
    down: list[Weight]  # n_expert x (d, ff)
    n_used: int  # experts a token goes through
    oai: OaiBiases | None = None  # gpt-oss: biases, the clamped SwiGLU (moe_oai)


def load_experts(src: TensorSource, i: int, n_used: int) -> Experts | None:
    """Block ``i``'s experts, or None for a dense block."""
    if not src.has(f"blk.{i}.ffn_gate_inp.weight"):
        return None
    experts = Experts(
        router=src.weight(f"blk.{i}.ffn_gate_inp.weight"),
        gate=src.experts(f"blk.{i}.ffn_gate_exps.weight"),
        up=src.experts(f"blk.{i}.ffn_up_exps.weight"),
        down=src.experts(f"blk.{i}.ffn_down_exps.weight"),
        n_used=n_used,
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
    ``e.n_used`` most probable experts, weighted by their renormalised probabilities."""
    if e.oai is not None:
        return oai_moe_ffn(be, e, h, out)
    p = be.softmax(be.matmul(e.router, h))  # (n, n_expert)
    top = np.argsort(-p, axis=1, kind="stable")[:, : e.n_used]  # (n, used)
    w = np.take_along_axis(p, top, axis=1)
    w /= w.sum(axis=1, keepdims=True)
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
