"""Llama 4's attention temperature tuning (Llama 4's NoPE layers, Mistral 3 / Ministral 3).

Past the original context the queries are scaled up by position, so attention stays sharp
over long sequences: ``q *= 1 + beta * ln(1 + floor((pos + offset) / floor_scale))`` (transformers'
``get_llama_4_attn_scale``; llama.cpp's ``llm_graph_input_attn_temp``, ``beta`` its
``attention.temperature_scale`` and ``floor_scale`` the original context).  Positions
below ``floor_scale`` are left as they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from modelc.runtime.backend import F32Array


def attn_temperature(
    pos: np.ndarray[Any, Any],
    beta: float,
    floor_scale: int,
    offset: float = 0.0,
    out: Any = None,
    xp: Any = np,
) -> F32Array:
    """Each row's query scale, (n, 1, 1) f32, for positions ``pos`` (n,) (plus ``offset``:
    llama 4 counts from 1), computed in ``out`` (n,) f32 where given (CUDA: a buffer of the
    step's, ``xp`` CuPy -- nothing allocated while a graph captures), each step in place."""
    t = xp.empty(len(pos), np.float32) if out is None else out
    t[...] = pos
    t += np.float32(offset)
    t /= np.float32(floor_scale)
    xp.floor(t, out=t)
    xp.log1p(t, out=t)
    t *= np.float32(beta)
    t += np.float32(1.0)
    res: F32Array = t.reshape(-1, 1, 1)
    return res
