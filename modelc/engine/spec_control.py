"""Adaptive speculation: whether a request drafts this step, and how many tokens.

Verifying ``k`` drafted tokens is not free on the CPU: the step feeds ``k + 1`` rows
instead of one (attention over the whole context for each, ``k + 1`` rows of the
output head, a sample per row), so a step costs ``cost(k) = t(rows + k) / t(rows)``
of a plain one (SmolLM2-135M, one sequence: ~1.05 at k=1, ~1.2 at 2, ~1.4 at 4,
2.1-2.7 at 8; ``bench/spec_bench.py --cost``). It pays only when drafts are accepted
often enough, and how often depends above all on how the drafter found them: prompt
lookup's drafts after a 3-token match were accepted 76-99% of the time on SmolLM2,
after a 2-token match 20-33%, after a single token 6-15%.

* :class:`StepCost` learns ``t(rows) = base + per_row * rows`` from the engine's own
  decode-only steps (least squares with exponential forgetting), with a prior per-row
  ratio (0.15) until the observed row counts vary enough to fit; a ``frozen`` one keeps
  the prior and ignores the timings (``EngineOptions.spec_fixed_cost``).
* :class:`SpecController` (one per request) keeps, per match length (an "arm"), decayed
  counts of accepted and rejected draft tokens: a verification adds its accepted
  tokens, and one rejection unless all were taken, so ``a = accepted / (accepted +
  rejected + shrink)`` estimates the chance of each next draft token being right (the
  geometric model; ``shrink`` keeps drafts short while there is little evidence). With ``a`` one verification of ``k`` drafts yields ``E(a, k) = (1 - a^(k+1))
  / (1 - a)`` tokens; among ``B`` decoding sequences drafting ``k`` turns a step that
  yields ``B`` tokens in time 1 into one that yields ``B - 1 + E`` in time ``cost(k)``.
  The controller verifies the ``k`` (1..``n_max``, at most what the drafter offers)
  with the best ``gain = (B - 1 + E) / (B cost(k))`` when that gain is at least
  ``min_gain``; otherwise it decodes plainly and counts the skipped match. After
  ``probe_every`` skipped matches of an arm it verifies a one-token probe; a probe that
  does not bring the arm back above ``min_gain`` doubles that arm's interval (up to
  ``probe_max``). A request whose answer copies nothing thus stops drafting after a
  couple of rejected drafts and afterwards spends a one-token verification (~5% of a
  step) every 8..128 steps.
* Prompts shorter than ``min_prompt`` tokens never draft: prompt lookup has little to
  copy from there.

The decisions follow measured step times, so with sampling they would move the RNG
from run to run; the engine therefore lets a seeded sampling request not draft (greedy
output does not depend on the drafts at all). With a frozen :class:`StepCost` the
decisions depend on the tokens alone: the same request drafts the same way on an idle
machine and on a loaded one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SpecConfig:
    n_max: int = 8  # longest draft verified in one step (--spec-max)
    min_prompt: int = 128  # shorter prompts never draft (--spec-min-prompt)
    # acceptance assumed before the first verification, by matched n-gram length (0:
    # drafters without one); SmolLM2's drafts were accepted 6-15% after a 1-token
    # match, 20-33% after 2 and 76-99% after 3 (bench/RESULTS.md)
    priors: tuple[float, ...] = (0.5, 0.1, 0.3, 0.75)
    prior_weight: float = 2.0  # the priors count as this many verified tokens
    shrink: float = 0.5  # a = accepted / (accepted + rejected + shrink): little evidence,
    # short drafts (the first draft after a 3-token match verifies 2-3 tokens, not 5)
    decay: float = 0.6  # weight the old counts keep at each verification
    min_gain: float = 1.05  # expected speed-up of a step needed to draft
    probe_every: int = 8  # skipped matches of an arm before its first probe
    probe_max: int = 128  # the probe interval doubles up to this
    probe_len: int = 1  # tokens drafted by a probe


def expected_tokens(a: float, k: int) -> float:
    """Tokens one verification of ``k`` drafts yields when each is accepted with chance
    ``a`` (the accepted run plus the corrected or bonus token)."""
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


class StepCost:
    """Seconds of a decode step as ``base + per_row * rows``, fitted online.

    ``observe`` takes the decode-only steps the engine runs (``rows``: tokens fed);
    old steps fade by ``forget`` per step. Until the observed row counts vary enough
    for a fit (a lone request that never drafts always feeds one row), ``ratio`` uses
    ``prior_row`` (extra time per row as a share of a one-row step). A ``frozen`` model
    ignores what it is shown and always uses the prior.
    """

    def __init__(self, prior_row: float = 0.15, forget: float = 0.98, frozen: bool = False) -> None:
        self.prior_row, self.forget, self.frozen = prior_row, forget, frozen
        self._s = [0.0] * 5  # weighted sums of 1, x, x^2, y, x*y

    def observe(self, rows: int, seconds: float) -> None:
        if self.frozen:
            return
        f, x, y = self.forget, float(rows), seconds
        self._s = [v * f + d for v, d in zip(self._s, (1.0, x, x * x, y, x * y), strict=True)]

    def per_row(self, rows: int) -> float:
        """Extra time of one more row, as a share of a step of ``rows`` rows."""
        n, sx, sxx, sy, sxy = self._s
        var = n * sxx - sx * sx
        # at least a spread of ~1 row among ~4 effective steps before trusting the fit
        if n < 4.0 or var < 0.25 * n * n:
            return self.prior_row / (1.0 + self.prior_row * (rows - 1))
        beta = (n * sxy - sx * sy) / var
        alpha = (sy - beta * sx) / n
        t = alpha + beta * rows
        if t <= 0.0:
            return self.prior_row
        return min(max(beta / t, 0.02), 1.0)

    def ratio(self, rows: int, extra: int) -> float:
        """Time of a step with ``extra`` more rows than ``rows``, over the step's own."""
        return 1.0 + self.per_row(rows) * extra


