"""Token sampling: a chain of small logit processors built once per request.

Order of the chain (each step is skipped when its setting is neutral):

0. ``banned_token_ids``            set to -inf (the engine bans end-of-generation ids for ignore_eos)
1. ``logit_bias``                  added to the raw logits (token id -> bias)
2. repetition penalty              over the last ``repeat_last_n`` tokens (prompt included),
                                   llama.cpp / CTRL style: positive logits divided, negative multiplied
3. presence / frequency penalties  over the generated tokens (OpenAI semantics)
4. DRY                             over the last ``dry_penalty_last_n`` tokens (prompt included)
5. top-n-sigma                     on the logits
6. temperature == 0                greedy: argmax of the processed logits, no randomness
7. top-k, typical-p, top-p, min-p, XTC on the untempered distribution, then temperature
   over the tokens left and a draw from the per-request seeded RNG (llama.cpp's default
   ``samplers`` order: its chain puts temperature last, so its defaults mean the same here)

Mirostat (1 or 2) replaces step 5 and 7 as in llama.cpp: temperature, then mirostat's own
truncation of the whole distribution; its ``mu`` (target surprise, first ``2 * tau``) is
updated after each generated token.  The samplers themselves are in
:mod:`modelc.runtime.samplers`.

The draw (:func:`draw`): one uniform ``u`` in [0, 1) from the request's generator picks
the first token, in id order, whose cumulative probability exceeds ``u`` (what numpy's
``Generator.choice`` does).  The batched sampler (:mod:`modelc.runtime.batch_sampler`)
draws the same way, so a seed gives the same tokens on the host and on a device.

Log-probabilities (the chosen token's and the top-N alternatives) come from the raw
model logits (log-softmax before any processing), as OpenAI reports them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from modelc.errors import UsageError
from modelc.runtime import samplers
from modelc.runtime.backend import F32Array
from modelc.runtime.reasoning_budget import BudgetSampler, ReasoningBudget

Processor = Callable[[F32Array], None]  # in place on logits (n_vocab,)


# llama.cpp's further samplers: SamplingParams fields a request may set (no model default)
FURTHER_SAMPLERS = (
    "typical_p",
    "top_n_sigma",
    "xtc_probability",
    "xtc_threshold",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
)


@dataclass(slots=True)
class SamplingParams:
    """What a request asks of the sampler (and, in generate.py, of the loop)."""

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    logprobs: int | None = None  # top-N alternatives to report (0 = the chosen token only)
    max_tokens: int | None = None  # None: until end of turn (the engine caps it)
    stop: list[str] = field(default_factory=list)
    # ids that end generation besides the model's own end-of-generation ids (the engine adds those)
    stop_token_ids: list[int] = field(default_factory=list)
    banned_token_ids: list[int] = field(default_factory=list)  # never sampled (ignore_eos)
    # llama.cpp's further samplers, its defaults (each off)
    typical_p: float = 1.0  # 1 = off
    top_n_sigma: float = -1.0  # <= 0 = off
    xtc_probability: float = 0.0  # 0 = off
    xtc_threshold: float = 0.1  # > 0.5 = off
    mirostat: int = 0  # 0 off, 1 Mirostat, 2 Mirostat 2.0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dry_multiplier: float = 0.0  # 0 = off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64  # -1: the whole context
    dry_breaker_ids: list[int] = field(default_factory=list)  # tokens that end a DRY repeat
    reasoning_budget: ReasoningBudget | None = None  # a thinking trace's token budget

    def validate(self, n_vocab: int) -> None:
        """Raise UsageError naming the first out-of-range setting."""
        checks: list[tuple[bool, str]] = [
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (
                self.repetition_penalty > 0,
                f"repetition_penalty must be > 0, got {self.repetition_penalty}",
            ),
            (self.repeat_last_n >= 0, f"repeat_last_n must be >= 0, got {self.repeat_last_n}"),
            (
                -2 <= self.presence_penalty <= 2,
                f"presence_penalty must be in [-2, 2], got {self.presence_penalty}",
            ),
            (
                -2 <= self.frequency_penalty <= 2,
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}",
            ),
            (
                self.max_tokens is None or self.max_tokens >= 0,
                f"max_tokens must be >= 0, got {self.max_tokens}",
            ),
            (
                self.logprobs is None or 0 <= self.logprobs <= 20,
                f"logprobs must be in [0, 20], got {self.logprobs}",
            ),
            (0 < self.typical_p <= 1, f"typical_p must be in (0, 1], got {self.typical_p}"),
            (
                0 <= self.xtc_probability <= 1,
                f"xtc_probability must be in [0, 1], got {self.xtc_probability}",
            ),
            (
                0 <= self.xtc_threshold <= 1,
                f"xtc_threshold must be in [0, 1], got {self.xtc_threshold}",
            ),
            (self.mirostat in (0, 1, 2), f"mirostat must be 0, 1 or 2, got {self.mirostat}"),
            (self.mirostat_tau >= 0, f"mirostat_tau must be >= 0, got {self.mirostat_tau}"),
            (self.mirostat_eta >= 0, f"mirostat_eta must be >= 0, got {self.mirostat_eta}"),
            (self.dry_multiplier >= 0, f"dry_multiplier must be >= 0, got {self.dry_multiplier}"),
            (self.dry_base >= 1, f"dry_base must be >= 1, got {self.dry_base}"),
            (
                self.dry_allowed_length >= 0,
                f"dry_allowed_length must be >= 0, got {self.dry_allowed_length}",
            ),
            (
                self.dry_penalty_last_n >= -1,
                f"dry_penalty_last_n must be >= -1, got {self.dry_penalty_last_n}",
            ),
        ]
        for ok, msg in checks:
            if not ok:
                raise UsageError(msg)
        for tok, bias in self.logit_bias.items():
            if not 0 <= int(tok) < n_vocab:
                raise UsageError(
                    f"logit_bias token id {tok} is outside the vocabulary 0..{n_vocab - 1}"
                )
            if not -100 <= bias <= 100:
                raise UsageError(
                    f"logit_bias values must be in [-100, 100], got {bias} for token {tok}"
                )


@dataclass(frozen=True, slots=True)
class Sample:
    token: int
    logprob: float  # of ``token`` under the raw model distribution
    top: tuple[tuple[int, float], ...] = ()  # top-N (token, logprob), best first


def draw(probs: np.ndarray[Any, np.dtype[np.float64]], u: float) -> int:
    """The token a uniform ``u`` in [0, 1) picks from ``probs`` (n_vocab,): the first whose
    cumulative probability (normalised to end at 1) exceeds ``u``."""
    cdf = np.cumsum(probs)
    cdf /= cdf[-1]
    return int(np.searchsorted(cdf, u, side="right"))


def log_softmax(logits: F32Array) -> np.ndarray[Any, np.dtype[np.float64]]:
    x = logits.astype(np.float64)
    x -= x.max()
    x -= np.log(np.exp(x).sum())
    return x


def token_logprobs(
    logits: F32Array, tokens: Sequence[int], top_n: int
) -> list[tuple[float, tuple[tuple[int, float], ...]]]:
    """For each row of ``logits`` (rows, n_vocab): the log-probability of ``tokens[row]``
    under the raw distribution, and the ``top_n`` best (token, logprob), best first."""
    out = []
    for x, tok in zip(logits, tokens, strict=True):
        lp = log_softmax(x)
        top: tuple[tuple[int, float], ...] = ()
        if top_n:
            idx = np.argpartition(-lp, top_n)[:top_n]
            idx = idx[np.argsort(-lp[idx], kind="stable")]
            top = tuple((int(i), float(lp[i])) for i in idx)
        out.append((float(lp[int(tok)]), top))
    return out


class Sampler:
    """Built once per request; ``sample(logits)`` then ``accept(token)`` per step."""

    def __init__(self, params: SamplingParams, n_vocab: int, prompt: Sequence[int] = ()) -> None:
        params.validate(n_vocab)
        self.p = params
        self.n_vocab = n_vocab
        # a negative seed (schemas allow any int64, as OpenAI's) is its 64-bit two's complement
        self._seed = None if params.seed is None else params.seed % (1 << 64)
        self._rng: np.random.Generator | None = None  # made at the first draw: :attr:`rng`
        self.history: list[int] = list(prompt)  # prompt + generated
        self.counts = np.zeros(n_vocab, np.int32)  # generated-token counts
        self.banned = np.asarray(params.banned_token_ids, np.int64)  # (the batch's too)
        self.chain: list[Processor] = self._build_chain()
        # greedy with nothing but bans (ignore_eos): the raw argmax, unless it is banned
        only_bans = len(self.chain) == 1 and bool(params.banned_token_ids)
        self._bans_only = frozenset(params.banned_token_ids) if only_bans else None
        self._work: F32Array = np.empty(n_vocab, np.float32)
        self.mu = 2.0 * params.mirostat_tau  # mirostat's target surprise, updated per token
        self._drawn_from: np.ndarray[Any, np.dtype[np.float64]] | None = None  # for mu
        budget = params.reasoning_budget
        self.budget = BudgetSampler(budget) if budget is not None else None

    @property
    def rng(self) -> np.random.Generator:
        """The request's random stream, made at its first use: a greedy request never
        draws, and ``default_rng`` (seeding from the OS's entropy) cost a loaded GPU
        server's event loop ~2 % of its time when every request made one."""
        if self._rng is None:
            self._rng = np.random.default_rng(self._seed)
        return self._rng

    def _build_chain(self) -> list[Processor]:
        p, chain = self.p, []
        if p.banned_token_ids:
            banned = self.banned
            chain.append(lambda x: x.__setitem__(banned, -np.inf))
        if p.logit_bias:
            ids = np.fromiter(p.logit_bias.keys(), np.int64)
            vals = np.fromiter(p.logit_bias.values(), np.float32)
            chain.append(lambda x: np.add.at(x, ids, vals))
        if p.repetition_penalty != 1.0 and p.repeat_last_n > 0:
            chain.append(self._repetition)
        if p.presence_penalty or p.frequency_penalty:
            chain.append(self._presence_frequency)
        if p.dry_multiplier > 0 and p.dry_penalty_last_n != 0:
            chain.append(self._dry)
        if p.top_n_sigma > 0 and not p.mirostat:
            chain.append(lambda x: samplers.top_n_sigma(x, p.top_n_sigma))
        return chain

    def _dry(self, x: F32Array) -> None:
        p = self.p
        pen = samplers.dry_penalties(
            self.history,
            p.dry_multiplier,
            p.dry_base,
            p.dry_allowed_length,
            p.dry_penalty_last_n,
            frozenset(p.dry_breaker_ids),
        )
        if pen:
            x[np.fromiter(pen.keys(), np.int64)] -= np.fromiter(pen.values(), np.float32)

    def _repetition(self, x: F32Array) -> None:
        recent = np.unique(np.asarray(self.history[-self.p.repeat_last_n :], np.int64))
        if len(recent) == 0:
            return
        v = x[recent]
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # to +-inf
            x[recent] = np.where(
                v > 0, v / self.p.repetition_penalty, v * self.p.repetition_penalty
            )

    def _presence_frequency(self, x: F32Array) -> None:
        c = self.counts
        x -= (c * self.p.frequency_penalty + (c > 0) * self.p.presence_penalty).astype(np.float32)

    def process(self, logits: F32Array) -> F32Array:
        """The processed logits (a copy): bias and penalties applied."""
        x = self._work
        x[...] = logits
        for f in self.chain:
            f(x)
        return x

    def probs(self, x: F32Array) -> np.ndarray[Any, np.dtype[np.float64]]:
        """Sampling distribution (n_vocab,): top-k, top-p and min-p choose the tokens from
        the untempered distribution, then temperature reshapes it over those."""
        p = self.p
        z = x.astype(np.float64)
        best = z.max()
        if not np.isfinite(best):  # +inf logits (an extreme penalty or bias): those only
            only: np.ndarray[Any, np.dtype[np.float64]] = np.asarray(
                (z == best) if best > 0 else np.ones_like(z, dtype=bool), dtype=np.float64
            )
            only /= only.sum()
            return only
        z -= best
        if p.mirostat:
            t = z / p.temperature
            probs = (
                samplers.mirostat_v1(t, self.mu, self.n_vocab)
                if p.mirostat == 1
                else samplers.mirostat_v2(t, self.mu)
            )
            self._drawn_from = probs
            return probs
        probs = np.exp(z)
        if 0 < p.top_k < self.n_vocab:
            kth = np.partition(probs, -p.top_k)[-p.top_k]
            probs[probs < kth] = 0.0
        probs /= probs.sum()
        if p.typical_p < 1.0:
            samplers.typical(probs, p.typical_p)
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            # keep the smallest prefix whose mass reaches top_p (at least one token)
            n_keep = int(np.searchsorted(cum, p.top_p, side="left")) + 1
            probs[order[n_keep:]] = 0.0
            probs /= probs.sum()
        if p.min_p > 0.0:
            probs[probs < p.min_p * probs.max()] = 0.0
        if p.xtc_probability > 0 and p.xtc_threshold <= 0.5:
            probs /= probs.sum()
            if self.rng.random() <= p.xtc_probability:
                samplers.xtc(probs, p.xtc_threshold)
        if p.temperature != 1.0:
            keep = probs > 0
            probs[keep] = np.exp(z[keep] / p.temperature)
        probs /= probs.sum()
        return probs

    def sample(self, logits: F32Array) -> Sample:
        """Choose the next token from raw logits (n_vocab,), which are not modified."""
        forced = self.budget.forced_token() if self.budget is not None else None
        if forced is not None:  # the reasoning budget ends the trace
            tok = forced
        elif self.p.temperature == 0:
            tok = self._greedy(logits)
        else:
            probs = self.probs(self.process(logits) if self.chain else logits)
            tok = draw(probs, self.rng.random())
        if self.p.logprobs is None:
            return Sample(tok, float("nan"))
        lp = log_softmax(logits)
        top: tuple[tuple[int, float], ...] = ()
        if self.p.logprobs:
            idx = np.argpartition(-lp, self.p.logprobs)[: self.p.logprobs]
            idx = idx[np.argsort(-lp[idx], kind="stable")]
            top = tuple((int(i), float(lp[i])) for i in idx)
        return Sample(tok, float(lp[tok]), top)

    def _greedy(self, logits: F32Array) -> int:
        """The processed logits' argmax.  Bans only lower logits to -inf: when the raw
        argmax (the first best) is not banned it is also the first best once they are
        applied, with no copy of the row (a vocabulary's worth a token)."""
        if self.chain:
            if self._bans_only is not None:
                tok = int(np.argmax(logits))
                if tok not in self._bans_only:
                    return tok
            logits = self.process(logits)
        return int(np.argmax(logits))

    def accept(self, token: int) -> None:
        """Record a generated token (for the penalties and mirostat's ``mu``)."""
        self.history.append(token)
        self.counts[token] += 1
        if self.budget is not None:
            self.budget.accept(token)
        if self._drawn_from is not None:
            p = self.p
            chosen = float(self._drawn_from[token])
            if chosen > 0:
                self.mu = samplers.mirostat_mu(self.mu, chosen, p.mirostat_tau, p.mirostat_eta)
            self._drawn_from = None
