"""The recurrent layers' C kernels against their numpy twins, in one process.

Two Qwen3.5-shaped random models (``tests/gen_qwen35.py``'s layer pattern: three Gated
DeltaNet layers then one gated full-attention layer): the tiny one of the tests, and a
larger one with Qwen3.5-9B's linear-attention heads (16 key heads, 32 value heads of 128,
a width-4 convolution) on a 1024-wide residual, Q8_0 as ``--outtype q8_0`` writes it.
Each is built twice on the same CPU backend: once as it runs (``causal_conv1d``,
``delta_scan`` in C) and once with those ops on the numpy reference (what ran before the
kernels).  Rounds alternate the two; each figure is the median of the rounds:

* prefill: one 512-token prompt into a fresh cache;
* decode: one step of 1 sequence, and of 8 sequences, each after a 32-token prompt.

Run ``python -m bench.recurrent_bench [--rounds N]``; ``--write PATH`` only writes the
larger model's GGUF (for ``bench.side_by_side --models PATH``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from modelc.formats import load_model
from modelc.runtime.arch import build
from modelc.runtime.backend import F32Array
from modelc.runtime.backends.cpu import CpuBackend
from modelc.runtime.backends.fallback import NumpyFallback
from modelc.runtime.model import LanguageModel, SeqChunk
from tests import gen_qwen35

PREFILL, PROMPT, VOCAB = 512, 32, 384
LARGE = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
}


class NumpyRecurrences(CpuBackend):
    """The CPU backend with the recurrent layers' ops on the numpy reference (before)."""

    causal_conv1d = NumpyFallback.causal_conv1d
    delta_scan = NumpyFallback.delta_scan
    ssm_scan = NumpyFallback.ssm_scan


def write_model(path: Path, shapes: dict[str, Any], q8: bool) -> Path:
    """A Qwen3.5-shaped GGUF of ``shapes`` (the generator's config overridden meanwhile)."""
    saved = dict(gen_qwen35.CONFIG)
    try:
        gen_qwen35.CONFIG.update(shapes, max_position_embeddings=2048)
        gen_qwen35.write_gguf(gen_qwen35.make_weights(), path, "qwen35", q8=q8)
    finally:
        gen_qwen35.CONFIG.clear()
        gen_qwen35.CONFIG.update(saved)
    return path


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def prefill(lm: LanguageModel, ids: list[int]) -> Callable[[], F32Array]:
    return lambda: lm.forward([SeqChunk(lm.new_cache("f32"), ids)])


def decode_step(lm: LanguageModel, n_seq: int, rng: np.random.Generator) -> Callable[[], object]:
    """One decode step of ``n_seq`` sequences, each prefilled with a prompt (not timed)."""
    caches = [lm.new_cache("f32") for _ in range(n_seq)]
    lm.forward([SeqChunk(c, rng.integers(0, VOCAB, PROMPT).tolist()) for c in caches])
    return lambda: lm.forward([SeqChunk(c, [int(rng.integers(0, VOCAB))]) for c in caches])


def measure(name: str, path: Path, rounds: int) -> None:
    ir = load_model(path)
    sides = {"numpy": NumpyRecurrences(), "C": CpuBackend()}
    models = {k: build(ir, be) for k, be in sides.items()}
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, PREFILL).tolist()
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        order = list(models.items()) if r % 2 == 0 else list(models.items())[::-1]
        for side, lm in order:
            assert isinstance(lm, LanguageModel)
            times.setdefault(("prefill 512", side), []).append(timed(prefill(lm, ids)))
            for n in (1, 8):
                step = decode_step(lm, n, rng)
                best = min(timed(step) for _ in range(5))  # the step's best of 5, a round
                times.setdefault((f"decode x{n}", side), []).append(best)
    print(f"\n{name} ({rounds} rounds, median; threads={sides['C'].threads})")
    for what in ("prefill 512", "decode x1", "decode x8"):
        before = statistics.median(times[(what, "numpy")])
        after = statistics.median(times[(what, "C")])
        toks = PREFILL if what.startswith("prefill") else int(what[-1])
        print(
            f"  {what:12s} numpy {before * 1e3:9.2f} ms ({toks / before:8.1f} tok/s)   "
            f"C {after * 1e3:9.2f} ms ({toks / after:8.1f} tok/s)   x{before / after:.2f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", choices=("tiny", "large"))
    ap.add_argument("--write", type=Path, help="write the larger model's GGUF here, then stop")
    args = ap.parse_args()
    if args.write:
        write_model(args.write, LARGE, True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.only != "large":
            measure("tiny qwen35 (f32)", write_model(Path(tmp) / "t.gguf", {}, False), args.rounds)
        if args.only != "tiny":
            large = write_model(Path(tmp) / "l.gguf", LARGE, True)
            measure("Qwen3.5-9B-headed qwen35, d=1024 (q8_0)", large, args.rounds)


if __name__ == "__main__":
    main()
