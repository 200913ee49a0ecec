"""Where a running modelc server's threads wait for the GIL, from a py-spy profile.

    .venv/bin/python -m bench.gil_wait --pid PID [--seconds 5] [--rate 200] [--raw out.txt]
    .venv/bin/python -m bench.gil_wait --from out.txt [--top 25]

Records ``py-spy record --native --idle --threads -f raw`` of the process (py-spy must be
on the PATH or beside this interpreter) and sorts each thread's samples into: waiting for
the GIL (a ``pthread_cond_timedwait`` reached from a C function that gave the GIL up, not
from a lock or a queue: CPython 3.11's ``take_gil`` is inlined where the GIL is taken
back, so that wait is the leaf under the call that released it), idle in a blocking wait
(a lock, a queue, ``epoll``, a sleep), and running.  The share of a thread's samples
waiting for the GIL is the time it was ready to run and could not: for the step thread
of a GPU server, steps the device did not get.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

# frames a thread sits in when it has nothing to do (the native leaves below them)
IDLE = ("clock_nanosleep", "epoll_wait", "select", "poll (", "accept", "recv", "read (")
LOCKS = ("PyThread_acquire_lock_timed", "_queue_SimpleQueue_get", "lock_PyThread_acquire")


def classify(frames: list[str]) -> str:
    """``gil``, ``idle`` or ``running`` for one sample's stack (outermost first)."""
    native = [f for f in frames if not f.startswith("0x")]  # unnamed libc addresses
    leaf = native[-1] if native else ""
    if "pthread_cond_timedwait" in leaf or "pthread_cond_wait" in leaf:
        parent = native[-2] if len(native) > 1 else ""
        return "idle" if any(k in parent for k in LOCKS) else "gil"
    if any(k in leaf for k in IDLE + LOCKS) or "futex" in leaf:
        return "idle"
    return "running"


def samples(raw: Path) -> Iterator[tuple[str, list[str], int]]:
    """(thread name, frames outermost first, count) of each line of a raw profile."""
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1] if ": " in frames[0] else frames[0]
        yield thread, frames[1:], int(n)


def tally(raw: Path) -> dict[str, collections.Counter[str]]:
    out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for thread, frames, n in samples(raw):
        out[thread][classify(frames)] += n
    return out


def top(raw: Path, n: int) -> dict[str, collections.Counter[str]]:
    """Each thread's ``n`` most sampled Python functions of modelc and the server's stack
    (``function (file)``), each sample counted once a function however deep it recurs."""
    keep = ("modelc/", "hypercorn/", "quart", "h11/", "trio/_core/_run")
    out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for thread, frames, k in samples(raw):
        for f in sorted({f.rsplit(":", 1)[0] + ")" for f in frames if any(m in f for m in keep)}):
            out[thread][f] += k
    return {t: collections.Counter(dict(c.most_common(n))) for t, c in out.items()}


def record(pid: int, seconds: int, rate: int, raw: Path) -> None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    cmd = [spy, "record", "-p", str(pid), "-d", str(seconds), "-r", str(rate)]
    cmd += ["--native", "--idle", "--threads", "-f", "raw", "-o", str(raw)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"py-spy failed: {done.stderr.strip()[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pid", type=int)
    ap.add_argument("--from", dest="given", help="a raw profile recorded before")
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--raw", default="gil_wait_raw.txt")
    ap.add_argument("--top", type=int, default=0, help="then each thread's N busiest functions")
    a = ap.parse_args()
    raw = Path(a.given or a.raw)
    if not a.given:
        if a.pid is None:
            raise SystemExit("--pid PID (a running server) or --from FILE")
        record(a.pid, a.seconds, a.rate, raw)
    print("| thread | samples | running | waiting for the GIL | idle |")
    print("|---|---:|---:|---:|---:|")
    for thread, c in sorted(tally(raw).items(), key=lambda kv: -kv[1]["running"]):
        n = sum(c.values())
        print(
            f"| {thread} | {n} | {c['running'] / n:.0%} | {c['gil'] / n:.0%} | "
            f"{c['idle'] / n:.0%} |"
        )
    if a.top:
        counts = tally(raw)
        for thread, c in top(raw, a.top).items():
            total = sum(counts[thread].values())
            print(f"\n{thread} ({total} samples): share of samples in each function")
            for f, k in c.most_common():
                print(f"  {k / total:6.1%}  {f}")


if __name__ == "__main__":
    main()
