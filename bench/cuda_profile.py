"""Where a CUDA decode step's time goes: every kernel of ``--steps`` eager decode steps
(no CUDA graphs, so each launch is its own), read by PyTorch's profiler (CUPTI sees CuPy's
kernels too), grouped by kernel name, per step; and the graph-replayed step's time beside
it, so the launch gaps show as the difference.

    python3 bench/cuda_profile.py MODEL.gguf [--streams 1,64] [--steps 32]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from modelc.formats import load_model
from modelc.runtime.backends.cuda_backend import CudaBackend
from modelc.runtime.backends.cuda_llama import CudaLlama
from modelc.runtime.model import SeqChunk


def steps(model: CudaLlama, n: int, k: int, graphs: bool) -> float:
    """Seconds a decode step of ``n`` sequences, over ``k`` steps after a warm-up."""
    model.use_graphs = graphs
    model.reset_graphs()
    rng = np.random.default_rng(n)
    caches = [model.new_cache("f16", max_tokens=32 + k + 8) for _ in range(n)]
    for i in range(0, n, 16):
        model.forward_greedy(
            [SeqChunk(c, rng.integers(0, model.n_vocab, 32).tolist()) for c in caches[i : i + 16]]
        )
    last = [0] * n
    for _ in range(3):  # capture (graphs) or warm
        last = model.forward_greedy(
            [SeqChunk(c, [t]) for c, t in zip(caches, last, strict=True)]
        ).tolist()
    model.stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(k):
        last = model.forward_greedy(
            [SeqChunk(c, [t]) for c, t in zip(caches, last, strict=True)]
        ).tolist()
    dt = (time.perf_counter() - t0) / k
    for c in caches:
        c.free()
    return dt


def profile(model: CudaLlama, n: int, k: int) -> None:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    steps(model, n, 2, graphs=False)  # warm the eager path
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        wall = steps(model, n, k, graphs=False)
    torch.cuda.synchronize()
    per: dict[str, list[float]] = defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name[:70]].append(ev.device_time)  # microseconds
    total = sum(sum(v) for v in per.values())
    graph = steps(model, n, k, graphs=True)
    print(
        f"\n## {n} streams: eager step {wall * 1e3:.3f} ms wall, graph step "
        f"{graph * 1e3:.3f} ms; kernels (profiled steps incl. the 32-token prefill; "
        f"per decode step below is over all {k + 5} forwards)"
    )
    print(f"{'kernel':70s} {'launches/step':>13s} {'us/launch':>10s} {'us/step':>9s}")
    fw = k + 3 + max(1, (n + 15) // 16)
    for name, ts in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        print(f"{name:70s} {len(ts) / fw:13.1f} {np.median(ts):10.2f} {sum(ts) / fw:9.1f}")
    print(f"{'all kernels':70s} {'':13s} {'':10s} {total / fw:9.1f}")
    host_profile(model, n, k)


def host_profile(model: CudaLlama, n: int, k: int) -> None:
    """The host's share of a graph-replayed step: Python's profile of ``k`` steps."""
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    steps(model, n, k, graphs=True)
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(14)
    print(f"host functions by own time over {k} graph steps (+ prefill and capture):")
    print("\n".join(line[:120] for line in out.getvalue().splitlines()[6:24]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--streams", default="1,64")
    ap.add_argument("--steps", type=int, default=32)
    args = ap.parse_args()
    model = CudaLlama(load_model(args.model), CudaBackend())
    print(f"{args.model.name}: {model.weight_bytes / 1e6:.0f} MB of weights a step")
    for n in (int(v) for v in args.streams.split(",")):
        profile(model, n, args.steps)


if __name__ == "__main__":
    main()
