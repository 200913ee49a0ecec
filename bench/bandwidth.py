"""Memory read bandwidth of this machine, the ceiling of batch-1 decode on the CPU.

    .venv/bin/python -m bench.bandwidth [--gib 2] [--threads 1,2] [--reps 7]

Each of N threads reduces its share of a ``--gib`` GiB array (far beyond every cache) with
numpy ``bitwise_or.reduce`` over uint64, whose loop is vectorised and releases the GIL, so
the threads read in parallel and the arithmetic is negligible next to the loads. Bytes
read / wall time, the best and the median of ``--reps`` passes per thread count.

Batch-1 decode reads every weight byte once per token, so a model's decode tokens/s x its
weight bytes, over this figure, is the fraction of the bandwidth limit it reaches (issue
14, must-show 3).  ``--decode MODEL.gguf [...]`` measures that fraction in pairs, so that
the machine's changing load falls on both halves alike (``bench.paired`` pairs modelc's
and llama.cpp's rounds the same way): each model decodes once
untimed (first touches), then each round reads the array 3 times with 2 threads (the
round's read bandwidth: the best of them) and then times 3 x 16 batch-1 decode steps of each
model (``model.forward`` with the default backend, f16 KV, after a 16-token prompt; the best of
the 3), and
reports per model the median over rounds of (weight bytes a token x tokens/s) / the
round's read bandwidth, and the best decode over the best read.  Weight bytes a token: every tensor but ``token_embd`` when the model has an
``output`` head (untied: only the token's row of the embeddings is read).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from modelc.bench.timing import decode_tps, prefill_seconds


def read_gbs(a: np.ndarray[tuple[int], np.dtype[np.uint64]], threads: int) -> float:
    parts = np.array_split(a, threads)
    sink = [0] * threads

    def work(i: int) -> None:
        sink[i] = int(np.bitwise_or.reduce(parts[i]))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return a.nbytes / (time.perf_counter() - t0) / 1e9


class ReadProbe:
    """The machine's read bandwidth now, for pairing with a decode measurement: the best
    of 3 two-thread passes over a ``gib`` GiB array (made once, on first use)."""

    def __init__(self, gib: float = 2.0) -> None:
        self._n = int(gib * 2**30) // 8
        self._arr: np.ndarray[tuple[int], np.dtype[np.uint64]] | None = None

    def gbs(self) -> float:
        if self._arr is None:
            self._arr = np.random.default_rng(0).integers(0, 2**63, size=self._n, dtype=np.uint64)
        return max(read_gbs(self._arr, 2) for _ in range(3))


class InProcess:
    """A GGUF built on a CPU backend in this process, timed through the runtime's batch API
    as ``modelc bench`` times it (f16 KV cache)."""

    def __init__(self, gguf: str | Path, backend: Any = None) -> None:
        from modelc.formats import load_model
        from modelc.runtime.arch import build
        from modelc.runtime.backends.cpu import CpuBackend
        from modelc.runtime.model import CausalLM

        lm = build(load_model(gguf), backend if backend is not None else CpuBackend())
        assert isinstance(lm, CausalLM), f"{gguf} is not a language model"
        self.lm = lm

    def prefill(self, ids: list[int]) -> float:
        """Tokens/s of one prefill of ``ids`` (a fresh cache)."""
        return len(ids) / prefill_seconds(self.lm, ids)

    def decode(self, prompts: list[list[int]], steps: int) -> float:
        """Aggregate tokens/s of ``steps`` greedy steps of ``len(prompts)`` sequences decoding
        together, each prefilled (untimed) with its prompt in a fresh cache."""
        return decode_tps(self.lm, prompts, steps)


def model_decode(path: str, steps: int = 16, backend: Any = None) -> Callable[[], float]:
    """Batch-1 decode tok/s of ``path`` in this process (``backend``, default the default
    CPU backend; :meth:`InProcess.decode` after a 16-token prompt), as a function to call
    once a measurement."""
    m = InProcess(path, backend)
    prompt = np.random.default_rng(0).integers(0, 1000, 16).tolist()

    def run() -> float:
        return m.decode([prompt], steps)

    run()  # first touches, the repacked copies
    return run


def weight_bytes(path: str) -> int:
    """Bytes batch-1 decode reads a token: every tensor, less the embeddings when untied."""
    import gguf

    ts = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}
    return sum(ts.values()) - (ts.get("token_embd.weight", 0) if "output.weight" in ts else 0)


def decode_pairs(probe: ReadProbe, paths: list[str], rounds: int) -> None:
    runs = [(p, model_decode(p), weight_bytes(p)) for p in paths]
    fracs: dict[str, list[float]] = {p: [] for p in paths}
    print(
        f"| round | read GB/s | {' | '.join(Path(p).stem + ' tok/s, GB/s, share' for p in paths)} |"
    )
    print("|---" * (2 + len(paths)) + "|")
    bws: list[float] = []
    best: dict[str, float] = {p: 0.0 for p in paths}
    for r in range(rounds):
        bw = probe.gbs()
        cells = []
        for p, run, nbytes in runs:
            tps = max(run() for _ in range(3))
            gbs = nbytes * tps / 1e9
            cells.append(f"{tps:.1f}, {gbs:.1f}, {gbs / bw:.0%}")
            fracs[p].append(gbs / bw)
            best[p] = max(best[p], gbs)
        bws.append(bw)
        print(f"| {r + 1} | {bw:.1f} | {' | '.join(cells)} |")
    print()
    for p, _, nbytes in runs:
        f = fracs[p]
        print(
            f"{Path(p).name}: {nbytes / 1e6:,.0f} MB a token; share of the read bandwidth:"
            f" median of the rounds {statistics.median(f):.0%}; best decode {best[p]:.1f} GB/s"
            f" over best read {max(bws):.1f} GB/s = {best[p] / max(bws):.0%}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--decode", nargs="*", default=None, metavar="GGUF")
    a = ap.parse_args()
    if a.decode:
        decode_pairs(ReadProbe(a.gib), a.decode, a.reps)
        return 0
    n = int(a.gib * 2**30) // 8
    arr = np.random.default_rng(0).integers(0, 2**63, size=n, dtype=np.uint64)
    print(f"read bandwidth over {arr.nbytes / 2**30:.1f} GiB, {a.reps} passes each\n")
    print("| threads | best GB/s | median GB/s |")
    print("|---|---|---|")
    for k in (int(x) for x in a.threads.split(",")):
        runs = [read_gbs(arr, k) for _ in range(a.reps)]
        print(f"| {k} | {max(runs):.1f} | {statistics.median(runs):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
