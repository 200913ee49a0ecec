"""The streamed wide GEMV (:mod:`modelc.runtime.backends.cuda_gemvs`, ``MODELC_CUDA_GEMV_STREAM=1``)
against the wide GEMV it reorders (``gemvw`` at one row of x): the same sums in the same
order, so the same bits, at every split of a row over warps, with rows that do not fill a
block's group, rows longer than one pass (several passes a piece, the last part of one),
grids of fewer blocks than groups (each block several groups: the two register sets and
the two shared buffers in turn), ``acc`` on and off.  Needs a GPU (skips elsewhere; the
source's compiling is ``tests/test_cuda_compile.py``'s).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from modelc.formats.ir import DType
from modelc.runtime.backend import Weight
from modelc.runtime.backends import cuda_gemvs
from modelc.runtime.backends.cuda import cuda_unavailable
from tests.gen_cuda_models import random_blocks

WHY = cuda_unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no CUDA here: {WHY}")


@pytest.fixture(scope="module")
def be() -> Any:
    from modelc.runtime.backends.cuda_backend import CudaBackend

    return CudaBackend()


@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q4_K, DType.Q6_K], ids=lambda d: d.name)
def test_streamed_gemv_gives_the_wide_gemvs_bits(be: Any, dtype: DType) -> None:
    cp, dev, rng = be.cp, be.dev, np.random.default_rng(35)
    try:
        dev.exact, dev.gemv_kind = False, "wide"
        # (37, 512): a part-filled last group; (300, 4096) / (2560, 2048): one or two passes
        # a piece; (4096, 14336): 56 super-blocks a row, several passes, the last partial
        for rows, cols in ((37, 512), (300, 4096), (2560, 2048), (4096, 14336)):
            data, _ = random_blocks(rng, dtype, rows, cols, 0.05)
            wide = dev.upload([Weight(dtype, (rows, cols), data)])
            x = cp.asarray(rng.standard_normal((1, cols)).astype(np.float32))
            base = cp.asarray(rng.standard_normal((1, rows)).astype(np.float32))
            for wpr in (1, 2, 4, 8):
                for acc in (False, True):
                    for sms in (0, 3):  # the device's grid, or 3 SMs: many groups a block
                        y0, y1 = base.copy(), base.copy()
                        dev.wpr, dev.stream = wpr, False
                        dev.matmul(wide, x, 1, y0, acc)
                        dev.stream, keep = True, dev.sms
                        dev.sms = sms or keep
                        try:
                            dev.matmul(wide, x, 1, y1, acc)
                        finally:
                            dev.sms = keep
                        assert y1.get().tobytes() == y0.get().tobytes(), (rows, cols, wpr, acc, sms)
            dev.wpr, dev.stream = 0, True  # its own split against gemvw's own: float-close
            y0, y1 = cp.zeros((1, rows), np.float32), cp.zeros((1, rows), np.float32)
            dev.matmul(wide, x, 1, y1)
            dev.stream = False
            dev.matmul(wide, x, 1, y0)
            a, b = y1.get().astype(np.float64), y0.get().astype(np.float64)
            assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b)
    finally:
        dev.read_env()


def test_the_split_gives_each_warp_at_most_two_passes() -> None:
    for code in (2, 12, 14):
        for cols in (512, 2048, 4096, 5632, 14336):
            w = cuda_gemvs.split(code, cols)
            units = cols // cuda_gemvs.WIDE_UNITS[code][0]
            per = cuda_gemvs.STREAM_UNROLL[code] * (32 // cuda_gemvs.WIDE_UNITS[code][1])
            assert w in (1, 2, 4, 8)
            assert units <= 2 * w * per or w == 8
            assert w == 1 or units > w * per  # no fewer warps would do