class _Arm:
    """The acceptance estimate of drafts found one way (an n-gram length)."""

    def __init__(self, prior: float, weight: float, shrink: float, probe_every: int) -> None:
        self.num, self.den = prior * weight, weight  # decayed accepted / (accepted + rejected)
        self.shrink = shrink
        self.skipped = 0  # matches not drafted since the last verification
        self.interval = probe_every
        self.probing = False

    @property
    def accept(self) -> float:
        return self.num / (self.den + self.shrink)


class SpecController:
    """One request's drafting decisions (see the module docstring)."""

    def __init__(self, cfg: SpecConfig, prompt_len: int) -> None:
        self.cfg = cfg
        self.enabled = prompt_len >= cfg.min_prompt
        self._arms: dict[int, _Arm] = {}
        self.verifications = 0
        self.probes = 0

    def arm(self, match: int) -> _Arm:
        a = self._arms.get(match)
        if a is None:
            prior = self.cfg.priors[min(match, len(self.cfg.priors) - 1)]
            cfg = self.cfg
            a = self._arms[match] = _Arm(prior, cfg.prior_weight, cfg.shrink, cfg.probe_every)
        return a

    def best(
        self, accept: float, cost: Callable[[int], float], batch: int, room: int
    ) -> tuple[int, float]:
        """The draft length with the best expected gain for this step, and that gain."""
        best_k, best_g = 0, 1.0
        for k in range(1, min(self.cfg.n_max, room) + 1):
            g = (batch - 1 + expected_tokens(accept, k)) / (batch * cost(k))
            if g > best_g:
                best_k, best_g = k, g
        return best_k, best_g

    def draft_len(self, match: int, proposed: int, cost: Callable[[int], float], batch: int) -> int:
        """How many of the ``proposed`` tokens (found by a ``match``-token n-gram) to
        verify this step; 0: decode plainly.

        ``cost(k)``: a step with ``k`` more rows over a plain one; ``batch``: sequences
        decoding in the step.
        """
        if not self.enabled or proposed <= 0:
            return 0
        arm = self.arm(match)
        k, g = self.best(arm.accept, cost, batch, proposed)
        if g >= self.cfg.min_gain:
            return k
        arm.skipped += 1
        if arm.skipped > arm.interval:  # see whether these drafts got better
            arm.probing = True
            return min(self.cfg.probe_len, proposed)
        return 0

    def update(
        self, match: int, drafted: int, accepted: int, cost: Callable[[int], float], batch: int
    ) -> None:
        """A verification of ``drafted`` tokens (found by a ``match``-token n-gram) took
        ``accepted`` of them."""
        if drafted <= 0:
            return
        self.verifications += 1
        arm = self.arm(match)
        d = self.cfg.decay
        arm.num = d * arm.num + accepted
        arm.den = d * arm.den + accepted + (1 if accepted < drafted else 0)
        arm.skipped = 0
        if not arm.probing:
            return
        arm.probing = False
        self.probes += 1
        if self.best(arm.accept, cost, batch, self.cfg.n_max)[1] >= self.cfg.min_gain:
            arm.interval = self.cfg.probe_every
        else:
            arm.interval = min(2 * arm.interval, self.cfg.probe_max)

    def acceptance(self) -> dict[int, float]:
        """The current estimate per match length (for logs and tests)."""
        return {m: a.accept for m, a in sorted(self._arms.items())}
