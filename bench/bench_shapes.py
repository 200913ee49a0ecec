"""The repacked-weight kernels per weight type and shape, builds alternated call by call.

    .venv/bin/python -m bench.bench_shapes --model GGUF [--types Q4_K,Q6_K] [--rows 1,8]
        [--threads 2] [--reps 7] [--base OTHER.so ...]

For each (type, shape) of the model's repacked weights (the 512-row ones left out: a few
MB, they sit in the last-level cache) and x row count, ``kernels.matmul`` runs over every
weight of that shape in turn, reading the backend's own repacked copies; this checkout's
build and each ``--base`` build (another checkout's kernels .so) take turns, pass by pass,
in alternating order, and each prints the median pass as GB/s of repacked bytes.  Unlike
``bench.bench_repacked``, which sums a type over all its shapes, this shows which tensor a
type is slow on (a 1B's Q6_K ``ffn_down`` and output head, session 16).  The copies are
made by this checkout's build; a ``--base`` build with another repacked layout reads the
same bytes, so its figures are timings only.
"""

from __future__ import annotations

import argparse
import functools
import importlib
from typing import Any

import numpy as np

from bench.bench_repacked import load_build, model_weights
from modelc.bench.timing import time_alternating
from modelc.formats import load_model
from modelc.runtime.arch import build
from modelc.runtime.backends.cpu import TYPE_CODES, CpuBackend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="GGUF")
    ap.add_argument("--types", default=None, help="e.g. Q4_K,Q6_K (default: all repacked)")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--base", nargs="*", default=[], help="other builds' kernels .so files")
    args = ap.parse_args()
    builds: dict[str, Any] = {"this": importlib.import_module("modelc._kernels.kernels")}
    for path in args.base:
        builds[path] = load_build(path)
    be = CpuBackend()
    model = build(load_model(args.model), be)
    want = set(args.types.upper().split(",")) if args.types else None
    groups: dict[tuple[str, tuple[int, ...]], list[tuple[int, Any, int, Any]]] = {}
    for w in model_weights(model):
        raw, packed = be.operands(w)
        if packed is None or w.shape[0] == 512 or (want and w.dtype.name not in want):
            continue
        key = (w.dtype.name, tuple(w.shape))
        groups.setdefault(key, []).append((TYPE_CODES[w.dtype], raw, w.shape[1], packed))
    rng = np.random.default_rng(0)
    for (name, shape), items in groups.items():
        nbytes = sum(p.nbytes for *_, p in items)
        for n in [int(v) for v in args.rows.split(",")]:
            x = rng.standard_normal((n, shape[1])).astype(np.float32)
            out = np.empty((n, shape[0]), np.float32)

            def one_pass(mod: Any) -> None:
                for code, raw, kk, packed in items:  # noqa: B023
                    mod.matmul(code, raw, kk, x, out, be.simd, args.threads, be.tol, packed)  # noqa: B023

            ts = time_alternating(
                {k: functools.partial(one_pass, mod) for k, mod in builds.items()}, args.reps
            )
            figures = "  ".join(f"{k}: {v.rate(nbytes) / 1e9:5.1f} GB/s" for k, v in ts.items())
            print(f"{name} {shape[0]}x{shape[1]} ({len(items)}), {n} x row(s): {figures}")


if __name__ == "__main__":
    main()
