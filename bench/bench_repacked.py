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

``--steps``: the model itself, ``--rounds`` rounds of a 512-token prefill and the median
decode step of 1 and 8 sequences (``model.forward``), and the 8/1 throughput ratio.

``--huge-ab``: only batch-1 decode with the repacked copies in huge pages (the backend's
arena, ``modelc.runtime.backends.hugemem``) against numpy's allocator, alternating.

``--base`` times another build's kernels module (e.g. the main checkout's .so) in the same
process, alternating with this checkout's pass by pass (the steps: round by round, the
backend's module swapped, in alternating order), so a shared machine's load hits both;
the repacked layout is every build's.  The model defaults to the SmolLM2 test asset:

    .venv/bin/python -m bench.bench_repacked --base ../main/modelc/_kernels/kernels.*.so
    .venv/bin/python -m bench.bench_repacked --model random-llama-1b-q4_k_m.gguf --rows 1 --steps
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.bandwidth import model_decode
from modelc.formats import load_model
from modelc.runtime.arch import build
from modelc.runtime.backend import Weight
from modelc.runtime.backends import cpu as cpu_mod
from modelc.runtime.backends.cpu import TYPE_CODES, CpuBackend
from modelc.runtime.model import SeqChunk
from tests import assets


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


def alternate(
    builds: dict[str, Any], reps: int, one_pass: Callable[[str, Any], None]
) -> dict[str, list[float]]:
    """Seconds of each of ``reps`` passes of ``one_pass(name, module)`` per build, the
    builds taking turns pass by pass, in alternating order (a machine's drift falls on all
    of them alike); one more pass first warms up."""
    ts: dict[str, list[float]] = {k: [] for k in builds}
    for r in range(reps + 1):
        for k in builds if r % 2 else reversed(list(builds)):
            t = time.perf_counter()
            one_pass(k, builds[k])
            if r:
                ts[k].append(time.perf_counter() - t)
    return ts


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

            def one_pass(k: str, mod: Any) -> None:
                for (code, raw, kk, packed), o in zip(items, outs, strict=True):  # noqa: B023
                    aux = packed if own[k] else None  # noqa: B023
                    mod.matmul(code, raw, kk, xs[kk], o, be.simd, be.threads, be.tol, aux)  # noqa: B023

            ts = alternate(builds, reps, one_pass)
            for k in builds:
                med, best = statistics.median(ts[k]), min(ts[k])
                print(
                    f"  {k}{'' if own[k] else ' (stored)'} {n:4d} row(s): median {macs_row * n / med / 1e9:6.1f} GMAC/s"
                    f" {nbytes / med / 1e9:5.1f} GB/s, best {macs_row * n / best / 1e9:6.1f}"
                    f" GMAC/s {nbytes / best / 1e9:5.1f} GB/s"
                )


def steps(model: Any, builds: dict[str, Any], args: argparse.Namespace) -> None:
    prompt = np.random.default_rng(0).integers(100, 40000, 800).tolist()

    def prefill() -> float:
        t = time.perf_counter()
        model.forward([SeqChunk(model.new_cache(max_tokens=600), prompt[:512])])
        return time.perf_counter() - t

    def step(n_seq: int) -> float:
        caches = [model.new_cache(max_tokens=64) for _ in range(n_seq)]
        model.forward([SeqChunk(c, prompt[i : i + 32]) for i, c in enumerate(caches)])
        ts = []
        for s in range(20):
            t = time.perf_counter()
            model.forward([SeqChunk(c, [prompt[100 + s + i]]) for i, c in enumerate(caches)])
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    res: dict[str, dict[str, list[float]]] = {k: {"pf": [], "s1": [], "s8": []} for k in builds}
    for r in range(args.rounds + 1):  # round 0 warms up
        for k in builds if r % 2 == 0 else reversed(list(builds)):
            cpu_mod._k = builds[k]
            pf, s1, s8 = prefill(), step(1), step(8)
            if r:
                for key, t in (("pf", pf), ("s1", s1), ("s8", s8)):
                    res[k][key].append(t)
    for k, v in res.items():
        pf, s1, s8 = (statistics.median(v[x]) for x in ("pf", "s1", "s8"))
        print(
            f"{k}: prefill512 {512 / pf:7.1f} tok/s (best {512 / min(v['pf']):7.1f}); step 1 seq"
            f" {s1 * 1e3:.2f} ms, 8 seqs {s8 * 1e3:.2f} ms, 8/1 ratio {8 * s1 / s8:.2f}x"
        )


def huge_ab(path: str, rounds: int) -> None:
    """Batch-1 decode with the repacked copies in huge pages (the backend's arena) against
    numpy's allocator: two copies of the model in this process, 32 steps each a round, in
    alternating order; the median of the paired ratios."""
    runs = {}
    for name, on in (("plain", False), ("huge", True)):
        be = CpuBackend()
        be._arena.enabled = on
        runs[name] = model_decode(path, 32, be)  # its first run makes the copies
    res: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(rounds):
        for k in runs if r % 2 == 0 else reversed(list(runs)):
            res[k].append(runs[k]())
    ratios = [h / p for h, p in zip(res["huge"], res["plain"], strict=True)]
    print(
        f"decode b1 tok/s, medians: plain {statistics.median(res['plain']):.1f}, huge"
        f" {statistics.median(res['huge']):.1f}; huge / plain paired median"
        f" {statistics.median(ratios):.3f}, faster in {sum(x > 1 for x in ratios)} of {rounds}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the SmolLM2 test asset)")
    ap.add_argument("--types", default=None, help="e.g. q4_k,q6_k (default: all repacked)")
    ap.add_argument("--rows", default="1,8,64,512")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--base", default=None, help="another build's kernels .so, timed alternately")
    ap.add_argument("--steps", action="store_true", help="also the model's prefill and steps")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of --steps / --huge-ab")
    ap.add_argument(
        "--huge-ab", action="store_true", help="only: decode with and without huge pages"
    )
    args = ap.parse_args()
    if args.huge_ab:
        huge_ab(args.model or str(assets.smollm2_gguf()), args.rounds)
        return
    builds = {"this": cpu_mod._k}
    if args.base:
        builds["base"] = load_build(args.base)
    be = CpuBackend()
    model: Any = build(load_model(args.model or str(assets.smollm2_gguf())), be)
    print(f"simd {be.simd}, threads {be.threads}")
    for k, m in builds.items():
        print(f"{k}: {m.__file__}")
    model.forward([SeqChunk(model.new_cache(max_tokens=8), [1, 2])])  # the repacked copies
    kernels(model, be, builds, args)
    if args.steps:
        steps(model, builds, args)


if __name__ == "__main__":
    main()
