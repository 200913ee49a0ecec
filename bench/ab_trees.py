"""Before and after: one model's forward in two checkouts, alternating, in fresh processes.

    .venv/bin/python -m bench.ab_trees MODEL.gguf BASE_CHECKOUT [--rounds 4]

Each round runs, in turn (the order flipping every round so a shared machine's load drift
hits both), a child process per checkout with ``PYTHONPATH`` set to it; the child builds
the model on the CPU backend through APIs every checkout has (``runtime.arch.build``,
``SeqChunk``, ``new_cache``), warms it up, then times a 512-token prefill and 20 decode
steps of 1 and of 8 sequences.  Prints each side's medians and this / base.  Both
checkouts need their kernels built (``modelc/_kernels/*.so``).  Unlike ``modelc bench``,
the measuring code is the same in both, so a refactor of the benchmark itself cannot
masquerade as a change of speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time
import numpy as np
from modelc.formats import load_model
from modelc.runtime.arch import build
from modelc.runtime.backends.cpu import CpuBackend
from modelc.runtime.model import SeqChunk

m = build(load_model(sys.argv[1]), CpuBackend())
ids = [int(t) for t in np.random.default_rng(0).integers(100, m.n_vocab - 100, 512)]
m.forward([SeqChunk(m.new_cache("f16", max_tokens=1024), ids[:64])])  # warm-up (repacks)
out = {}
c = m.new_cache("f16", max_tokens=1024)
t = time.perf_counter()
m.forward([SeqChunk(c, ids)])
out["prefill"] = 512 / (time.perf_counter() - t)
for b in (1, 8):
    cs = [m.new_cache("f16", max_tokens=1024) for _ in range(b)]
    m.forward([SeqChunk(cc, ids[:32]) for cc in cs])
    t = time.perf_counter()
    for _ in range(20):
        m.forward([SeqChunk(cc, [7]) for cc in cs])
    out[f"batch {b}"] = 20 * b / (time.perf_counter() - t)
print(json.dumps(out))
"""


def run(tree: Path, model: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    r = subprocess.run(
        [sys.executable, "-c", CHILD, model],
        cwd="/",  # not a checkout: PYTHONPATH alone picks the code
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise SystemExit(f"the forward in {tree} failed:\n{r.stderr[-2000:]}")
    out: dict[str, float] = json.loads(r.stdout.splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("base", type=Path, help="the other checkout (kernels built in it)")
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    trees = {"this": ROOT, "base": a.base.resolve()}
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for r in range(a.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for k in order:
            runs[k].append(run(trees[k], a.model))
    for what in runs["this"][0]:
        med = {k: statistics.median(x[what] for x in rs) for k, rs in runs.items()}
        print(
            f"{what:9s} this {med['this']:8.1f} tok/s  base {med['base']:8.1f} tok/s"
            f"  this/base {med['this'] / med['base']:.2f}"
        )


if __name__ == "__main__":
    main()
