"""Memory read bandwidth of this machine, the ceiling of batch-1 decode on the CPU.

    .venv/bin/python -m bench.bandwidth [--gib 2] [--threads 1,2] [--reps 7]

Each of N threads reduces its share of a ``--gib`` GiB array (far beyond every cache) with
numpy ``bitwise_or.reduce`` over uint64, whose loop is vectorised and releases the GIL, so
the threads read in parallel and the arithmetic is negligible next to the loads. Bytes
read / wall time, the best and the median of ``--reps`` passes per thread count.

Batch-1 decode reads every weight byte once per token, so a model's decode tokens/s x its
weight bytes, over this figure, is the fraction of the bandwidth limit it reaches (issue
14, must-show 3).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import numpy as np


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
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
