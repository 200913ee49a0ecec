"""Q4_K and Q6_K matmuls on repacked weights (the VNNI / zmm kernels), and a prefill.

Times ``kernels.matmul`` with each weight's repacked copy on a few layers of a Q4_K_M
model (block 0's gate and Q projections, Q4_K; blocks 0 and 1's down projections, Q6_K)
for the activation row counts given, and reports GMAC/s (M * K * rows per second) from
the fastest of ``--reps`` calls; ``--prefill`` also times whole-model forwards of 512
tokens after one untimed (tokens/s: median and best).  The machine's other load moves these a lot:
compare two builds by running this file alternately against each tree
(``PYTHONPATH=<tree>``) and compare medians over the rounds.

    PYTHONPATH=. .venv/bin/python bench/bench_repacked_kquant.py --rows 1,8,64,512 --prefill 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from modelc._kernels import kernels as kk  # type: ignore[attr-defined]
from modelc.formats import load_model
from modelc.runtime.arch import build
from modelc.runtime.arch.llama import Llama
from modelc.runtime.backends.cpu import TYPE_CODES, CpuBackend
from modelc.runtime.model import SeqChunk

MODEL = "/root/.cache/modelc-big/random-llama-1b-q4_k_m.gguf"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=MODEL, help="a Q4_K_M GGUF (Llama layout)")
    ap.add_argument("--rows", default="1,8,64,512", help="activation row counts")
    ap.add_argument("--reps", type=int, default=10, help="calls per measurement")
    ap.add_argument("--prefill", type=int, default=0, help="512-token forwards to time")
    args = ap.parse_args()
    be = CpuBackend()
    model = build(load_model(args.model), be)
    assert isinstance(model, Llama), "a Llama-layout model"
    b0, b1 = model.blocks[0], model.blocks[1]
    layers = {"gate": b0.w_gate, "wq": b0.wq, "down0": b0.w_down, "down1": b1.w_down}
    rng = np.random.default_rng(0)
    for name, w in layers.items():
        code, raw, (m, k) = TYPE_CODES[w.dtype], be._rows(w), w.shape
        packed = kk.repack(code, raw, k)
        for n in (int(r) for r in args.rows.split(",")):
            x = rng.standard_normal((n, k)).astype(np.float32)
            out = np.empty((n, m), np.float32)
            best = float("inf")
            for _ in range(args.reps):
                t = time.perf_counter()
                kk.matmul(code, raw, k, x, out, be.simd, be.threads, be.tol, packed)
                best = min(best, time.perf_counter() - t)
            gmac = m * k * n / best / 1e9
            print(
                f"{name:6s} {w.dtype.name} {m}x{k} rows {n:4d}: {best * 1e3:8.2f} ms {gmac:7.1f} GMAC/s"
            )
    if args.prefill:
        model.forward([SeqChunk(model.new_cache("f16"), list(range(512)))])  # warm-up
        ts = []
        for _ in range(args.prefill):
            tokens = rng.integers(0, 30000, 512).tolist()
            t = time.perf_counter()
            model.forward([SeqChunk(model.new_cache("f16"), tokens)])
            ts.append(time.perf_counter() - t)
        rates = [512 / t for t in ts]
        print(
            f"prefill 512 tokens, {be.threads} threads: median {statistics.median(rates):.1f} "
            f"best {max(rates):.1f} tok/s ({' '.join(f'{r:.1f}' for r in rates)})"
        )


if __name__ == "__main__":
    main()
