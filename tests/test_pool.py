"""The kernels' thread pool on a machine with more runnable threads than cores.

Real processes take the cores: the pool's stall back-off (mc_pool.h) must then run the
jobs on the calling thread alone, and the results stay the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from modelc.formats.ir import DType
from modelc.runtime.backends.cpu import CpuBackend
from tests.test_kernels import make_weight

kk = pytest.importorskip("modelc._kernels.kernels")


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
        time.sleep(0.2)  # the hogs are running
        before = kk.pool_stats()
        for _ in range(400):
            np.testing.assert_array_equal(two.matmul(w, x), want)
        after = kk.pool_stats()
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert after["jobs"] - before["jobs"] >= 400
    assert after["stalls"] > before["stalls"], (before, after)
    assert after["solo"] - before["solo"] >= 64, (before, after)
