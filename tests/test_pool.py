"""The kernels' thread pool on a machine with more runnable threads than cores.

Real processes take the cores: the pool's stall back-off (mc_pool.h) must then run the
jobs on the calling thread alone, and the results stay the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from modelc.formats.ir import DType
from modelc.runtime.backends.cpu import CpuBackend
from tests.test_kernels import make_weight

kk = pytest.importorskip("modelc._kernels.kernels")


def _cpu_ticks(pid: int) -> int:
    """User + system CPU time of a process so far, in clock ticks (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@pytest.mark.skipif(sys.platform != "linux", reason="reads the hogs' CPU time from /proc")
def test_oversubscribed_cores_back_off_to_one_thread() -> None:
    rng = np.random.default_rng(0)
    w = make_weight(DType.Q4_1, 4096, 2048, rng)
    x = rng.standard_normal((1, 2048)).astype(np.float32)
    two = CpuBackend(threads=2)
    want = CpuBackend(threads=1).matmul(w, x)
    kk.pool_backoff(True)  # on, nothing in force
    np.testing.assert_array_equal(two.matmul(w, x), want)
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(max(2, os.cpu_count() or 2))
    ]
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(_cpu_ticks(h.pid) > 5 for h in hogs):
            time.sleep(0.01)  # until every hog has run (interpreters start slowly under load)
        before = kk.pool_stats()
        # 400 jobs at least, more until the back-off comes, for up to 30 s: the OS decides
        # when a worker loses its core (one CI run saw no stall in 400 jobs, another none
        # in the 10 s this loop had then, ~14,000 jobs; alone it takes 1-10 s)
        deadline = time.monotonic() + 30
        jobs = 0
        while jobs < 400 or (
            kk.pool_stats()["stalls"] == before["stalls"] and time.monotonic() < deadline
        ):
            np.testing.assert_array_equal(two.matmul(w, x), want)
            jobs += 1
        for _ in range(80):  # the back-off's 64 jobs on the caller alone, wherever it began
            np.testing.assert_array_equal(two.matmul(w, x), want)
        after = kk.pool_stats()
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert after["jobs"] - before["jobs"] >= 400
    assert after["stalls"] > before["stalls"], (before, after)
    assert after["solo"] - before["solo"] >= 64, (before, after)
