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

from modelc.errors import UsageError
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
    with np.errstate(all="ignore"):  # a flat or one-token distribution, a runaway mu: all k
        b = np.log(top[:-1] / top[1:])
        s_hat = np.float64((t * b).sum() / (t * t).sum())
        eps = s_hat - 1
        k_f = float(((eps * np.exp2(mu)) / (1 - np.float64(n_vocab) ** -eps)) ** (1 / s_hat))
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


# llama.cpp's default ``samplers`` order (common/common.h), with its one-letter codes and
# the settings that turn each stage off when a request's own list leaves it out
CHAIN: tuple[tuple[str, str, dict[str, float]], ...] = (
    (
        "penalties",
        "e",
        {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0},
    ),
    ("dry", "d", {"dry_multiplier": 0.0}),
    ("top_n_sigma", "s", {"top_n_sigma": -1.0}),
    ("top_k", "k", {"top_k": 0}),
    ("typ_p", "y", {"typical_p": 1.0}),
    ("top_p", "p", {"top_p": 1.0}),
    ("min_p", "m", {"min_p": 0.0}),
    ("xtc", "x", {"xtc_probability": 0.0}),
    ("temperature", "t", {"temperature": 1.0}),
)
_ALIASES = {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p", "typical_p": "typ_p"}


def chain_settings(samplers: str | Sequence[str]) -> dict[str, float]:
    """The settings that run llama.cpp's ``samplers`` list (names, or a string of its
    one-letter codes): the stages left out are turned off.  Raises UsageError for a
    sampler modelc does not have or an order other than llama.cpp's default."""
    by_code = {code: name for name, code, _ in CHAIN}
    if isinstance(samplers, str):
        names = [by_code.get(ch, ch) for ch in samplers]
    else:
        names = [s.lower().replace("-", "_") for s in samplers]
        names = [_ALIASES.get(n, n) for n in names]
    order = [name for name, _, _ in CHAIN]
    plain = {n.replace("_", ""): n for n in order}
    names = [plain.get(n.replace("_", ""), n) for n in names]
    unknown = [n for n in names if n not in order]
    if unknown:
        raise UsageError(
            f"samplers: {unknown[0]!r} is not a sampler modelc has (it has {', '.join(order)})",
            param="samplers",
        )
    pos = [order.index(n) for n in names]
    if pos != sorted(set(pos)):
        raise UsageError(
            "samplers: modelc runs its samplers in llama.cpp's default order "
            f"({', '.join(order)}); leave out any, but do not reorder or repeat them",
            param="samplers",
        )
    off: dict[str, float] = {}
    for name, _, settings in CHAIN:
        if name not in names:
            off.update(settings)
    return off
