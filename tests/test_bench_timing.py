"""``modelc.bench.timing``: the order variants take turns in, the statistics of repeated
runs against the standard library's, and the greedy batch against each sequence alone."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import numpy as np

from modelc.bench.timing import GreedyBatch, Timing, alternate, median_ratio, stream_tps
from modelc.formats import load_model
from modelc.runtime.arch import build
from modelc.runtime.backends.cpu import CpuBackend
from modelc.runtime.model import CausalLM
from tests.assets import smollm2_gguf


def test_alternate_flips_the_order_each_round_and_drops_the_warmup() -> None:
    calls: list[str] = []

    def variant(name: str) -> Callable[[], int]:
        def run() -> int:
            calls.append(name)
            return len(calls)

        return run

    out = alternate({"a": variant("a"), "b": variant("b"), "c": variant("c")}, 3, warmup=1)
    assert calls == ["a", "b", "c", "c", "b", "a", "a", "b", "c", "c", "b", "a"]
    assert out == {"a": [6, 7, 12], "b": [5, 8, 11], "c": [4, 9, 10]}


def test_timing_statistics_match_the_standard_library() -> None:
    xs = (0.5, 0.1, 0.4, 0.2, 0.3, 0.9)
    t = Timing(xs)
    assert t.median == statistics.median(xs) and t.best == 0.1 and t.worst == 0.9
    q1, _, q3 = statistics.quantiles(xs, n=4)
    assert t.quartiles() == (q1, q3)
    assert t.rate(7.0) == 7.0 / statistics.median(xs) and t.rate(7.0, best=True) == 70.0
    assert median_ratio([2.0, 9.0, 4.0], [1.0, 3.0, 4.0]) == (2.0, 1.0, 3.0)
    # 3 streams, 10 tokens in all over 4.5 s: the 3 first tokens are not counted
    assert stream_tps([1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 4.5, 5.0, 5.5], 3) == 7 / 4.5


def test_greedy_batch_decodes_each_sequence_as_it_decodes_alone() -> None:
    """Batched rows equal lone rows bit for bit in the kernels, so the greedy tokens of
    sequences decoding together are those each one decodes alone."""
    lm = build(load_model(smollm2_gguf()), CpuBackend(threads=1))
    assert isinstance(lm, CausalLM)
    prompts = [[1, 504, 3120, 314], [1, 17, 2938, 28, 411, 95]]

    def tokens(batch: GreedyBatch, steps: int) -> list[list[int]]:
        out = [[int(t)] for t in batch.next]
        for _ in range(steps):
            batch.step()
            for seq, t in zip(out, batch.next, strict=True):
                seq.append(int(t))
        return out

    together = tokens(GreedyBatch(lm, prompts, 8), 6)
    alone = [tokens(GreedyBatch(lm, [p], 8), 6)[0] for p in prompts]
    assert together == alone
    t = GreedyBatch(lm, prompts, 4).run(4)
    assert len(t.seconds) == 4 and all(np.isfinite(t.seconds)) and t.total > 0
