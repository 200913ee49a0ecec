"""The batch-1 GEMV kernels of the CUDA backend timed one by one, for each weight shape of
a 1.1B (TinyLlama) and an 8B (Llama 3) layer, each weight type, each split of a row over
warps (``wpr``) and each unroll of the inner loop: which settings read the blocks fastest.

Each launch reads a different copy of the weight (copies enough to pass 120 MB, so the
50 MB L2 holds none of them), 40 launches captured in one CUDA graph; the figure is the
graph's time over 40 (launch gaps included, as in a captured decode step) and the bytes
read a second.

    python3 bench/cuda_gemv_sweep.py [--types Q4_0,Q4_K,Q6_K,Q8_0] [--rows 1]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from modelc.formats.ir import DType
from modelc.runtime.backend import Weight
from modelc.runtime.backends.cuda import device
from modelc.runtime.backends.cuda_src import source
from tests.gen_cuda_models import random_blocks

SHAPES = {
    "1b qkv": (2560, 2048),
    "1b wo": (2048, 2048),
    "1b gate+up": (11264, 2048),
    "1b down": (2048, 5632),
    "8b qkv": (6144, 4096),
    "8b wo": (4096, 4096),
    "8b gate+up": (28672, 4096),
    "8b down": (4096, 14336),
}
# the inner loops' unroll, as in the source, and the variants tried
UNROLLS = {
    "gemvq": (
        "#pragma unroll 2\n    for (int g = k * 8",
        "#pragma unroll {u}\n    for (int g = k * 8",
    ),
    "gemv4": (
        "#pragma unroll 4\n    for (int g = k * 4",
        "#pragma unroll {u}\n    for (int g = k * 4",
    ),
}


def variant(u: int) -> Any:
    """The kernels compiled with both GEMVs' inner loops unrolled ``u`` times."""
    import cupy as cp

    src = source()
    for old, new in UNROLLS.values():
        assert old in src, old
        src = src.replace(old, new.format(u=u))
    return cp.RawModule(code=src, options=("-std=c++17",))


def time_graph(dev: Any, launch: Any, n: int = 40, reps: int = 5) -> float:
    """Seconds a launch, ``n`` launches (``launch(i)``) captured once and replayed."""
    cp = dev.cp
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        for i in range(3):
            launch(i)
        s.begin_capture()
        for i in range(n):
            launch(i)
        g = s.end_capture()
        g.launch(s)
        s.synchronize()
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(s)
        for _ in range(reps):
            g.launch(s)
        b.record(s)
        b.synchronize()
    return float(cp.cuda.get_elapsed_time(a, b)) / 1e3 / (n * reps)


def time_gemv(dev: Any, copies: list[Any], x: Any, n: int, y: Any, q8: Any) -> float:
    """Seconds a GEMV of n rows of x, each launch on the next copy of the weight."""

    def launch(i: int) -> None:
        p = copies[i % len(copies)]
        dev._gemv(p, x, p.cols, n, y, p.rows, False, q8)

    return time_graph(dev, launch)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q4_0,Q4_K,Q6_K,Q8_0")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--unrolls", default="0,8")  # 0: the source as it is
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    dev = device()
    cp = dev.cp
    rng = np.random.default_rng(0)
    mods = {u: (variant(u) if u else None) for u in map(int, args.unrolls.split(","))}
    base_fn = dict(dev.fn)
    wpr0 = dev._wpr
    print("| shape | type | MB | kernel | unroll | wpr | us | GB/s |")
    print("|---|---|---|---|---|---|---|---|")
    for sname in args.shapes.split(","):
        rows, cols = SHAPES[sname]
        x = cp.asarray(rng.standard_normal((args.rows, cols)).astype(np.float32))
        y = cp.zeros((args.rows, rows), np.float32)
        for tname in args.types.split(","):
            dt = DType[tname]
            data, _ = random_blocks(rng, dt, rows, cols, 0.02)
            one = dev.upload([Weight(dt, (rows, cols), data)])
            p0 = one.parts[0]
            copies = [p0] + [
                dev.upload([Weight(dt, (rows, cols), data)]).parts[0]
                for _ in range(max(0, int(120e6 // p0.data.nbytes)))
            ]
            mb = p0.data.nbytes / 1e6
            q8 = dev._quant_q8(x, cols, args.rows, cols)
            for kernel in ("gemv4", "gemvq"):
                if kernel == "gemvq" and p0.code not in (2, 8, 12, 13, 14):
                    continue
                for u, mod in mods.items():
                    for wpr in (1, 2, 4, 8):
                        if mod is not None:
                            for name in base_fn:
                                if name.startswith(kernel + "_"):
                                    dev.fn[name] = mod.get_function(name)
                        setattr(dev, "_wpr", lambda p, per, w=wpr: w)  # noqa: B010
                        qa = q8 if kernel == "gemvq" else None
                        try:
                            t = time_gemv(dev, copies, x, args.rows, y, qa)
                        except Exception as e:  # a split the row cannot take
                            print(
                                f"| {sname} | {tname} | {mb:.1f} | {kernel} | {u} | {wpr} | {type(e).__name__} | |"
                            )
                            continue
                        finally:
                            dev.fn.update(base_fn)
                            setattr(dev, "_wpr", wpr0)  # noqa: B010
                        print(
                            f"| {sname} | {tname} | {mb:.1f} | {kernel} | {u or 'src'} | {wpr} | "
                            f"{t * 1e6:.2f} | {p0.data.nbytes / t / 1e9:.0f} |"
                        )
            copies.clear()
            cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
