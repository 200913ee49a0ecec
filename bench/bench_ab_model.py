"""SmolLM2 prefill (512 tokens) and decode steps (1 and 8 sequences) on two kernel builds.

The CPU backend's kernels module (``modelc.runtime.backends.cpu._k``) is swapped round by
round between this checkout's build and another build's .so (``--base``, e.g. the main
checkout's), in alternating order, so a shared machine's load hits both alike; the
repacked weights are shared (their layout is every build's).  Reports the median prefill
tok/s and step times per build and the 8/1 throughput ratio (8 x step(1) / step(8)).

    .venv/bin/python -m bench.bench_ab_model --base ../main/modelc/_kernels/kernels.*.so
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from bench.bench_gmac import load_build
from modelc.formats import load_model
from modelc.runtime.arch import build
from modelc.runtime.backends import cpu as cpu_mod
from modelc.runtime.backends.cpu import CpuBackend
from modelc.runtime.model import SeqChunk
from tests import assets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="another build's kernels .so")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20, help="decode steps a measurement")
    args = ap.parse_args()
    builds = {"this": cpu_mod._k, "base": load_build(args.base)}
    be = CpuBackend()
    model: Any = build(load_model(str(assets.smollm2_gguf())), be)
    prompt = np.random.default_rng(0).integers(100, 40000, 800).tolist()

    def prefill() -> float:
        t = time.perf_counter()
        model.forward([SeqChunk(model.new_cache(max_tokens=600), prompt[:512])])
        return time.perf_counter() - t

    def step(n_seq: int) -> float:
        caches = [model.new_cache(max_tokens=64) for _ in range(n_seq)]
        model.forward([SeqChunk(c, prompt[i : i + 32]) for i, c in enumerate(caches)])
        ts = []
        for s in range(args.steps):
            t = time.perf_counter()
            model.forward([SeqChunk(c, [prompt[100 + s + i]]) for i, c in enumerate(caches)])
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    res: dict[str, dict[str, list[float]]] = {k: {"pf": [], "s1": [], "s8": []} for k in builds}
    for r in range(args.rounds + 1):  # round 0 warms up
        order = list(builds) if r % 2 == 0 else list(reversed(list(builds)))
        for k in order:
            cpu_mod._k = builds[k]
            pf, s1, s8 = prefill(), step(1), step(8)
            if r:
                res[k]["pf"].append(pf), res[k]["s1"].append(s1), res[k]["s8"].append(s8)
    for k, v in res.items():
        pf, s1, s8 = (statistics.median(v[x]) for x in ("pf", "s1", "s8"))
        print(
            f"{k}: prefill512 {512 / pf:7.1f} tok/s (best {512 / min(v['pf']):7.1f}); step 1 seq"
            f" {s1 * 1e3:.2f} ms, 8 seqs {s8 * 1e3:.2f} ms, 8/1 ratio {8 * s1 / s8:.2f}x"
            f"  ({builds[k].__file__})"
        )


if __name__ == "__main__":
    main()
