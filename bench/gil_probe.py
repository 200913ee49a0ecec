"""How long a thread that gives the GIL up waits to get it back, inside a running command.

    python -m bench.gil_probe [--every 5] [--nap-ms 1] -- run MODEL [modelc run options]

Runs ``modelc ARGS`` in this process beside a probe thread that naps ``--nap-ms`` (giving
the GIL up, as a CUDA call or a C kernel does) and times how much longer than the nap it
took to run again; every ``--every`` seconds it prints the delays' median, p90, mean and
largest to stderr (``gil_probe ...``), less the nap's own oversleep measured before the
command started.  A step thread that makes K such hand-backs a step waits about K times
the mean a step.  Needs no ptrace (``bench/gil_wait.py`` reads a py-spy profile instead):
it works where a debugger cannot attach.  The probe's own wake-ups (one a nap) disturb
the process a little.
"""

from __future__ import annotations

import argparse
import atexit
import statistics
import sys
import threading
import time


def oversleep(nap: float, n: int = 200) -> float:
    """The median time a nap of ``nap`` s takes beyond it, with nothing else running."""
    out = []
    for _ in range(n):
        t = time.perf_counter()
        time.sleep(nap)
        out.append(time.perf_counter() - t - nap)
    return statistics.median(out)


def report(delays: list[float]) -> None:
    """One ``gil_probe`` line for ``delays`` (seconds), then empty it."""
    if not delays:
        return
    d = sorted(delays)
    ms = [1000 * d[len(d) // 2], 1000 * d[int(len(d) * 0.9)], 1000 * statistics.fmean(d)]
    print(
        "gil_probe median {:.3f} p90 {:.3f} mean {:.3f} max {:.3f} ms ({} naps)".format(
            *ms, 1000 * d[-1], len(d)
        ),
        file=sys.stderr,
        flush=True,
    )
    delays.clear()


def probe(nap: float, every: float, base: float, delays: list[float]) -> None:
    last = time.perf_counter()
    while True:
        t = time.perf_counter()
        time.sleep(nap)
        now = time.perf_counter()
        delays.append(max(now - t - nap - base, 0.0))
        if now - last >= every:
            report(delays)
            last = now


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--every", type=float, default=5.0, help="seconds between reports")
    ap.add_argument("--nap-ms", type=float, default=1.0)
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then modelc's arguments")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if not args:
        raise SystemExit("give modelc's arguments after --, e.g. -- run MODEL")
    nap = a.nap_ms / 1000
    base = oversleep(nap)
    print(f"gil_probe: a {a.nap_ms} ms nap oversleeps {1000 * base:.3f} ms idle", file=sys.stderr)
    delays: list[float] = []
    threading.Thread(target=probe, args=(nap, a.every, base, delays), daemon=True).start()
    atexit.register(report, delays)  # what the last interval holds
    from modelc.cli import main as modelc_main

    raise SystemExit(modelc_main(args))


if __name__ == "__main__":
    main()
