"""gpt-oss's mixture of experts (llama.cpp's ``build_moe_ffn`` with ``SOFTMAX_WEIGHT``
gating and ``SWIGLU_OAI``; transformers' ``GptOssMLP``).

Beside :mod:`modelc.runtime.arch.moe`'s tensors a layer has biases: the router's
``ffn_gate_inp.bias`` (n_expert,) and each expert's ``ffn_{gate,up}_exps.bias`` (n_expert,
ff) and ``ffn_down_exps.bias`` (n_expert, d).  A token goes through the ``n_used``
experts of largest router logit (bias included), weighted by the softmax of those
logits alone; an expert computes ``((clamp(u, -L, L) + 1) * g' * sigmoid(1.702 g')) Wdown
+ b_down`` with ``g' = min(g, L)``, ``g = h Wgate + b_gate``, ``u = h Wup + b_up`` and L the
``swiglu_limit`` (7).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from modelc.runtime.backend import Backend, F32Array
from modelc.runtime.model import TensorSource

if TYPE_CHECKING:
    from modelc.runtime.arch.moe import Experts

__all__ = ["ALPHA", "OaiBiases", "load_oai", "oai_moe_ffn", "swiglu_oai"]

ALPHA = np.float32(1.702)  # the sigmoid's gain (transformers' swiglu_alpha, llama.cpp's constant)


@dataclass(slots=True)
class OaiBiases:
    """One gpt-oss layer's router and expert biases and the SwiGLU's clamp."""

    router: F32Array  # (n_expert,)
    gate: F32Array  # (n_expert, ff)
    up: F32Array  # (n_expert, ff)
    down: F32Array  # (n_expert, d)
    limit: np.float32


def load_oai(src: TensorSource, i: int) -> OaiBiases | None:
    """Block ``i``'s biases, or None for a plain mixture (no router bias)."""
    p = f"blk.{i}."
    if not src.has(p + "ffn_gate_inp.bias"):
        return None
    return OaiBiases(
        router=src.vec(p + "ffn_gate_inp.bias"),
        gate=src.array(p + "ffn_gate_exps.bias"),
        up=src.array(p + "ffn_up_exps.bias"),
        down=src.array(p + "ffn_down_exps.bias"),
        limit=np.float32(src.ir.hparams.swiglu_limit or 7.0),
    )


def swiglu_oai(g: F32Array, u: F32Array, limit: np.float32) -> F32Array:
    """gpt-oss's clamped SwiGLU into ``g``: (clamp(u) + 1) * g' * sigmoid(alpha g')."""
    np.minimum(g, limit, out=g)
    np.clip(u, -limit, limit, out=u)
    u += np.float32(1.0)
    sig = np.exp(-ALPHA * g)
    sig += np.float32(1.0)
    g /= sig
    g *= u
    return g


def oai_moe_ffn(be: Backend, e: Experts, h: F32Array, out: F32Array) -> F32Array:
    """The experts' FFN of the rows of ``h`` (n, d) into ``out``: each row through the
    ``e.n_used`` experts of largest logit, weighted by the softmax over those logits.
    Each expert runs on the rows routed to it, experts in id order (a row's sum is the
    same whichever rows share its step)."""
    b = e.oai
    assert b is not None
    logits = be.matmul(e.router, h)  # (n, n_expert)
    logits += b.router
    top = np.argsort(-logits, axis=1, kind="stable")[:, : e.n_used]  # (n, used)
    w = np.take_along_axis(logits, top, axis=1)
    w = be.softmax(np.ascontiguousarray(w))  # (n, used)
    out[...] = 0.0
    for ex in np.unique(top):
        rows, slot = np.nonzero(top == ex)
        xe = np.ascontiguousarray(h[rows])
        g, u = be.matmul_many((e.gate[ex], e.up[ex]), xe)  # (r, ff) each
        g += b.gate[ex]
        u += b.up[ex]
        y = be.matmul(e.down[ex], swiglu_oai(g, u, b.limit))  # (r, d)
        y += b.down[ex]
        y *= w[rows, slot][:, None]
        out[rows] += y
    return out
