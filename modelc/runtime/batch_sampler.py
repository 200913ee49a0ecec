"""Sampling every row of a step at once, on the device that holds the logits.

:class:`~modelc.runtime.sampling.Sampler` samples one row on the host; :func:`sample_batch`
does the same for a batch of rows in one pass of array operations written against an
array namespace ``xp`` (numpy on the CPU backends and in CI, CuPy on the GPU), so a GPU
step sends back only the chosen tokens and the log-probabilities asked for, not every
row's logits.  The semantics are the host sampler's, in its order (see
:mod:`modelc.runtime.sampling`): banned ids, logit bias, the repetition penalty over the
last ``repeat_last_n`` tokens, presence and frequency penalties; greedy rows take the
argmax; the others get top-k, top-p and min-p on the untempered distribution, then the
temperature over the tokens left, then one draw.

The draw is the same on both paths: one uniform ``u`` in [0, 1) from the request's own
seeded generator per sampled token (``Generator.random()``) picks the first token, in id
order, whose cumulative probability exceeds ``u`` (:func:`~modelc.runtime.sampling.draw`
on the host).  The host draws ``u`` after the step; here :meth:`BatchParams.gather`
draws it before.  So a seed gives the same tokens on either path, and a request may move
between them from one step to the next.  Greedy rows draw nothing, as on the host.

What the batch does not do (DRY, mirostat, typical-p, XTC, top-n-sigma, a reasoning
budget) stays on the host: :func:`batchable` says which samplers can come here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelc.runtime.sampling import Sample, Sampler

IntArray = np.ndarray[Any, np.dtype[np.int64]]
F32Array = np.ndarray[Any, np.dtype[np.float32]]
F64Array = np.ndarray[Any, np.dtype[np.float64]]


def batchable(sampler: Sampler) -> bool:
    """Whether :func:`sample_batch` does everything ``sampler``'s settings ask."""
    p = sampler.p
    return (
        sampler.budget is None
        and p.mirostat == 0
        and p.typical_p >= 1.0
        and p.top_n_sigma <= 0
        and not (p.xtc_probability > 0 and p.xtc_threshold <= 0.5)
        and not (p.dry_multiplier > 0 and p.dry_penalty_last_n != 0)
    )


