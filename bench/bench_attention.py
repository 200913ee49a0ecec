"""Decode attention over f32 and f16 KV caches: one engine step's attention on SmolLM2 shapes.

Every layer (30) of 8 sequences of 64-300 cached tokens (9 query heads, 3 KV heads of
64) attends one new token per sequence through ``CpuBackend.attention_batch``, the call
the engine makes per layer.  Each layer has its own caches (as in the engine), so the
K/V bytes come from memory, not from cache lines the previous layer left warm.

    .venv/bin/python bench/bench_attention.py [--threads 2] [--reps 30] [--window N] [--softcap C]

``--window`` / ``--softcap``: a sliding window (each query reads its last N positions) and
Gemma 2's soft-capped scores, as the kernels take them.  ``--simd a,b``: the same steps on
each SIMD level given (``CpuBackend(simd=...)``), one level after the other.

``--prefill N,...``: instead one layer's prefill attention of N tokens (a 1B Llama's shapes:
32 query heads over 8 KV heads of 64, f16 cache, causal), per level, alternating:

    .venv/bin/python bench/bench_attention.py --prefill 512,2048 --simd avx2,avx512vnni
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from modelc.runtime.backends.cpu import CpuBackend, available_simd
from modelc.runtime.kv_cache import KVCache, KVMode, KVShape

N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM = 30, 9, 3, 64
LENGTHS = (64, 100, 140, 180, 220, 260, 280, 300)


def step_ms(
    be: CpuBackend, mode: KVMode, reps: int, window: int = 0, softcap: float = 0.0
) -> tuple[float, float]:
    """Median and best milliseconds of one decode step's attention (all layers)."""
    rng = np.random.default_rng(0)
    shape = KVShape(N_LAYER, N_HEAD_KV, HEAD_DIM)
    caches = []
    for n in LENGTHS:
        c = KVCache(shape, 4096, mode)
        c.reserve(n)
        for layer in range(N_LAYER):
            kv = rng.standard_normal((2, n, N_HEAD_KV, HEAD_DIM)).astype(np.float32)
            c.write(layer, 0, kv[0], kv[1])
        c.advance(n)
        caches.append(c)
    qs = [rng.standard_normal((1, N_HEAD, HEAD_DIM)).astype(np.float32) for _ in LENGTHS]
    outs = [np.empty_like(q) for q in qs]
    p0s = [n - 1 for n in LENGTHS]
    scale = 1.0 / HEAD_DIM**0.5

    def step() -> None:
        for layer in range(N_LAYER):
            kvs = [c.read(layer, c.n) for c in caches]
            ks, vs = [k for k, _ in kvs], [v for _, v in kvs]
            be.attention_batch(qs, ks, vs, p0s, scale, outs, window=window, softcap=softcap)

    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3, min(times) * 1e3


def prefill(levels: list[str], threads: int, n: int, reps: int) -> None:
    """One causal prefill attention of n tokens per level, reps times, alternating."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((n, 32, 64)).astype(np.float32)
    k, v = (rng.standard_normal((n, 8, 64)).astype(np.float16) for _ in range(2))
    bes = {s: CpuBackend(threads=threads, simd=s) for s in levels}
    times: dict[str, list[float]] = {s: [] for s in levels}
    for _ in range(reps):
        for s, be in bes.items():
            t0 = time.perf_counter()
            be.attention(q, k, v, 0, 0.125)
            times[s].append(time.perf_counter() - t0)
    gmac = n * n / 2 * 64 * 32 * 2 / 1e9  # q.k and p.v over the causal half
    for s, ts in times.items():
        med = float(np.median(ts))
        print(
            f"prefill {n} {s}: {med * 1e3:.1f} ms median ({gmac / med:.0f} GMAC/s), best {min(ts) * 1e3:.1f} ms"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--window", type=int, default=0, help="sliding window (0: none)")
    ap.add_argument("--softcap", type=float, default=0.0, help="Gemma 2's score cap (0: none)")
    ap.add_argument("--simd", default="", help="comma-separated SIMD levels (default: the best)")
    ap.add_argument("--prefill", default="", help="comma-separated prompt lengths: prefill instead")
    args = ap.parse_args()
    levels = [s for s in args.simd.split(",") if s] or [""]
    if args.prefill:
        for n in (int(t) for t in args.prefill.split(",")):
            prefill([s or available_simd()[0] for s in levels], args.threads, n, min(args.reps, 9))
        return
    shape = KVShape(N_LAYER, N_HEAD_KV, HEAD_DIM)
    print(
        f"8 sequences x {LENGTHS[0]}-{LENGTHS[-1]} tokens, {N_LAYER} layers, {args.threads} threads"
    )
    for mode in (KVMode.F32, KVMode.F16):
        for s in levels:
            be = CpuBackend(threads=args.threads, simd=s or None)
            med, best = step_ms(be, mode, args.reps, args.window, args.softcap)
            kib = shape.bytes_per_token(mode) * sum(LENGTHS) / 1024
            print(
                f"{mode.value} {s or 'best'}: {med:.2f} ms median, {best:.2f} ms best;"
                f" K/V read {kib:.0f} KiB"
            )


if __name__ == "__main__":
    main()
