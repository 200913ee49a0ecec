"""Float weights (F32, F16, BF16): the matmul kernels and the embedding model they serve.

    .venv/bin/python -m bench.bench_float [--rows 1,8,64,512] [--reps 7] [--simd avx512vnni]
        [--base OTHER.so] [--embed] [--rounds 5] [--model GGUF]

Kernels: one random 2048 x 2048 weight per type (F32 16 MB, F16 / BF16 8 MB), x random,
``kernels.matmul`` at each x row count; GMAC/s of the best and the median of ``--reps``
calls.  ``--embed``: all-MiniLM-L6-v2 (the test asset, f32 safetensors) embedding a batch
of 32 sequences of 128 tokens (``model.embed``), ``--rounds`` rounds; sequences/s.

``--model GGUF``: instead, passes over every weight of that model as it is served (float
weights where the file is mapped), at each ``--rows`` count; ms and GB/s a pass, e.g. the
SmolLM2 F16 copy from ``bench.big_models`` at ``--rows 1,8`` (a decode step's weights).

``--base`` times another build's kernels module alongside this checkout's, alternating
call by call, so a shared machine's load hits both (kernels only: the embedding model's
code is this checkout's; run ``--embed`` in another checkout for its figure).  The float-weight LLM steps (prefill, decode at 1 and 8
sequences) are ``bench.bench_repacked --model <an F16 GGUF> --steps --base ...``, and the
comparison with llama.cpp is ``bench.side_by_side`` (an F16 / BF16 SmolLM2 from
``bench.big_models``).
"""

from __future__ import annotations

import argparse
import functools
import importlib
from typing import Any

import numpy as np

from bench.bench_repacked import load_build, model_weights
from modelc.bench.timing import repeat, time_alternating
from modelc.formats import load_model
from modelc.formats.ir import DType
from modelc.runtime.arch import build
from modelc.runtime.backends.cpu import TYPE_CODES, CpuBackend
from tests import assets


def float_weights(m: int, k: int) -> dict[str, np.ndarray[Any, Any]]:
    """The same random weight as F32, F16 and BF16 rows of bytes."""
    w = (np.random.default_rng(0).standard_normal((m, k)) * 0.02).astype(np.float32)
    bf16 = (w.view(np.uint32) >> 16).astype(np.uint16)
    return {
        "F32": w.view(np.uint8).reshape(m, -1),
        "F16": w.astype(np.float16).view(np.uint8).reshape(m, -1),
        "BF16": bf16.view(np.uint8).reshape(m, -1),
    }


def kernels(be: CpuBackend, builds: dict[str, Any], rows: list[int], reps: int) -> None:
    m = k = 2048
    rng = np.random.default_rng(1)
    for name, raw in float_weights(m, k).items():
        for n in rows:
            x = rng.standard_normal((n, k)).astype(np.float32)
            out = np.empty((n, m), np.float32)
            ts = time_alternating(
                {
                    b: functools.partial(
                        mod.matmul,
                        *(TYPE_CODES[DType[name]], raw, k, x, out),
                        *(be.simd, be.threads, be.tol, None),
                    )
                    for b, mod in builds.items()
                },
                reps,
            )
            cells = "  ".join(
                f"{b}: best {v.rate(m * k * n, best=True) / 1e9:6.1f} median {v.rate(m * k * n) / 1e9:6.1f}"
                for b, v in ts.items()
            )
            print(f"{name:4s} {n:4d} row(s), GMAC/s  {cells}")


def model_pass(
    path: str, be: CpuBackend, builds: dict[str, Any], rows: list[int], reps: int
) -> None:
    """One pass over every weight of the model at ``path`` as it is served (float weights
    where the file is mapped, the others from the backend's repacked copies), ``kernels.matmul``
    on each in turn, alternating the builds pass by pass: ms and GB/s of the weights' bytes."""
    model: Any = build(load_model(path), be)
    items = []
    for w in model_weights(model):
        raw, packed = be.operands(w)
        items.append((TYPE_CODES[w.dtype], raw, w.shape[1], packed))
    nbytes = sum(p.nbytes if p is not None else raw.nbytes for _, raw, _, p in items)
    rng = np.random.default_rng(3)
    for n in rows:
        xs = {k: rng.standard_normal((n, k)).astype(np.float32) for _, _, k, _ in items}
        outs = [np.empty((n, raw.shape[0]), np.float32) for _, raw, _, _ in items]

        def one_pass(mod: Any) -> None:
            for (code, raw, k, packed), o in zip(items, outs, strict=True):  # noqa: B023
                mod.matmul(code, raw, k, xs[k], o, be.simd, be.threads, be.tol, packed)  # noqa: B023

        ts = time_alternating(
            {b: functools.partial(one_pass, mod) for b, mod in builds.items()}, reps, warmup=2
        )
        cells = "  ".join(
            f"{b}: median {v.median * 1e3:7.2f} ms {v.rate(nbytes) / 1e9:5.1f} GB/s"
            for b, v in ts.items()
        )
        print(f"{len(items)} weights, {nbytes / 1e6:,.0f} MB, {n} x row(s): {cells}")


def embed(rounds: int) -> None:
    model: Any = build(load_model(str(assets.minilm_dir())), CpuBackend())
    rng = np.random.default_rng(2)
    batch = [[101, *rng.integers(1000, 29000, 126).tolist(), 102] for _ in range(32)]
    model.embed(batch[:2])  # warm up
    ts = repeat(lambda: model.embed(batch), rounds, warmup=0)
    print(
        f"MiniLM embed 32 x 128 tokens: median {ts.rate(32):6.1f} seq/s"
        f" ({ts.rate(32 * 128):7.0f} tok/s), best {ts.rate(32, best=True):6.1f} seq/s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,8,64,512")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--simd", default=None, help="SIMD level (default: the best)")
    ap.add_argument("--base", default=None, help="another build's kernels .so, timed alternately")
    ap.add_argument("--embed", action="store_true", help="also MiniLM's embeddings")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of --embed")
    ap.add_argument(
        "--model", default=None, help="a GGUF: passes over its weights (--rows, --reps)"
    )
    args = ap.parse_args()
    builds = {"this": importlib.import_module("modelc._kernels.kernels")}
    if args.base:
        builds["base"] = load_build(args.base)
    be = CpuBackend(simd=args.simd) if args.simd else CpuBackend()
    print(f"simd {be.simd}, threads {be.threads}")
    rows = [int(v) for v in args.rows.split(",")]
    if args.model:
        model_pass(args.model, be, builds, rows, args.reps)
        return
    kernels(be, builds, rows, args.reps)
    if args.embed:
        embed(args.rounds)


if __name__ == "__main__":
    main()
