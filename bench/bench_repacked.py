"""The repacked-weight kernels (Q4_1, Q8_0, IQ4_NL, IQ4_XS, Q2_K to Q6_K) and the model steps they serve.

    .venv/bin/python -m bench.bench_repacked [--model GGUF] [--types q4_k,q6_k]
        [--rows 1,8,64,512] [--reps 15] [--base OTHER.so] [--steps] [--rounds 8]

Kernels (always): per weight type in ``--types`` (default: every repacked type the model
holds) and x row count, ``kernels.matmul`` on each of the model's weights of that type in
turn, read from the backend's own repacked copy (``CpuBackend.operands``); a pass over a
1B's weights of a type is far beyond the caches, as decode's is.  Reports the median and
best of ``--reps`` passes as GMAC/s and as GB/s of repacked bytes (at 1 row that is the
figure to hold against ``bench.bandwidth``).  A build that has no repacked kernels for a
type (``--base`` from before they existed) is timed on the weights as stored, marked so.

``--steps``: the model itself, ``--rounds`` rounds of ``modelc bench --json`` (a 512-token
prefill, 20 decode steps of 1 and of 8 sequences), and the 8/1 throughput ratio; each
round runs in a fresh process with ``PYTHONPATH`` set to a checkout, this one's and, with
``--base``, the checkout that holds that build, in alternating order.

``--base`` times another build's kernels module (e.g. the main checkout's .so) in the same
process, alternating with this checkout's pass by pass, so a shared machine's load hits
both; the repacked layout is every build's.  The model defaults to the SmolLM2 test asset:

    .venv/bin/python -m bench.bench_repacked --base ../main/modelc/_kernels/kernels.*.so
    .venv/bin/python -m bench.bench_repacked --model random-llama-1b-q4_k_m.gguf --rows 1 --steps
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from modelc.bench.timing import alternate, time_alternating
from modelc.formats import load_model
from modelc.runtime.arch import build
from modelc.runtime.backend import Weight
from modelc.runtime.backends.cpu import TYPE_CODES, CpuBackend
from modelc.runtime.model import SeqChunk
from tests import assets

ROOT = Path(__file__).resolve().parent.parent


def load_build(path: str) -> Any:
    """Another build's kernels module (its .so file), alongside this checkout's."""
    spec = importlib.util.spec_from_file_location("base_build.kernels", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def model_weights(model: Any) -> list[Weight]:
    """Every weight of the layers, in forward order, then the output head."""
    ws = [
        w
        for b in model.blocks
        for w in (getattr(b, f.name) for f in dataclasses.fields(b))
        if isinstance(w, Weight)
    ]
    return [*ws, model.output]


def kernels(model: Any, be: CpuBackend, builds: dict[str, Any], args: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    by_type: dict[str, list[tuple[int, Any, int, Any]]] = {}
    for w in model_weights(model):
        raw, packed = be.operands(w)
        if packed is not None:
            by_type.setdefault(w.dtype.name.lower(), []).append(
                (TYPE_CODES[w.dtype], raw, w.shape[1], packed)
            )
    want = args.types.split(",") if args.types else sorted(by_type)
    for name in want:
        items = by_type.get(name)
        if not items:
            print(f"{name}: no repacked weights of this type in the model")
            continue
        macs_row = sum(raw.shape[0] * k for _, raw, k, _ in items)
        nbytes = sum(p.nbytes for *_, p in items)
        print(f"{name}: {len(items)} weights, {nbytes / 1e6:,.0f} MB repacked")
        for n in [int(v) for v in args.rows.split(",")]:
            xs = {k: rng.standard_normal((n, k)).astype(np.float32) for _, _, k, _ in items}
            outs = [np.empty((n, raw.shape[0]), np.float32) for _, raw, _, _ in items]
            reps = args.reps if n < 64 else max(3, args.reps // 2)
            # a build without this type's repacked kernels (an older --base): the weights as
            # stored (its direct path), timed against the same bytes
            own = {k: bool(builds[k].repack_simd(items[0][0], be.simd)) for k in builds}

            def one_pass(k: str) -> None:
                for (code, raw, kk, packed), o in zip(items, outs, strict=True):  # noqa: B023
                    aux = packed if own[k] else None  # noqa: B023
                    builds[k].matmul(code, raw, kk, xs[kk], o, be.simd, be.threads, be.tol, aux)  # noqa: B023

            ts = time_alternating({k: functools.partial(one_pass, k) for k in builds}, reps)
            for k in builds:
                med, best = ts[k].median, ts[k].best
                print(
                    f"  {k}{'' if own[k] else ' (stored)'} {n:4d} row(s): median {macs_row * n / med / 1e9:6.1f} GMAC/s"
                    f" {nbytes / med / 1e9:5.1f} GB/s, best {macs_row * n / best / 1e9:6.1f}"
                    f" GMAC/s {nbytes / best / 1e9:5.1f} GB/s"
                )


def steps(path: str, trees: dict[str, Path], rounds: int) -> None:
    """``modelc bench --json`` of ``path`` in each checkout of ``trees`` (its own process,
    ``PYTHONPATH`` the checkout), ``rounds`` rounds, the order alternating."""

    def bench(tree: Path) -> dict[str, Any]:
        cmd = [sys.executable, "-m", "modelc.cli", "bench", path, "--json", "--reps", "1"]
        cmd += ["--prompt-lens", "512", "--batches", "1,8", "--steps", "20"]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise SystemExit(f"modelc bench in {tree} failed:\n{r.stderr[-2000:]}")
        out: dict[str, Any] = json.loads(r.stdout)
        return out

    runs = alternate({k: functools.partial(bench, t) for k, t in trees.items()}, rounds)
    for k, rs in runs.items():
        pf = [r["prefill_tps"]["512"] for r in rs]
        b1 = [r["decode_tps"]["1"] for r in rs]
        b8 = [r["decode_tps"]["8"] for r in rs]
        print(
            f"{k}: prefill512 {statistics.median(pf):7.1f} tok/s (best {max(pf):7.1f}); decode"
            f" 1 seq {statistics.median(b1):.1f} tok/s, 8 seqs {statistics.median(b8):.1f} tok/s,"
            f" 8/1 ratio {statistics.median(b8) / statistics.median(b1):.2f}x"
        )


def checkout_of(so: str) -> Path:
    """The checkout a kernels .so was built in (``<checkout>/modelc/_kernels/kernels*.so``)."""
    tree = Path(so).resolve().parents[2]
    if not (tree / "modelc" / "__init__.py").exists():
        raise SystemExit(f"--steps --base: {so} is not in a checkout's modelc/_kernels/")
    return tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the SmolLM2 test asset)")
    ap.add_argument("--types", default=None, help="e.g. q4_k,q6_k (default: all repacked)")
    ap.add_argument("--rows", default="1,8,64,512")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--base", default=None, help="another build's kernels .so, timed alternately")
    ap.add_argument("--steps", action="store_true", help="also the model's prefill and steps")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of --steps")
    args = ap.parse_args()
    builds = {"this": importlib.import_module("modelc._kernels.kernels")}
    if args.base:
        builds["base"] = load_build(args.base)
    be = CpuBackend()
    path = args.model or str(assets.smollm2_gguf())
    model: Any = build(load_model(path), be)
    print(f"simd {be.simd}, threads {be.threads}")
    for k, m in builds.items():
        print(f"{k}: {m.__file__}")
    model.forward([SeqChunk(model.new_cache(max_tokens=8), [1, 2])])  # the repacked copies
    kernels(model, be, builds, args)
    if args.steps:
        trees = {"this": ROOT, **({"base": checkout_of(args.base)} if args.base else {})}
        steps(path, trees, args.rounds)


if __name__ == "__main__":
    main()
