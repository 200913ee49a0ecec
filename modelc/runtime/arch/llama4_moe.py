"""Llama 4's mixture: sigmoid-scored top-k experts fed the scaled input, plus a shared expert.

Each token's router logits (``ffn_gate_inp``) pick its ``n_used`` top experts; each chosen
expert sees the token times ``sigmoid(logit)`` (the score scales the expert's *input*, not
its output), and a dense shared expert (``ffn_{gate,up,down}_shexp``) sees the token
itself: ``out = shared(h) + sum_e expert_e(h * sigmoid(logit_e))`` (transformers'
``Llama4TextMoe``; llama.cpp's ``build_moe_ffn`` with sigmoid gating and
``LLAMA_EXPERT_GATING_FUNC_SIGMOID`` weights before the FFN).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modelc.runtime.arch.moe import Experts
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.model import TensorSource

__all__ = ["SharedExpert", "llama4_moe_ffn", "load_shared"]


@dataclass(slots=True)
class SharedExpert:
    """The dense FFN every token of a mixture layer also goes through."""

    gate: Weight  # (ff, d)
    up: Weight  # (ff, d)
    down: Weight  # (d, ff)


def load_shared(src: TensorSource, i: int) -> SharedExpert | None:
    """Block ``i``'s shared expert, or None."""
    p = f"blk.{i}.ffn_"
    if not src.has(p + "gate_shexp.weight"):
        return None
    names = (p + "gate_shexp.weight", p + "up_shexp.weight", p + "down_shexp.weight")
    return SharedExpert(*(src.weight(n) for n in names))


def _ffn(be: Backend, gate: Weight, up: Weight, down: Weight, x: F32Array) -> F32Array:
    g, u = be.matmul_many((gate, up), x)
    return be.matmul(down, be.silu_mul(g, u, out=g))


def llama4_moe_ffn(
    be: Backend, e: Experts, shared: SharedExpert, h: F32Array, out: F32Array
) -> F32Array:
    """The mixture's output for the rows of ``h`` (n, d), into ``out``."""
    logits = be.matmul(e.router, h)  # (n, n_expert)
    top = np.argsort(-logits, axis=1, kind="stable")[:, : e.n_used]  # (n, used)
    score = 1.0 / (1.0 + np.exp(-np.take_along_axis(logits, top, axis=1)))  # (n, used)
    out[...] = _ffn(be, shared.gate, shared.up, shared.down, h)
    for ex in np.unique(top):  # each expert once, on the rows routed to it
        rows, slot = np.nonzero(top == ex)
        xe = np.ascontiguousarray(h[rows] * score[rows, slot][:, None].astype(np.float32))
        out[rows] += _ffn(be, e.gate[ex], e.up[ex], e.down[ex], xe)
    return out