@dataclass(frozen=True, slots=True)
class Edits:
    """Sparse changes to a batch of logits: one (row, token, value) per entry."""

    rows: IntArray  # (m,)
    toks: IntArray  # (m,)
    vals: F32Array  # (m,)

    @staticmethod
    def of(parts: list[tuple[int, IntArray, F32Array]]) -> Edits:
        if not parts:
            return Edits(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
        rows = np.repeat(
            np.array([r for r, _, _ in parts], np.int64), [len(t) for _, t, _ in parts]
        )
        toks = np.concatenate([t for _, t, _ in parts])
        vals = np.concatenate([v for _, _, v in parts])
        return Edits(rows, toks, vals)


@dataclass(frozen=True, slots=True)
class BatchParams:
    """What :func:`sample_batch` needs of each row's sampler, gathered on the host (small:
    per-row settings, the row's draw and the sparse penalty entries); which of the step's
    logit rows are sampled here, and which go back to the host as logits."""

    rows: IntArray  # (B,) the step's logit rows sampled here, in order
    host_rows: IntArray  # the step's other logit rows, returned (Drawn.logits)
    temperature: F64Array  # (B,) 0: greedy
    top_k: IntArray  # (B,) 0: off
    top_p: F64Array  # (B,)
    min_p: F64Array  # (B,)
    uniform: F64Array  # (B,) each sampled row's draw in [0, 1); nan for greedy rows
    n_logprobs: IntArray  # (B,) top-N alternatives to report; -1: no log-probabilities
    banned: Edits  # set to -inf (vals unused)
    bias: Edits  # added
    repeat: Edits  # the repetition penalty of each recent token's row (positive: divided)
    penalty: Edits  # presence + frequency amounts, subtracted

    @property
    def edited(self) -> bool:
        """Whether any row has banned ids, a bias or penalties (:func:`apply_edits`)."""
        return bool(len(self.banned.rows)) or self.reweighted

    @property
    def reweighted(self) -> bool:
        """Whether any row has a bias or penalties: edits beyond bans."""
        return any(len(e.rows) for e in (self.bias, self.repeat, self.penalty))

    @classmethod
    def gather(
        cls, samplers: Sequence[Sampler], rows: IntArray | None = None, n_rows: int = 0
    ) -> BatchParams:
        """Each sampler's settings, penalty entries and (for a sampled row) its draw,
        which advances its generator as the host's ``choice`` would; ``rows``: the logit
        row each one samples of a step's ``n_rows`` (default: all, in order)."""
        b = len(samplers)
        rows = np.arange(b, dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
        m = max(n_rows, b)
        if len(rows) and (rows.min() < 0 or rows.max() >= m):
            host_rows = np.setdiff1d(np.arange(m, dtype=np.int64), rows)
        else:  # the same rows, without setdiff1d's sorts
            keep = np.ones(m, bool)
            keep[rows] = False
            host_rows = np.flatnonzero(keep).astype(np.int64, copy=False)
        # the per-row settings a list each (a numpy store a row and setting cost more)
        ps = [s.p for s in samplers]
        temp = np.array([p.temperature for p in ps], np.float64)
        top_k = np.array([p.top_k for p in ps], np.int64)
        top_p = np.array([p.top_p for p in ps], np.float64)
        min_p = np.array([p.min_p for p in ps], np.float64)
        n_lp = np.array([-1 if p.logprobs is None else p.logprobs for p in ps], np.int64)
        uniform = np.full(b, np.nan)
        banned: list[tuple[int, IntArray, F32Array]] = []
        bias: list[tuple[int, IntArray, F32Array]] = []
        repeat: list[tuple[int, IntArray, F32Array]] = []
        penalty: list[tuple[int, IntArray, F32Array]] = []
        none = np.zeros(0, np.float32)
        for i, s in enumerate(samplers):
            p = s.p
            if p.banned_token_ids:
                banned.append((i, s.banned, none))
            if p.logit_bias:
                ids = np.fromiter(p.logit_bias.keys(), np.int64)
                bias.append((i, ids, np.fromiter(p.logit_bias.values(), np.float32)))
            if p.repetition_penalty != 1.0 and p.repeat_last_n > 0:
                recent = np.unique(np.asarray(s.history[-p.repeat_last_n :], np.int64))
                pen = np.full(len(recent), p.repetition_penalty, np.float32)
                repeat.append((i, recent, pen))
            if p.presence_penalty or p.frequency_penalty:
                ids = np.flatnonzero(s.counts)
                c = s.counts[ids]
                amount = c * p.frequency_penalty + (c > 0) * p.presence_penalty
                penalty.append((i, ids, amount.astype(np.float32)))
            if p.temperature > 0:
                uniform[i] = s.rng.random()
        return cls(
            rows, host_rows, temp, top_k, top_p, min_p, uniform, n_lp,
            Edits.of(banned), Edits.of(bias), Edits.of(repeat), Edits.of(penalty),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Drawn:
    """A batch's chosen tokens and log-probabilities, on the host."""

    tokens: IntArray  # (B,)
    logprob: F64Array  # (B,) of each chosen token under the raw distribution; nan: not asked
    top_ids: IntArray  # (B, N) the N most likely tokens, best first (N: the most any row asked)
    top_lps: F64Array  # (B, N) their log-probabilities
    logits: F32Array  # (H, n_vocab) the logits of the step's host rows (BatchParams.host_rows)

    def samples(self, params: BatchParams) -> list[Sample]:
        out = []
        tokens = self.tokens.tolist()
        for r, n in enumerate(params.n_logprobs.tolist()):
            tok = int(tokens[r])
            if n < 0:
                out.append(Sample(tok, float("nan")))
                continue
            ids, lps = self.top_ids[r, :n].tolist(), self.top_lps[r, :n].tolist()
            out.append(Sample(tok, float(self.logprob[r]), tuple(zip(ids, lps, strict=True))))
        return out


def _host(xp: Any, a: Any) -> Any:
    return a if xp is np else xp.asnumpy(a)


def _argsort_desc(xp: Any, a: Any) -> Any:
    """Stable argsort of each row by descending value (the host's ``argsort(-a, "stable")``;
    CuPy's sorts are always stable and take no ``kind``)."""
    return np.argsort(-a, axis=1, kind="stable") if xp is np else xp.argsort(-a, axis=1)


def apply_edits(xp: Any, logits: Any, bp: BatchParams) -> Any:
    """The logits after banned ids, bias and penalties (a copy when any applies)."""
    if not bp.edited:
        return logits
    x = logits.copy()
    if len(bp.banned.rows):
        x[xp.asarray(bp.banned.rows), xp.asarray(bp.banned.toks)] = -np.inf
    if len(bp.bias.rows):
        x[xp.asarray(bp.bias.rows), xp.asarray(bp.bias.toks)] += xp.asarray(bp.bias.vals)
    if len(bp.repeat.rows):
        at = (xp.asarray(bp.repeat.rows), xp.asarray(bp.repeat.toks))
        v, pen = x[at], xp.asarray(bp.repeat.vals)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # to +-inf
            x[at] = xp.where(v > 0, v / pen, v * pen)
    if len(bp.penalty.rows):
        x[xp.asarray(bp.penalty.rows), xp.asarray(bp.penalty.toks)] -= xp.asarray(bp.penalty.vals)
    return x


def _top_k(xp: Any, probs: Any, top_k: IntArray) -> tuple[IntArray, Any] | None:
    """Zero all but each row's ``top_k`` largest (ties with the k-th kept), in place; the
    rows it ran on and their candidates: the ids of the most any of them keeps (S_k, kmax),
    ascending.  None when no row has a top-k."""
    k_rows = np.flatnonzero((top_k > 0) & (top_k < probs.shape[1]))
    if not len(k_rows):
        return None
    kr, k = xp.asarray(k_rows), top_k[k_rows]
    kmax = int(k.max())
    sub = probs[kr]
    cand = xp.sort(xp.argpartition(-sub, kmax - 1, axis=1)[:, :kmax], axis=1)
    vals = xp.sort(xp.take_along_axis(sub, cand, axis=1), axis=1)  # ascending
    kth = vals[xp.arange(len(k_rows)), xp.asarray(kmax - k)]  # the k-th largest
    sub[sub < kth[:, None]] = 0.0
    probs[kr] = sub
    return k_rows, cand


def _top_p(xp: Any, probs: Any, top_p: F64Array, top_k: tuple[IntArray, Any] | None) -> None:
    """Keep each row's smallest prefix, by descending probability (ties by id), whose mass
    reaches its ``top_p`` (at least one token); in place, renormalised.  Rows that all
    went through top-k sort their candidates only, unless a token it kept is not among
    them (ties at the boundary): then, as the others, the whole row."""
    p_rows = np.flatnonzero(top_p < 1.0)
    if not len(p_rows):
        return
    pr = xp.asarray(p_rows)
    sub = probs[pr]
    ids = xp.broadcast_to(xp.arange(probs.shape[1]), sub.shape)
    if top_k is not None and np.isin(p_rows, top_k[0]).all():
        cand = top_k[1][xp.asarray(np.searchsorted(top_k[0], p_rows))]
        kept = (sub > 0).sum(axis=1)
        if bool((kept == (xp.take_along_axis(sub, cand, axis=1) > 0).sum(axis=1)).all()):
            ids = cand
    vals = xp.take_along_axis(sub, ids, axis=1)
    order = _argsort_desc(xp, vals)  # ids ascending: ties stay in id order, as the host's
    srt, ids = xp.take_along_axis(vals, order, axis=1), xp.take_along_axis(ids, order, axis=1)
    n_keep = (xp.cumsum(srt, axis=1) < xp.asarray(top_p[p_rows])[:, None]).sum(axis=1) + 1
    srt[xp.arange(srt.shape[1])[None, :] >= n_keep[:, None]] = 0.0
    sub[xp.arange(len(p_rows))[:, None], ids] = srt
    sub /= sub.sum(axis=1, keepdims=True)
    probs[pr] = sub


def _probs(xp: Any, x: Any, bp: BatchParams, rows: IntArray) -> Any:
    """The sampling distributions (S, n_vocab) f64 of the sampled ``rows`` of the processed
    logits ``x`` (S, n_vocab) f32, step for step as ``Sampler.probs``."""
    temp, top_p, min_p, top_k = bp.temperature[rows], bp.top_p[rows], bp.min_p[rows], bp.top_k[rows]
    x64 = x.astype(np.float64)
    best = x64.max(axis=1, keepdims=True)  # (S, 1)
    z = x64 - best
    probs = xp.exp(z)
    candidates = _top_k(xp, probs, top_k)
    probs /= probs.sum(axis=1, keepdims=True)
    _top_p(xp, probs, top_p, candidates)
    if (min_p > 0).any():  # a row with min_p 0 keeps every token (probs >= 0)
        thr = xp.asarray(min_p)[:, None] * probs.max(axis=1, keepdims=True)
        probs[probs < thr] = 0.0
    t_rows = np.flatnonzero(temp != 1.0)
    if len(t_rows):  # the temperature reshapes the tokens left
        tr, t = xp.asarray(t_rows), xp.asarray(temp[t_rows])[:, None]
        sub, zt = probs[tr], z[tr]
        if xp is np:  # the kept tokens' exp only (few, after a top-k), as the host's
            keep = sub > 0
            sub[keep] = np.exp(zt[keep] / np.broadcast_to(t, zt.shape)[keep])
            probs[tr] = sub
        else:  # every one: no sync for the kept tokens' count
            probs[tr] = xp.where(sub > 0, xp.exp(zt / t), sub)
    probs /= probs.sum(axis=1, keepdims=True)
    # a row whose best logit is not finite (+inf from a penalty or bias: those tokens only;
    # -inf or nan: every token alike)
    finite = xp.isfinite(best)
    if xp is np and finite.all():
        return probs
    only = ((x64 == best) | ~(best > 0)).astype(np.float64)
    only /= only.sum(axis=1, keepdims=True)
    return xp.where(finite, probs, only)


def _draw(xp: Any, probs: Any, u: F64Array) -> Any:
    """Each row's token: the first whose cumulative probability exceeds its ``u`` (the
    host's :func:`~modelc.runtime.sampling.draw`, row by row)."""
    cdf = xp.cumsum(probs, axis=1)
    cdf /= cdf[:, -1:]
    return (cdf <= xp.asarray(u)[:, None]).sum(axis=1)


def sample_batch(xp: Any, logits: Any, bp: BatchParams) -> Drawn:
    """Choose one token for each of ``bp.rows`` of a step's ``logits`` (rows, n_vocab) f32,
    an ``xp`` array that is not modified; the tokens and the log-probabilities the rows ask
    for come back to the host, with the logits of ``bp.host_rows``."""
    v = logits.shape[1]
    host = _host(xp, logits[xp.asarray(bp.host_rows)]) if len(bp.host_rows) else None
    if len(bp.rows) != logits.shape[0]:
        logits = logits[xp.asarray(bp.rows)]
    b = len(bp.rows)
    sampled = np.flatnonzero(bp.temperature > 0)  # the others are greedy
    if not len(sampled) and not bp.reweighted:
        picks = _greedy_banned(xp, logits, bp.banned)
        tokens = xp.asarray(picks) if (bp.n_logprobs >= 0).any() else None
        with np.errstate(all="ignore"):
            logprob, top_ids, top_lps = _logprobs(xp, logits, tokens, bp.n_logprobs)
        rest = host if host is not None else np.zeros((0, v), np.float32)
        return Drawn(picks, logprob, top_ids, top_lps, rest)
    x = apply_edits(xp, logits, bp)
    with np.errstate(all="ignore"):  # inf - inf in a row of +inf logits: replaced
        if len(sampled) == b:
            tokens = _draw(xp, _probs(xp, x, bp, sampled), bp.uniform)
        else:
            tokens = xp.argmax(x, axis=1)  # greedy rows; sampled ones overwritten
            if len(sampled):
                sr = xp.asarray(sampled)
                tokens[sr] = _draw(xp, _probs(xp, x[sr], bp, sampled), bp.uniform[sampled])
        logprob, top_ids, top_lps = _logprobs(xp, logits, tokens, bp.n_logprobs)
    rest = host if host is not None else np.zeros((0, v), np.float32)
    return Drawn(_host(xp, tokens).astype(np.int64), logprob, top_ids, top_lps, rest)


def _greedy_banned(xp: Any, logits: Any, banned: Edits) -> IntArray:
    """Each row's argmax with its ``banned`` ids at -inf, on the host, without editing a
    copy of the logits: the raw argmax is that token unless it is banned (no token before it
    ties it, or the raw argmax would be that one), so only rows whose raw pick is banned
    are edited and chosen again.  A greedy step with bans alone (``ignore_eos``: every
    benchmark's request) otherwise copied its whole logits to set one id a row."""
    picks = _host(xp, xp.argmax(logits, axis=1)).astype(np.int64)
    if not len(banned.rows):
        return picks  # type: ignore[no-any-return]
    hit = np.unique(banned.rows[picks[banned.rows] == banned.toks])
    if len(hit):  # x: those rows' logits (a copy), their bans at -inf
        x = logits[xp.asarray(hit)]
        mine = np.isin(banned.rows, hit)
        local = np.searchsorted(hit, banned.rows[mine])
        x[xp.asarray(local), xp.asarray(banned.toks[mine])] = -np.inf
        picks[hit] = _host(xp, xp.argmax(x, axis=1))
    return picks  # type: ignore[no-any-return]


def _logprobs(xp: Any, logits: Any, tokens: Any, n: IntArray) -> tuple[Any, Any, Any]:
    """The chosen tokens' log-probabilities (B,) under the raw distributions and the top-N
    (B, N) ids and log-probabilities, best first, on the host; nan / zeros where a row
    did not ask."""
    b, n_max = len(n), max(int(n.max()), 0)
    logprob, top_ids, top_lps = (
        np.full(b, np.nan),
        np.zeros((b, n_max), np.int64),
        np.zeros((b, n_max)),
    )
    rows = np.flatnonzero(n >= 0)
    if not len(rows):
        return logprob, top_ids, top_lps
    lr = xp.asarray(rows)
    lp = logits[lr].astype(np.float64)  # log-softmax, as sampling.log_softmax
    lp -= lp.max(axis=1, keepdims=True)
    lp -= xp.log(xp.exp(lp).sum(axis=1, keepdims=True))
    logprob[rows] = _host(xp, lp[xp.arange(len(rows)), tokens[lr]])
    if n_max:
        idx = xp.argpartition(-lp, n_max, axis=1)[:, :n_max]
        vals = xp.take_along_axis(lp, idx, axis=1)
        order = _argsort_desc(xp, vals)
        top_ids[rows] = _host(xp, xp.take_along_axis(idx, order, axis=1))
        top_lps[rows] = _host(xp, xp.take_along_axis(vals, order, axis=1))
    return logprob, top_ids, top_lps
