"""Attention sinks (gpt-oss): a learned logit per head in every softmax's denominator.

With the sink ``s_h`` of head h, a query's weights are ``exp(q·k_j) / (sum_j exp(q·k_j) +
exp(s_h))``: the plain attention output times ``Z / (Z + exp(s_h))`` =
``sigmoid(lse - s_h)``, ``lse`` the log of the query's plain softmax denominator
``log sum_j exp(q·k_j)`` (scaled scores, window and causal mask as the kernels apply
them).  So the backends' attention runs unchanged and each head's output is scaled
after it, ``lse`` computed here in numpy from the keys the cache holds (the rotated
keys the kernels read); as transformers' eager ``GptOssAttention`` and llama.cpp's
``ggml_soft_max_add_sinks``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from modelc.runtime.backend import F32Array
from modelc.runtime.model import SeqChunk

__all__ = ["apply_sinks"]


def apply_sinks(
    batch: Sequence[SeqChunk],
    slices: Sequence[slice],
    layer: int,
    q: F32Array,
    sinks: F32Array,
    scale: float,
    out: F32Array,
    window: int = 0,
) -> None:
    """Scale ``out`` (n, n_head, hd), layer ``layer``'s attention output over the caches
    (their new K/V written, not yet advanced), by each query and head's
    ``sigmoid(lse - sink)``; ``q`` (n, n_head, hd) the rotated queries."""
    n_head, hd = q.shape[1], q.shape[2]
    for c, sl in zip(batch, slices, strict=True):
        m = len(c.tokens)
        if m == 0:
            continue
        k, _ = c.cache.read(layer, c.cache.n + m)  # (rows, n_head_kv, hd) from the base
        rows, nkv = k.shape[0], k.shape[1]
        g = n_head // nkv
        qq = q[sl].reshape(m, nkv, g, hd).transpose(1, 2, 0, 3).reshape(nkv, g * m, hd)
        kk = np.asarray(k, np.float32).transpose(1, 2, 0)  # (nkv, hd, rows)
        s = np.matmul(qq, kk).reshape(nkv, g, m, rows)
        s *= np.float32(scale)
        qpos = c.cache.start(layer) + np.arange(m)[:, None]  # storage rows of the queries
        kpos = np.arange(rows)[None, :]
        seen = kpos <= qpos
        if window:
            seen &= kpos > qpos - window
        s = np.where(seen, s, np.float32(-np.inf))  # (nkv, group, m, rows)
        top = s.max(axis=-1, keepdims=True)
        lse = (top + np.log(np.exp(s - top).sum(axis=-1, keepdims=True)))[..., 0]
        lse = lse.reshape(n_head, m).T  # (m, n_head)
        factor = 1.0 / (1.0 + np.exp(sinks[None, :] - lse))
        out[sl] *= factor.astype(np.float32)[..., None]
