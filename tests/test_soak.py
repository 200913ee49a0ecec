"""The short soak (issue 15): ``bench/soak.py`` for 60 s after 90 s of warm-up.

The server's RSS (less the prefix cache) climbs for its first minute or more under this
load and then levels off: 286 MB at 15 s, 296 MB at 60 s, 302 MB at 75 s, 307 MB from 100
to 150 s on a quiet machine (one run from a cold start, 2026-12-05); on a busy one the
climb lasts longer (fewer requests a second), and 75 s of warm-up left the compared fifths
5.2% apart (404.7 against 425.6 MB), so the warm-up is 90 s.  The run stays 60 s: its
fifths of 12 s hold 15 to 25 first-token probes on a busy machine, a 45 s run's as few as
6, whose medians a single slow batch moves past the 1.5x line.

The server's RSS moves in steps as its buffers reach the largest batch and prompt met so far
(1 s samples of a fifth: 312.1 MB for 12 s; 317.3, 314.1 for 6 s, 317.8, 319.9), and it
levels off: 298.8 MB after warm-up and 313.9 at the end of a 30-minute run, 302.8 / 315.2
over 4 minutes with the by-minute peaks 303, 310, 325, 319.  A 1-minute run may meet one
such step late: CI saw 311.2 -> 333.2 MB (+7.1 %) on 2026-12-07.  So the short run allows a
10 % rise (~31 MB): a leak of more than ~60 KB a request (~500 requests a minute here)
still fails it; the 30-minute run keeps 5 %.

8 clients against a real ``modelc run``: 20% drop their stream part-way, 5% send
malformed requests; no valid request may fail, every malformed one gets a 4xx, nothing is
left in flight and the KV cache is back where it started, RSS (less the prefix cache)
of the last fifth at most 10% above the first fifth's (a fall, seen once in CI at -5.5%, is
memory handed back, not a leak), p99 TTFT of the last fifth within 1.5x of the
first's, each weighed by the server's CPU rate in its fifth: CI failed once (2026-12-07) on
medians of 0.365 against 0.634 s while the other worker's tests took cores.  The
30-minute run's figures are in bench/RESULTS.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.soak import _cpu_rate, _cpu_seconds, ttft_stable

ROOT = Path(__file__).resolve().parent.parent


def test_short_soak(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    cmd = [sys.executable, "-m", "bench.soak", "--minutes", "1", "--warmup", "90"]
    cmd += ["--threads", "1", "--rss-tolerance", "0.1", "--json", str(out)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.exists(), run.stderr[-3000:]
    report = json.loads(out.read_text())
    print(json.dumps(report, indent=1))
    assert report["valid_requests"] > 50 and report["dropped_streams"] > 10
    assert report["malformed_requests"] > 0
    failed = [name for name, ok in report["checks"].items() if not ok]
    assert not failed, f"soak checks failed: {failed}\n{json.dumps(report, indent=1)}"
    assert run.returncode == 0


def test_ttft_check_weighs_the_servers_cpu_share() -> None:
    """The CI failure of 2026-12-07: medians 0.365 -> 0.634 s while a neighbour took cores."""
    first, last = [0.30, 0.35, 0.365, 0.40, 0.45], [0.55, 0.60, 0.634, 0.70, 0.80]
    # the server got 0.55 of its CPU rate back: the same CPU work, stretched -> stable
    assert ttft_stable(first, last, 1.0, 0.55, use_p99=False)
    # the same rate throughout: the server itself slowed -> not stable
    assert not ttft_stable(first, last, 1.0, 1.0, use_p99=False)
    # a server spinning more CPU for the same wall time is not stable either
    assert not ttft_stable(first, first, 0.6, 1.0, use_p99=False)
    # no rates (a server elsewhere, --url): wall times, 1.5x + 50 ms
    assert not ttft_stable(first, last, None, None, use_p99=False)
    assert ttft_stable(first, [x * 1.5 for x in first], None, None, use_p99=False)
    assert not ttft_stable([], last, 1.0, 1.0, use_p99=False)


def test_cpu_rate_of_a_busy_and_an_idle_process() -> None:
    samples = [(0.0, _cpu_seconds(os.getpid()))]
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.4:  # busy: ~1 CPU second a wall second
        pass
    samples.append((time.monotonic() - t0, _cpu_seconds(os.getpid())))
    busy = _cpu_rate(samples, 0.0, 10.0)
    time.sleep(0.4)
    samples.append((time.monotonic() - t0, _cpu_seconds(os.getpid())))
    idle = _cpu_rate(samples[1:], 0.0, 10.0)
    assert busy is not None and idle is not None
    assert busy > 0.3 and idle < 0.1, (busy, idle)  # busy neighbours on 2 cores leave > 0.3
    assert _cpu_rate(samples[:1], 0.0, 10.0) is None
