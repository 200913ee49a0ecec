"""The short soak (issue 15): ``bench/soak.py`` for 60 s after 90 s of warm-up.

The server's RSS (less the prefix cache) climbs for its first minute or more under this
load and then levels off: 286 MB at 15 s, 296 MB at 60 s, 302 MB at 75 s, 307 MB from 100
to 150 s on a quiet machine (one run from a cold start, 2026-12-05); on a busy one the
climb lasts longer (fewer requests a second), and 75 s of warm-up left the compared fifths
5.2% apart (404.7 against 425.6 MB), so the warm-up is 90 s.  The run stays 60 s: its
fifths of 12 s hold 15 to 25 first-token probes on a busy machine, a 45 s run's as few as
6, whose medians a single slow batch moves past the 1.5x line.

8 clients against a real ``modelc run``: 20% drop their stream part-way, 5% send
malformed requests; no valid request may fail, every malformed one gets a 4xx, nothing is
left in flight and the KV cache is back where it started, RSS (less the prefix cache)
of the last fifth at most 5% above the first fifth's (a fall, seen once in CI at -5.5%, is
memory handed back, not a leak), p99 TTFT of the last fifth within 1.5x of the
first's.  The 30-minute run's figures are in bench/RESULTS.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_short_soak(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    cmd = [sys.executable, "-m", "bench.soak", "--minutes", "1", "--warmup", "90"]
    cmd += ["--threads", "1", "--json", str(out)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.exists(), run.stderr[-3000:]
    report = json.loads(out.read_text())
    print(json.dumps(report, indent=1))
    assert report["valid_requests"] > 50 and report["dropped_streams"] > 10
    assert report["malformed_requests"] > 0
    failed = [name for name, ok in report["checks"].items() if not ok]
    assert not failed, f"soak checks failed: {failed}\n{json.dumps(report, indent=1)}"
    assert run.returncode == 0
