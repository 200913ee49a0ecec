"""Sampling a step of many rows: the batched sampler (``modelc/runtime/batch_sampler.py``)
on the device that holds the logits, against copying the logits to the host and sampling
each row with the host sampler (what ``--device-sampling off`` does).

The logits are SmolLM2's (``--gguf``: every position of a few prompts, tiled to
``--rows`` rows) or, without a model, heavy-tailed random ones of ``--vocab`` tokens; on
CuPy when it sees a GPU, else numpy.  Per setting: milliseconds a step, the mean of
``--reps`` steps after three warm-ups.

    python3 bench/sampler_bench.py [--gguf SMOLLM2.gguf] [--rows 64] [--vocab 151936]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from modelc.runtime.batch_sampler import BatchParams, sample_batch
from modelc.runtime.sampling import Sampler, SamplingParams

SETTINGS = {
    "greedy": SamplingParams(temperature=0.0),
    "llama-server defaults (t 0.8, k 40, p 0.95, min-p 0.05)": SamplingParams(
        temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1
    ),
    "t 0.8, top-p 0.95, repeat 1.1": SamplingParams(
        temperature=0.8, top_p=0.95, repetition_penalty=1.1, seed=1
    ),
    "t 1, 5 log-probs": SamplingParams(logprobs=5, seed=1),
}


def logits(gguf: Path | None, rows: int, vocab: int) -> np.ndarray[Any, Any]:
    if gguf is None:
        rng = np.random.default_rng(0)
        x = (rng.standard_t(3, (rows, vocab)) * 2).astype(np.float32)
        x[np.arange(rows), rng.integers(0, vocab, rows)] += 12  # a clear favourite a row
        return x
    from modelc.formats import load_model
    from modelc.runtime.arch import build
    from modelc.runtime.model import LanguageModel, SeqChunk

    lm = build(load_model(gguf))
    assert isinstance(lm, LanguageModel)
    ids = list(range(100, 132))
    x = lm.forward([SeqChunk(lm.new_cache(), ids, tuple(range(len(ids))))])
    return np.ascontiguousarray(x[np.arange(rows) % len(x)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    try:
        import cupy as xp

        def sync() -> None:
            xp.cuda.Stream.null.synchronize()
    except ImportError:
        xp = np

        def sync() -> None:
            pass

    host_x = logits(args.gguf, args.rows, args.vocab)
    dev_x = xp.asarray(host_x)
    print(f"{xp.__name__}: {host_x.shape[0]} rows of {host_x.shape[1]} logits")
    for name, p in SETTINGS.items():
        samplers = [Sampler(p, host_x.shape[1]) for _ in range(args.rows)]
        for _ in range(3):
            bp = BatchParams.gather(samplers)
            sample_batch(xp, dev_x, bp)
        sync()
        t0 = time.perf_counter()
        for _ in range(args.reps):
            bp = BatchParams.gather(samplers)
            sample_batch(xp, dev_x, bp)
        sync()
        batched = (time.perf_counter() - t0) / args.reps * 1e3
        t0 = time.perf_counter()
        for _ in range(3):
            copied = dev_x.get() if xp is not np else dev_x.copy()
            for s, row in zip(samplers, copied, strict=True):
                s.sample(row)
        host = (time.perf_counter() - t0) / 3 * 1e3
        print(f"{name}: batched {batched:.2f} ms a step, copy + host sampler {host:.2f} ms")


if __name__ == "__main__":
    main()
