"""Matmul kernel timings on SmolLM2-sized matrices: GEMV (n=1) and batch-8 GEMM.

Reports GFLOP/s (2*M*K*n per call) and GB/s of weight traffic (weight bytes per
call / time) for the CPU backend (fast int8-activation path, balanced, exact float
path, forced scalar path) and the numpy reference (float32 BLAS on weights
dequantized once; set OPENBLAS_NUM_THREADS to match --threads).

    .venv/bin/python bench/bench_kernels.py [--seconds 0.3] [--threads N] [--quick]

``--types`` instead times one 4096x4096 weight of each type that used to fall back to
numpy (issue 13) and Q4_K for scale, 1 and 8 rows: the numpy fallback as it ran (first
call: dequantize and cache a float32 copy; then float32 BLAS on the copy) against the C
kernels (fast and exact), as a markdown table:

    OPENBLAS_NUM_THREADS=2 .venv/bin/python bench/bench_kernels.py --types --threads 2
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import gguf
import numpy as np
from gguf.quants import quantize

from modelc.formats.ir import BLOCK_SIZES, DType
from modelc.runtime.backend import Backend, Weight
from modelc.runtime.backends.cpu import CpuBackend
from modelc.runtime.backends.numpy_ref import NumpyBackend

# (rows, cols, dtype): attn_q/o, ffn_gate/up, ffn_down, tied output head
SHAPES = [
    (576, 576, DType.Q4_1),
    (1536, 576, DType.Q4_1),
    (576, 1536, DType.Q4_1),
    (49152, 576, DType.Q8_0),
    (1536, 576, DType.Q4_0),
    (1536, 576, DType.Q8_0),
    (1536, 576, DType.F16),
]


def make_weight(rows: int, cols: int, dtype: DType, rng: np.random.Generator) -> Weight:
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if dtype is DType.F16:
        return Weight(dtype, (rows, cols), w.astype(np.float16))
    return Weight(dtype, (rows, cols), quantize(w, gguf.GGMLQuantizationType[dtype.name]))


# the types --types times: those issue 13 moved from the numpy fallback into C, and Q4_K
TYPES = [
    DType.Q4_K,
    DType.Q5_1,
    DType.Q5_K,
    DType.Q3_K,
    DType.Q2_K,
    DType.BF16,
    DType.IQ4_NL,
    DType.IQ4_XS,
]
# f16 scales (byte offset: value) of random blocks for the types gguf-py cannot quantize
_SCALES: dict[DType, dict[int, float]] = {
    DType.Q2_K: {80: 0.02, 82: 0.01},
    DType.Q3_K: {108: 0.02},
    DType.Q4_K: {0: 0.02, 2: 0.01},
    DType.Q5_K: {0: 0.01, 2: 0.01},
    DType.IQ4_NL: {0: 0.01},
    DType.IQ4_XS: {0: 0.001},
}


def make_any_weight(rows: int, cols: int, dtype: DType, rng: np.random.Generator) -> Weight:
    """``make_weight`` for every type: random blocks with sane scales where gguf-py has no
    quantizer, raw bf16 bits for BF16."""
    if dtype is DType.BF16:
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        bits = quantize(w, gguf.GGMLQuantizationType.BF16)
        return Weight(dtype, (rows, cols), np.ascontiguousarray(bits).view(np.uint16))
    if dtype in _SCALES:
        bs, ts = BLOCK_SIZES[dtype]
        raw = rng.integers(0, 256, (rows, cols // bs, ts), dtype=np.uint8)
        for off, value in _SCALES[dtype].items():
            raw[:, :, off : off + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
        return Weight(dtype, (rows, cols), raw.reshape(rows, -1))
    return make_weight(rows, cols, dtype, rng)


def bench_types(seconds: float, threads: int | None, size: int = 4096) -> None:
    """The --types table (see the module docstring)."""
    rng = np.random.default_rng(0)
    fast = CpuBackend(threads=threads)
    exact = CpuBackend(threads=threads, matmul="exact")
    print(f"threads={fast.threads} simd={fast.simd} weight {size}x{size}, ms per call\n")
    print(
        "| type | MB | numpy 1st call | numpy n=1 | numpy n=8 | C fast n=1 | C fast n=8 "
        "| C exact n=1 | C exact n=8 | fast n=1 speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dtype in TYPES:
        w = make_any_weight(size, size, dtype, rng)
        xs = {n: rng.standard_normal((n, size)).astype(np.float32) for n in (1, 8)}
        t0 = time.perf_counter()
        ref = NumpyBackend()  # a fresh cache: the first call dequantizes
        ref.matmul(w, xs[1])
        first = time.perf_counter() - t0
        ms: dict[str, float] = {}
        for name, b in (("numpy", ref), ("fast", fast), ("exact", exact)):
            for n, x in xs.items():
                ms[f"{name}{n}"] = 1e3 * time_call(lambda b=b, w=w, x=x: b.matmul(w, x), seconds)
        print(
            f"| {dtype.name} | {w.data.nbytes / 1e6:.1f} | {first * 1e3:.0f} | {ms['numpy1']:.2f} "
            f"| {ms['numpy8']:.2f} | {ms['fast1']:.2f} | {ms['fast8']:.2f} | {ms['exact1']:.2f} "
            f"| {ms['exact8']:.2f} | {ms['numpy1'] / ms['fast1']:.1f}x |",
            flush=True,
        )


def time_call(fn: Callable[[], object], seconds: float) -> float:
    """Median seconds per call over ``seconds`` of repetitions (after one warm-up)."""
    fn()
    samples: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(samples) < 3:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=0.3, help="time per measurement")
    ap.add_argument(
        "--threads", type=int, default=None, help="kernel threads (default MODELC_THREADS / all)"
    )
    ap.add_argument(
        "--quick", action="store_true", help="first four shapes, fast path and numpy only"
    )
    ap.add_argument(
        "--types", action="store_true", help="4096x4096 per type, numpy fallback vs C (issue 13)"
    )
    args = ap.parse_args()
    if args.types:
        bench_types(args.seconds, args.threads)
        return
    rng = np.random.default_rng(0)
    backends: dict[str, Backend] = {
        "cpu": CpuBackend(threads=args.threads),
        "cpu-balanced": CpuBackend(threads=args.threads, matmul="balanced"),
        "cpu-exact": CpuBackend(threads=args.threads, matmul="exact"),
        "cpu-scalar": CpuBackend(threads=args.threads, simd="scalar"),
        "numpy": NumpyBackend(),
    }
    shapes = SHAPES
    if args.quick:
        shapes = SHAPES[:4]
        backends = {k: backends[k] for k in ("cpu", "numpy")}
    threads = backends["cpu"].threads  # type: ignore[attr-defined]
    print(f"threads={threads} simd={backends['cpu'].simd}")  # type: ignore[attr-defined]
    print(
        f"{'shape':>18} {'dtype':>5} {'backend':>10} {'n':>2} {'us/call':>9} {'GFLOP/s':>8} {'GB/s':>6}"
    )
    for rows, cols, dtype in shapes:
        w = make_weight(rows, cols, dtype, rng)
        wbytes = w.data.nbytes
        for name, b in backends.items():
            if name == "numpy":
                b.matmul(w, np.zeros((1, cols), np.float32))  # dequantize once (cached)
            for n in (1, 8):
                x = rng.standard_normal((n, cols)).astype(np.float32)
                out = np.empty((n, rows), dtype=np.float32)
                dt = time_call(lambda b=b, w=w, x=x, out=out: b.matmul(w, x, out), args.seconds)
                gflops = 2.0 * rows * cols * n / dt / 1e9
                print(
                    f"{rows:>8}x{cols:<9} {dtype.value:>5} {name:>10} {n:>2} {dt * 1e6:>9.0f} "
                    f"{gflops:>8.1f} {wbytes / dt / 1e9:>6.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
