"""Matmul kernel timings on SmolLM2-sized matrices: GEMV (n=1) and batch-8 GEMM.

Reports GFLOP/s (2*M*K*n per call) and GB/s of weight traffic (weight bytes per
call / time) for the CPU backend (fast int8-activation path, balanced, exact float
path, forced scalar path) and the numpy reference (float32 BLAS on weights
dequantized once; set OPENBLAS_NUM_THREADS to match --threads).

    .venv/bin/python bench/bench_kernels.py [--seconds 0.3] [--threads N] [--quick]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import gguf
import numpy as np
from gguf.quants import quantize

from modelc.formats.ir import DType
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
    args = ap.parse_args()
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
