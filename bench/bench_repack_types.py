"""The weight types repacked in session 12 (Q4_0, Q5_0, Q5_1, IQ4_NL, IQ4_XS, Q2_K): their
repacked 8-row kernels against the kernels on the weights as stored, in one process,
alternating.

    .venv/bin/python -m bench.bench_repack_types [--types q4_0,q5_0,q5_1,iq4_nl,iq4_xs,q2_k]
        [--simd avx512vnni,avx2] [--rows 1,8,64,512] [--rounds 7] [--threads 2]

A random weight of each type (4096 x 2048, every block's f16 scales fixed so no value
is degenerate; Q4_0, Q5_0 and Q5_1 from gguf-py's quantizer) goes through
``kernels.matmul`` in fast mode with its repacked copy (``aux``) and without (the unpacking kernels each type had
before); each round times both back to back and the table gives each side's median
GMAC/s over the rounds and their ratio.  The matrix (1.2-1.6 MB a type) sits in the
last-level cache, so the 1-row column measures the kernels, not DRAM bandwidth.

``--base OTHER.so``: instead the repacked kernels of this build against another build's
(its kernels module, e.g. a checkout from before a kernel change), both on the same
repacked copy, alternating round by round:

    .venv/bin/python -m bench.bench_repack_types --types q4_0,q5_0,iq4_nl --simd avx512vnni --base /tmp/before.so
"""

from __future__ import annotations

import argparse
import importlib
import time
from typing import Any

import gguf
import numpy as np
from gguf.quants import quantize as gguf_quantize

from bench.bench_repacked import load_build
from modelc.runtime.backends.cpu import SIMD_LEVELS

kk: Any = importlib.import_module("modelc._kernels.kernels")

M, K = 4096, 2048
# type: (block columns, block bytes, {byte offset of an f16 scale: its value})
LAYOUTS: dict[str, tuple[int, int, dict[int, float]]] = {
    "iq4_nl": (32, 18, {0: 0.01}),
    "iq4_xs": (256, 136, {0: 0.001}),
    "q2_k": (256, 84, {80: 0.02, 82: 0.01}),
}


def weight(name: str, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    if name in ("q4_0", "q5_0", "q5_1"):
        w = rng.standard_normal((M, K)).astype(np.float32)
        return np.ascontiguousarray(gguf_quantize(w, gguf.GGMLQuantizationType[name.upper()]))
    bs, ts, scales = LAYOUTS[name]
    raw = rng.integers(0, 256, (M, K // bs, ts), dtype=np.uint8)
    for off, value in scales.items():
        raw[:, :, off : off + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    return np.ascontiguousarray(raw.reshape(M, -1))


def gmacs(
    code: int, raw: Any, x: Any, y: Any, simd: int, nth: int, aux: Any, mod: Any = None
) -> float:
    n = x.shape[0]
    reps = max(3, 600 // n)
    t = time.perf_counter()
    for _ in range(reps):
        (mod or kk).matmul(code, raw, K, x, y, simd, nth, 1e38, aux)
    return float(M * K * n * reps / (time.perf_counter() - t) / 1e9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="q4_0,q5_0,q5_1,iq4_nl,iq4_xs,q2_k")
    ap.add_argument("--simd", default="avx512vnni,avx2")
    ap.add_argument("--rows", default="1,8,64,512")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--base", default="", help="another build's kernels .so: repacked vs repacked")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    base = load_build(args.base) if args.base else None
    left = "base build's repacked" if base is not None else "as stored"
    print(f"| type | SIMD | x rows | {left} GMAC/s | repacked GMAC/s | ratio |")
    print("|---|---|---|---|---|---|")
    for name in args.types.split(","):
        code = getattr(kk, name.upper())
        raw = weight(name, rng)
        aux = kk.repack(code, raw, K)
        for level in args.simd.split(","):
            simd = SIMD_LEVELS[level]
            for n in (int(r) for r in args.rows.split(",")):
                x = rng.standard_normal((n, K)).astype(np.float32)
                y = np.empty((n, M), np.float32)
                stored, packed = [], []
                for _ in range(args.rounds):
                    other = None if base is None else aux  # the base build on the same copy
                    stored.append(gmacs(code, raw, x, y, simd, args.threads, other, base))
                    packed.append(gmacs(code, raw, x, y, simd, args.threads, aux))
                s, p = float(np.median(stored)), float(np.median(packed))
                print(f"| {name} | {level} | {n} | {s:.1f} | {p:.1f} | {p / s:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
