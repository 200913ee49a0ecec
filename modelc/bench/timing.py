"""Timing for the benchmarks: warm-up, repeated runs, variants alternated run by run,
medians and spreads, and the prefill / greedy-decode loops that every script times.

``modelc bench`` (:mod:`modelc.bench.offline`) and the scripts in ``bench/`` share these,
so a "tokens/s" means the same thing everywhere:

* :func:`repeat` / :func:`repeat_for`: one callable, after ``warmup`` untimed calls;
* :func:`alternate`: several variants (builds, modes, servers), each called once a round
  in an order that flips from round to round, so a shared machine's changing load falls
  on all of them alike; :func:`time_alternating` times them;
* :func:`forward_seconds` / :func:`prefill_seconds`: one ``forward`` of a batch, of one
  prompt in a fresh KV cache;
* :class:`GreedyBatch`: sequences prefilled (untimed), then decoded greedily together,
  one ``forward`` of all of them a step, each step timed.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np

if TYPE_CHECKING:
    from modelc.runtime.kv_cache import KVCache
    from modelc.runtime.model import LanguageModel, SeqChunk

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)  # a variant's name


@dataclass(frozen=True)
class Timing:
    """Seconds of the repeated runs of one thing."""

    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def worst(self) -> float:
        return max(self.seconds)

    @property
    def total(self) -> float:
        return sum(self.seconds)

    def quartiles(self) -> tuple[float, float]:
        """The first and third quartiles (both the median for fewer than two runs)."""
        if len(self.seconds) < 2:
            return self.median, self.median
        q1, _, q3 = statistics.quantiles(self.seconds, n=4)
        return q1, q3

    def rate(self, units: float, *, best: bool = False) -> float:
        """``units`` (tokens, MACs, bytes) a run over the median run's seconds (the best's)."""
        return units / (self.best if best else self.median)


def _seconds(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def repeat(fn: Callable[[], object], reps: int, *, warmup: int = 1) -> Timing:
    """``reps`` timed calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    return Timing(tuple(_seconds(fn) for _ in range(reps)))


def repeat_for(
    fn: Callable[[], object], seconds: float, *, min_reps: int = 3, warmup: int = 1
) -> Timing:
    """Timed calls of ``fn`` for about ``seconds`` (at least ``min_reps``), after ``warmup``."""
    for _ in range(warmup):
        fn()
    out: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(out) < min_reps:
        out.append(_seconds(fn))
    return Timing(tuple(out))


def alternate(
    variants: Mapping[K, Callable[[], T]], rounds: int, *, warmup: int = 0
) -> dict[K, list[T]]:
    """What each variant returns, once a round for ``rounds`` rounds, the variants taking
    turns in an order that flips from round to round (``warmup`` rounds first, kept out)."""
    names = list(variants)
    out: dict[K, list[T]] = {k: [] for k in names}
    for r in range(warmup + rounds):
        for k in names if r % 2 == 0 else names[::-1]:
            v = variants[k]()
            if r >= warmup:
                out[k].append(v)
    return out


def time_alternating(
    variants: Mapping[K, Callable[[], object]], reps: int, *, warmup: int = 1
) -> dict[K, Timing]:
    """:func:`alternate`, timing each call: ``reps`` runs of each variant after ``warmup``
    rounds."""
    runs = alternate(
        {k: functools.partial(_seconds, f) for k, f in variants.items()}, reps, warmup=warmup
    )
    return {k: Timing(tuple(v)) for k, v in runs.items()}


def median_ratio(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """Round by round ``a / b``: the median, lowest and highest of the ratios."""
    rs = [x / y for x, y in zip(a, b, strict=True)]
    return statistics.median(rs), min(rs), max(rs)


def stream_tps(stamps: Sequence[float], streams: int) -> float:
    """Aggregate tokens/s of ``streams`` concurrent streams from the arrival times of all
    their tokens: every token but the first ``streams`` (one a stream, after its prefill)
    over the time from the first token to the last."""
    return (len(stamps) - streams) / (max(stamps) - min(stamps))


def forward_seconds(lm: LanguageModel, batch: Sequence[SeqChunk]) -> float:
    """Seconds of one ``forward`` of ``batch``."""
    return _seconds(lambda: lm.forward(batch))


def prefill_seconds(lm: LanguageModel, ids: Sequence[int], kv: str = "f16") -> float:
    """Seconds of one ``forward`` of the prompt ``ids`` in a fresh ``kv`` cache."""
    from modelc.runtime.model import SeqChunk

    return forward_seconds(lm, [SeqChunk(lm.new_cache(kv, max_tokens=len(ids)), list(ids))])


class GreedyBatch:
    """``len(prompts)`` sequences, each prefilled with its prompt (untimed) in a fresh
    ``kv`` cache with room for ``max_new`` more tokens, then decoded greedily together:
    :meth:`run` times steps of one ``forward`` over all of them (each call continues the
    same sequences)."""

    def __init__(
        self, lm: LanguageModel, prompts: Sequence[Sequence[int]], max_new: int, kv: str = "f16"
    ) -> None:
        from modelc.runtime.model import SeqChunk

        self.lm = lm
        self.caches: list[KVCache] = [
            lm.new_cache(kv, max_tokens=len(p) + max_new + 1) for p in prompts
        ]
        logits = lm.forward(
            [SeqChunk(c, list(p)) for c, p in zip(self.caches, prompts, strict=True)]
        )
        self.next = np.argmax(logits, axis=1)  # (batch,)

    def step(self) -> None:
        from modelc.runtime.model import SeqChunk

        batch = [SeqChunk(c, [int(self.next[i])]) for i, c in enumerate(self.caches)]
        self.next = np.argmax(self.lm.forward(batch), axis=1)

    def run(self, steps: int) -> Timing:
        """Seconds of each of ``steps`` decode steps."""
        return Timing(tuple(_seconds(self.step) for _ in range(steps)))

    def tps(self, steps: int) -> float:
        """Aggregate tokens/s of ``steps`` steps: batch x steps over their total time."""
        return len(self.caches) * steps / self.run(steps).total


def decode_tps(
    lm: LanguageModel, prompts: Sequence[Sequence[int]], steps: int, kv: str = "f16"
) -> float:
    """Aggregate tokens/s of ``steps`` greedy steps of fresh sequences (:class:`GreedyBatch`)."""
    return GreedyBatch(lm, prompts, steps, kv).tps(steps)
