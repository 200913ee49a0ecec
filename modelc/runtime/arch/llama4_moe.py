"""Llama 4's mixture: sigmoid-scored top-k experts fed the scaled input, plus a shared expert.

Each token's router logits (``ffn_gate_inp``) pick its ``n_used`` top experts; each chosen
expert sees the token times ``sigmoid(logit)`` (the score scales the expert's *input*, not
its output), and a dense shared expert (``ffn_{gate,up,down}_shexp``) sees the token
itself: ``out = shared(h) + sum_e expert_e(h * sigmoid(logit_e))`` (transformers'
``Llama4TextMoe``; llama.cpp's ``build_moe_ffn`` with sigmoid gating and
``LLAMA_EXPERT_GATING_FUNC_SIGMOID`` weights before the FFN).
"""

from __future__ import annotations

import numpy as np

from modelc.runtime.arch.moe import Experts
from modelc.runtime.backend import Backend, F32Array, Weight

__all__ = ["llama4_moe_ffn"]


def _ffn(be: Backend, gate: Weight, up: Weight, down: Weight, x: F32Array) -> F32Array:
    g, u = be.matmul_many((gate, up), x)
    return be.matmul(down, be.silu_mul(g, u, out=g))


def llama4_moe_ffn(be: Backend, e: Experts, h: F32Array, out: F32Array) -> F32Array:
    """The mixture's output for the rows of ``h`` (n, d), into ``out`` (its shared expert:
    ``e.shared``, loaded by :func:`~modelc.runtime.arch.moe.load_experts`)."""
    assert e.shared is not None, "llama 4's mixture has a shared expert"
    logits = be.matmul(e.router, h)  # (n, n_expert)
    top = np.argsort(-logits, axis=1, kind="stable")[:, : e.n_used]  # (n, used)
    score = 1.0 / (1.0 + np.exp(-np.take_along_axis(logits, top, axis=1)))  # (n, used)
    out[...] = _ffn(be, *e.shared, h)
    for ex in np.unique(top):  # each expert once, on the rows routed to it
        rows, slot = np.nonzero(top == ex)
        xe = np.ascontiguousarray(h[rows] * score[rows, slot][:, None].astype(np.float32))
        out[rows] += _ffn(be, e.gate[ex], e.up[ex], e.down[ex], xe)
    return out
