"""A mixture-of-experts decode step, the one-row path against the batch path, alternating.

    .venv/bin/python -m bench.moe_decode_ab [GGUF] [--rounds 12] [--steps 10]

GGUF defaults to ``bench.big_models``' ``moe-q4_k_m``.  After 40 warm-up steps (every
expert used once, so its repacked copy exists), each round times ``--steps`` decode steps
of one sequence with ``moe_ffn`` as it is (one row: the chosen experts' gates and ups in
one call) and with the batch path forced (the row given twice, row 0 kept: the same
weights read, each expert its own calls), in alternating order; prints the medians and
the best rounds, in ms a step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

import modelc.runtime.arch.llama as llama
from modelc.formats import load_model
from modelc.runtime.arch import build
from modelc.runtime.backends.cpu import CpuBackend
from modelc.runtime.model import SeqChunk

DEFAULT = Path("/root/.cache/modelc-big/random-llama-moe-q4_k_m.gguf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", type=Path, nargs="?", default=DEFAULT)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    one_row = llama.moe_ffn

    def batch_path(be: Any, e: Any, h: Any, out: Any) -> Any:
        o2 = np.empty((2, h.shape[1]), np.float32)
        one_row(be, e, np.concatenate([h, h]), o2)
        out[0] = o2[0]
        return out

    model = build(load_model(args.gguf), CpuBackend(threads=args.threads))
    rng = np.random.default_rng(0)
    cache = model.new_cache(max_tokens=64 + 40 + args.rounds * 2 * args.steps)
    model.forward([SeqChunk(cache, rng.integers(100, 40000, 32).tolist())])

    def step() -> None:
        model.forward([SeqChunk(cache, [int(rng.integers(100, 40000))])])

    for _ in range(40):
        step()
    res: dict[str, list[float]] = {"one-row path": [], "batch path": []}
    for r in range(args.rounds):
        for name in list(res) if r % 2 else list(res)[::-1]:
            llama.moe_ffn = one_row if name == "one-row path" else batch_path
            ts = []
            for _ in range(args.steps):
                t = time.perf_counter()
                step()
                ts.append(time.perf_counter() - t)
            res[name].append(statistics.median(ts) * 1e3)
    llama.moe_ffn = one_row
    for name, v in res.items():
        print(f"{name}: median {statistics.median(v):.2f} ms, best {min(v):.2f} ms a step")


if __name__ == "__main__":
    main()
