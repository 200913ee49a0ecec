"""llama.cpp's further samplers (``src/llama-sampler.cpp``), in numpy: DRY, top-n-sigma,
locally typical sampling, XTC and mirostat (v1 and v2).

Each works as llama.cpp's does on its candidate list; here the candidates are a whole
vocabulary row: logits (``-inf`` for a token removed) or probabilities (0 for one removed,
the rest summing to 1).  :class:`~modelc.runtime.sampling.Sampler` chains them.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from modelc.runtime.backend import F32Array

F64Array = np.ndarray[Any, np.dtype[np.float64]]

FLOAT_MAX_LOG = 88.7228391  # log(FLT_MAX): DRY clamps its exponent so the penalty stays finite


def dry_penalties(
    history: Sequence[int],
    multiplier: float,
    base: float,
    allowed_length: int,
    last_n: int,
    breakers: Collection[int],
) -> dict[int, float]:
    """DRY ("don't repeat yourself"): token -> the amount to subtract from its logit.

    A token that would extend a sequence already seen in the last ``last_n`` tokens
    (-1: all of ``history``) by more than ``allowed_length`` is penalised
    ``multiplier * base ** (length - allowed_length)``, where ``length`` is the longest
    such repeat.  A repeat never reaches back across a ``breakers`` token, and a breaker
    is never penalised itself (llama.cpp's single-token sequence breakers).
    """
    n = len(history) if last_n < 0 else min(len(history), last_n)
    if multiplier == 0.0 or base < 1.0 or n <= allowed_length:
        return {}
    last = list(history[len(history) - n :])
    rat = last[::-1]  # rat[i]: the i-th token from the end
    # a repeat may not extend back past the most recent breaker
    rep_limit = next((i for i, t in enumerate(rat) if t in breakers), n)
    if rep_limit < allowed_length:
        return {}
    # the suffix that also ends k places before the end (llama.cpp's Z-algorithm, plainly)
    r = np.asarray(rat, np.int64)
    worst: dict[int, int] = {}
    for k in range(1, n):
        differ = np.flatnonzero(r[: n - k] != r[k:])  # the suffix matches up to here
        length = min(int(differ[0]) if len(differ) else n - k, rep_limit)
        if length >= allowed_length:
            nxt = rat[k - 1]  # the token that followed that earlier occurrence
            worst[nxt] = max(worst.get(nxt, 0), length)
    max_exp = int(FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0
    out: dict[int, float] = {}
    for tok, length in worst.items():
        if tok in breakers:
            continue
        e = length - allowed_length
        if max_exp > 0:
            e = min(e, max_exp)
        out[tok] = multiplier * base**e
    return out


def top_n_sigma(x: F32Array, n: float) -> None:
    """Keep the logits within ``n`` standard deviations of the best (in place; the mean
    and deviation are over the finite logits)."""
    finite = x[np.isfinite(x)].astype(np.float64)
    if n <= 0.0 or len(finite) <= 1:
        return
    cut = finite.max() - n * finite.std()
    x[x < cut] = -np.inf


def typical(probs: F64Array, p: float) -> None:
    """Locally typical sampling (in place, renormalised): keep the tokens whose surprise
    is closest to the entropy until their mass exceeds ``p``."""
    idx = np.flatnonzero(probs)
    if p >= 1.0 or len(idx) == 0:
        return
    q = probs[idx]
    # llama.cpp's candidate order: by probability, best first
    order = np.argsort(-q, kind="stable")
    idx, q = idx[order], q[order]
    logq = np.log(q)
    entropy = -(q * logq).sum()
    by_typical = np.argsort(np.abs(-logq - entropy), kind="stable")
    cum = np.cumsum(q[by_typical])
    over = np.flatnonzero(cum > p)
    n_keep = int(over[0]) + 1 if len(over) else len(q)
    keep = np.zeros(len(probs), bool)
    keep[idx[by_typical[:n_keep]]] = True
    probs[~keep] = 0.0
    probs /= probs.sum()


def xtc(probs: F64Array, threshold: float) -> None:
    """Exclude top choices (in place, renormalised): of the tokens with probability at
    least ``threshold``, all but the least likely are removed (nothing if only one is)."""
    idx = np.flatnonzero(probs)
    if threshold > 0.5 or len(idx) < 2:
        return
    q = probs[idx]
    order = idx[np.argsort(-q, kind="stable")]
    n_above = int(np.count_nonzero(probs[order] >= threshold))
    if n_above > 1:  # llama.cpp's pos_last > 0
        probs[order[: n_above - 1]] = 0.0
        probs /= probs.sum()


def _softmax(z: F64Array) -> F64Array:
    e: F64Array = np.exp(z - z.max())
    out: F64Array = e / e.sum()
    return out


def mirostat_v1(z: F64Array, mu: float, n_vocab: int, m: int = 100) -> F64Array:
    """Mirostat 1.0's distribution over the tempered logits ``z``: Zipf's exponent
    estimated from the ``m`` most likely tokens sets a top-k for the surprise ``mu``."""
    probs = _softmax(z)
    order = np.argsort(-probs, kind="stable")
    top = probs[order[: min(m, len(probs))]]
    i = np.arange(len(top) - 1, dtype=np.float64)
    t = np.log((i + 2) / (i + 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        b = np.log(top[:-1] / top[1:])
        s_hat = float((t * b).sum() / (t * t).sum())
        eps = s_hat - 1
        k_f = ((eps * 2.0**mu) / (1 - float(n_vocab) ** -eps)) ** (1 / s_hat)
    k = max(int(k_f), 1) if math.isfinite(k_f) else len(probs)
    out = np.zeros_like(probs)
    kept = order[: min(k, len(probs))]
    out[kept] = probs[kept]
    out /= out.sum()
    return out


def mirostat_v2(z: F64Array, mu: float) -> F64Array:
    """Mirostat 2.0's distribution over the tempered logits ``z``: the most likely tokens
    up to the first whose surprise (-log2 p) exceeds ``mu`` (at least one)."""
    probs = _softmax(z)
    order = np.argsort(-probs, kind="stable")
    with np.errstate(divide="ignore"):
        surprise = -np.log2(probs[order])
    over = np.flatnonzero(surprise > mu)
    n_keep = max(int(over[0]) if len(over) else len(order), 1)
    out = np.zeros_like(probs)
    kept = order[:n_keep]
    out[kept] = probs[kept]
    out /= out.sum()
    return out


def mirostat_mu(mu: float, p_chosen: float, tau: float, eta: float) -> float:
    """Mirostat's update after a draw: ``mu -= eta * (surprise - tau)``, the surprise
    being ``-log2`` of the chosen token's probability in the truncated distribution."""
    return mu - eta * (-math.log2(p_chosen) - tau)
