"""Kernel-level end-to-end timings on SmolLM2-135M Q4_1: modelc's ``model.forward`` vs llama.cpp.

Measures, in one process and one run (so both see the same machine load):

* decode at batch 1: one ``forward`` of one token after a 32-token prompt;
* decode at batch 8: one ``forward`` over 8 ``SeqChunk``s of one token each (aggregate tok/s);
* prefill of a 512-token prompt (one ``forward``, fresh cache);
* the same prefill and batch-1 decode through llama.cpp (``xllamacpp``, same GGUF, same threads),
  from llama.cpp's own timings;
* with ``--split``, the batch-1 step's time inside the kernels vs in Python glue.

    .venv/bin/python -m bench.bench_e2e [--threads 2] [--matmul fast] [--reps 3] [--no-peer]

Each figure is the median of ``--reps`` repetitions; the load average is printed alongside,
since the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from modelc.formats import load_model
from modelc.runtime.arch import build
from modelc.runtime.backends.cpu import CpuBackend
from modelc.runtime.model import SeqChunk
from tests import assets


def median_time(fn: Callable[[], object], reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


class Timed:
    """Wraps a backend and adds up the seconds spent inside its calls (per method too)."""

    def __init__(self, be: CpuBackend) -> None:
        self.be = be
        self.spent = 0.0
        self.calls = 0
        self.by_name: dict[str, float] = {}

    def __getattr__(self, name: str) -> Any:
        f = getattr(self.be, name)
        if not callable(f):
            return f

        def wrapped(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                dt = time.perf_counter() - t0
                self.spent += dt
                self.calls += 1
                self.by_name[name] = self.by_name.get(name, 0.0) + dt

        return wrapped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--matmul", default="fast")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=16, help="decode steps per repetition")
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    ap.add_argument("--split", action="store_true", help="kernel vs glue time at batch 1")
    args = ap.parse_args()
    path = str(assets.smollm2_gguf())
    be = CpuBackend(threads=args.threads, matmul=args.matmul)
    model: Any = build(load_model(path), be)
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 40000, 800).tolist()
    print(f"load average {os.getloadavg()[0]:.2f}  threads={args.threads} matmul={args.matmul}")

    def prefill() -> None:
        model.forward([SeqChunk(model.new_cache(max_tokens=600), prompt[:512])])

    def decode(batch: int) -> float:
        caches = [model.new_cache(max_tokens=64) for _ in range(batch)]
        model.forward([SeqChunk(c, prompt[i : i + 32]) for i, c in enumerate(caches)])
        t0 = time.perf_counter()
        for s in range(args.steps):
            model.forward([SeqChunk(c, [prompt[100 + s + i]]) for i, c in enumerate(caches)])
        return float(batch * args.steps / (time.perf_counter() - t0))

    prefill()
    res: dict[str, float] = {}
    res["prefill512"] = 512 / median_time(prefill, args.reps)
    res["decode_b1"] = statistics.median(decode(1) for _ in range(args.reps))
    res["decode_b8"] = statistics.median(decode(8) for _ in range(args.reps))
    print(
        f"modelc     prefill512 {res['prefill512']:7.1f} tok/s  decode b1 {res['decode_b1']:6.1f} tok/s"
        f"  b8 {res['decode_b8']:6.1f} tok/s  (b8/b1 {res['decode_b8'] / res['decode_b1']:.2f}x)"
    )
    if args.split:
        for label, batch, n_tok in (
            ("batch-1 step", 1, 1),
            ("batch-8 step", 8, 1),
            ("prefill 512", 1, 512),
        ):
            timed = Timed(be)
            model.be = timed
            caches = [model.new_cache(max_tokens=600) for _ in range(batch)]
            if n_tok == 1:
                model.forward([SeqChunk(c, prompt[:8]) for c in caches])
            reps = args.steps if n_tok == 1 else 1
            timed.spent, timed.calls, timed.by_name = 0.0, 0, {}
            t0 = time.perf_counter()
            for s in range(reps):
                model.forward([SeqChunk(c, prompt[200 + s : 200 + s + n_tok]) for c in caches])
            wall = (time.perf_counter() - t0) / reps
            model.be = be
            parts = "  ".join(
                f"{k} {v / reps * 1e3:.2f}"
                for k, v in sorted(timed.by_name.items(), key=lambda kv: -kv[1])
            )
            print(
                f"{label} {wall * 1e3:.2f} ms: backend {timed.spent / reps * 1e3:.2f} ms"
                f" ({timed.calls // reps} calls: {parts}), rest {(wall - timed.spent / reps) * 1e3:.2f} ms"
            )
    if not args.no_peer:
        from bench.llamacpp_peer import LlamaCppPeer

        peer = LlamaCppPeer(path, args.threads, n_parallel=1, n_ctx=2048)
        peer.prefill_tps(prompt[:64])
        pf = statistics.median(peer.prefill_tps(prompt[:512]) for _ in range(args.reps))
        dc = statistics.median(
            peer.decode_tps(prompt[:32], 8 * args.steps, 1) for _ in range(args.reps)
        )
        print(
            f"llama.cpp  prefill512 {pf:7.1f} tok/s  decode b1 {dc:6.1f} tok/s   "
            f"ratios: prefill {res['prefill512'] / pf:.2f}x  decode b1 {res['decode_b1'] / dc:.2f}x"
        )
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
