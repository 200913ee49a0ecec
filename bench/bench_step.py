"""Model-level decode steps on SmolLM2: one ``forward`` of 1 and of 8 sequences.

Times ``Llama.forward`` alone (no engine), after a 32-token prompt per sequence, and
reports the median step, tokens/s and the 8/1 ratio; ``--ops`` adds the time of each
backend call per step (matmul, attention, norms...).  ``--repack`` instead times every
layer's matmuls and the output head with the repacked-weight kernels against the
kernels on the weights as stored (the unpacking GEMM from 5 rows, row kernels below),
alternating in one process, for the row counts given.

    .venv/bin/python -m bench.bench_step [--model PATH] [--ops] [--rounds 2]
    .venv/bin/python -m bench.bench_step --repack 1,2,4,8
    .venv/bin/python -m bench.bench_step --prefill 512 [--model PATH]

``--prefill N`` times one N-token prefill (fresh f16 cache) per round instead, with the
time of each backend call (attention's share of a prefill grows with N).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from modelc.formats import load_model
from modelc.formats.ir import DType
from modelc.runtime.arch import build
from modelc.runtime.backends.cpu import TYPE_CODES, CpuBackend
from modelc.runtime.model import SeqChunk
from tests import assets

OPS = (
    "matmul",
    "matmul_many",
    "attention_append",
    "rms_norm",
    "rope_angles",
    "rope",
    "silu_mul",
    "get_rows",
)


def instrument(be: CpuBackend, totals: collections.Counter[str]) -> None:
    """Wrap the backend's calls so each adds its time to ``totals``."""
    for name in OPS:
        fn = getattr(be, name)

        def timed(*a: Any, _fn: Callable[..., Any] = fn, _name: str = name, **k: Any) -> Any:
            t = time.perf_counter()
            r = _fn(*a, **k)
            totals[_name] += time.perf_counter() - t
            return r

        setattr(be, name, timed)


def steps(
    model: Any, n_seq: int, n_steps: int, rng: np.random.Generator, totals: collections.Counter[str]
) -> float:
    """Median seconds of one decode step of ``n_seq`` sequences (``totals``: the steps' calls)."""
    caches = [model.new_cache("f16") for _ in range(n_seq)]
    model.forward([SeqChunk(c, rng.integers(0, 49000, 32).tolist()) for c in caches])
    totals.clear()  # the prompts' prefill is not a decode step
    ts = []
    for _ in range(n_steps):
        t = time.perf_counter()
        model.forward([SeqChunk(c, [int(rng.integers(0, 49000))]) for c in caches])
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def decode_steps(path: str, rounds: int, n_steps: int, ops: bool) -> None:
    be = CpuBackend()
    model = build(load_model(path), be)
    totals: collections.Counter[str] = collections.Counter()
    if ops:
        instrument(be, totals)
    rng = np.random.default_rng(0)
    for r in range(rounds):
        med = {}
        for n in (1, 8):
            med[n] = steps(model, n, n_steps, rng, totals)
            print(
                f"round {r + 1}, {n} sequence(s): step {med[n] * 1e3:.2f} ms, {n / med[n]:.1f} tok/s"
            )
            for name, sec in totals.most_common():
                print(f"    {name:17s} {sec / n_steps * 1e3:6.2f} ms a step")
        print(f"round {r + 1}: 8/1 ratio {8 * med[1] / med[8]:.2f}x")


def prefill_ops(path: str, rounds: int, n: int) -> None:
    be = CpuBackend()
    model = build(load_model(path), be)
    totals: collections.Counter[str] = collections.Counter()
    instrument(be, totals)
    ids = np.random.default_rng(0).integers(100, 40000, n).tolist()
    model.forward([SeqChunk(model.new_cache("f16", max_tokens=n), ids)])  # warm-up
    for r in range(rounds):
        totals.clear()
        t = time.perf_counter()
        model.forward([SeqChunk(model.new_cache("f16", max_tokens=n), ids)])
        sec = time.perf_counter() - t
        print(f"round {r + 1}: prefill of {n} tokens {sec * 1e3:.1f} ms, {n / sec:.1f} tok/s")
        for name, s in totals.most_common():
            print(f"    {name:17s} {s * 1e3:8.1f} ms ({100 * s / sec:.0f} %)")


def repack_vs_unpack(path: str, rows: list[int], reps: int, simd: str | None) -> None:
    from modelc._kernels import kernels as kk

    be = CpuBackend(simd=simd)
    if not kk.repack_simd(TYPE_CODES[DType.Q4_1], be.simd):
        raise SystemExit("--repack: this SIMD level has no kernels for repacked weights")
    model: Any = build(load_model(path), be)
    weights = [
        w for b in model.blocks for w in (b.wq, b.wk, b.wv, b.wo, b.w_gate, b.w_up, b.w_down)
    ]
    weights.append(model.output)
    raws = [be._rows(w) for w in weights]
    codes = [TYPE_CODES[w.dtype] for w in weights]
    packed = [  # None where this SIMD level has no kernel for the type (Q8_0 on AVX2)
        kk.repack(c, r, w.shape[1]) if kk.repack_simd(c, be.simd) else None
        for c, r, w in zip(codes, raws, weights, strict=True)
    ]
    rng = np.random.default_rng(0)

    def run(xs: dict[int, np.ndarray[Any, Any]], outs: list[Any], use: bool) -> tuple[float, float]:
        """Seconds of the layers' matmuls and of the output head (the last weight)."""
        t0 = time.perf_counter()
        for w, c, r, p, o in zip(weights[:-1], codes, raws, packed, outs, strict=False):
            kk.matmul(
                c, r, w.shape[1], xs[w.shape[1]], o, be.simd, be.threads, be.tol, p if use else None
            )
        t1 = time.perf_counter()
        head = weights[-1]
        kk.matmul(
            codes[-1],
            raws[-1],
            head.shape[1],
            xs[head.shape[1]],
            outs[-1],
            be.simd,
            be.threads,
            be.tol,
            packed[-1] if use else None,
        )
        return t1 - t0, time.perf_counter() - t1

    for n in rows:
        xs = {k: rng.standard_normal((n, k)).astype(np.float32) for k in (576, 1536)}
        outs = [np.empty((n, w.shape[0]), np.float32) for w in weights]
        run(xs, outs, False), run(xs, outs, True)
        res: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(reps):
            for use in (False, True):
                res[use].append(run(xs, outs, use))
        cells = []
        for use in (False, True):
            layers = statistics.median(t[0] for t in res[use]) * 1e3
            head_ms = statistics.median(t[1] for t in res[use]) * 1e3
            cells.append(f"layers {layers:.2f} ms, head {head_ms:.2f} ms")
        print(f"{n} row(s): weights as stored {cells[0]}; repacked {cells[1]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the SmolLM2 test asset)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40, help="decode steps a measurement")
    ap.add_argument("--ops", action="store_true", help="time each backend call")
    ap.add_argument("--prefill", type=int, default=0, help="time an N-token prefill's calls")
    ap.add_argument("--repack", default=None, help="row counts, e.g. 1,2,4,8: repacked vs not")
    ap.add_argument("--simd", default=None, help="SIMD level for --repack (avx512vnni, avx2)")
    args = ap.parse_args()
    path = args.model or str(assets.smollm2_gguf())
    if args.prefill:
        prefill_ops(path, args.rounds, args.prefill)
    elif args.repack:
        repack_vs_unpack(path, [int(v) for v in args.repack.split(",")], 15, args.simd)
    else:
        decode_steps(path, args.rounds, args.steps, args.ops)


if __name__ == "__main__":
    main()
