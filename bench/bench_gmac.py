"""GMAC/s of the repacked-weight kernels on SmolLM2's weights, per type and x row count.

Q4_1: every layer's weights (Q, K, V, O, gate, up, down); Q8_0: the output head.  Each
weight is repacked (``kk.repack``) and ``kk.matmul`` timed on it with the backend's SIMD
level, threads and tolerance; the median and best of ``--reps`` passes over the weights of
a type (the best: the least disturbed by other work on a shared machine).
``--base`` times another build's module (e.g. the main checkout's) in the same process,
alternating pass by pass with this checkout's, so a shared machine's load hits both:

    .venv/bin/python -m bench.bench_gmac [--rows 1,8,64,512] [--reps 15]
    .venv/bin/python -m bench.bench_gmac --base ../main/modelc/_kernels/kernels.*.so
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from typing import Any

import numpy as np

from modelc.formats import load_model
from modelc.formats.ir import DType
from modelc.runtime.arch import build
from modelc.runtime.backends.cpu import TYPE_CODES, CpuBackend
from tests import assets


def load_build(path: str) -> Any:
    """Another build's kernels module (its .so file), alongside this checkout's."""
    spec = importlib.util.spec_from_file_location("base_build.kernels", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the SmolLM2 test asset)")
    ap.add_argument("--rows", default="1,8,64,512")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None, help="default: the backend's")
    ap.add_argument("--base", default=None, help="another build's kernels .so, timed alternately")
    args = ap.parse_args()
    from modelc._kernels import kernels as kk

    builds = {"this": kk}
    if args.base:
        builds["base"] = load_build(args.base)
    be = CpuBackend()
    nth = args.threads or be.threads
    model: Any = build(load_model(args.model or str(assets.smollm2_gguf())), be)
    layers = [w for b in model.blocks for w in (b.wq, b.wk, b.wv, b.wo, b.w_gate, b.w_up, b.w_down)]
    sets = {"q4_1": [w for w in layers if w.dtype is DType.Q4_1], "q8_0": [model.output]}
    rng = np.random.default_rng(0)
    print(
        f"simd {be.simd}, threads {nth}, "
        + ", ".join(f"{k} {m.__file__}" for k, m in builds.items())
    )
    for name, ws in sets.items():
        items = []
        for w in ws:
            code, raw, K = TYPE_CODES[w.dtype], be._rows(w), w.shape[1]
            items.append((code, raw, K, kk.repack(code, raw, K)))
        macs_row = sum(it[1].shape[0] * it[2] for it in items)
        for n in [int(v) for v in args.rows.split(",")]:
            xs = {
                K: rng.standard_normal((n, K)).astype(np.float32) for K in {it[2] for it in items}
            }
            outs = [np.empty((n, it[1].shape[0]), np.float32) for it in items]
            reps = args.reps if n < 64 else max(3, args.reps // 2)
            ts: dict[str, list[float]] = {k: [] for k in builds}
            for r in range(reps + 1):
                for k, mod in builds.items():  # alternately: drifts in the load hit both
                    t = time.perf_counter()
                    for (code, raw, K, packed), o in zip(items, outs, strict=True):
                        mod.matmul(code, raw, K, xs[K], o, be.simd, nth, be.tol, packed)
                    if r:  # the first pass warms up
                        ts[k].append(time.perf_counter() - t)
            for k in builds:
                med, best = statistics.median(ts[k]), min(ts[k])
                print(
                    f"{k} {name} {n:4d} row(s): median {med * 1e3:8.2f} ms"
                    f" {macs_row * n / med / 1e9:6.1f} GMAC/s,"
                    f" best {best * 1e3:8.2f} ms {macs_row * n / best / 1e9:6.1f} GMAC/s"
                )


if __name__ == "__main__":
    main()
