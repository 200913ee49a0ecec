"""The pipelined GEMV (:mod:`modelc.runtime.backends.cuda_gemvp`, ``MODELC_CUDA_GEMV=pipe``):
its plan (tiles, stages, grid, shared memory) on the CPU; on a GPU of compute capability
9.0+, its sums against the wide GEMV's (the same int8 arithmetic, read from global memory)
for every wide type, shapes whose tiles come out uneven, blocks with one tile and many,
1..16 rows of x, ``acc`` on and off; and a small model served on it held to its numpy twin
and the CPU's exact mode as the other int8 GEMVs are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelc.formats import load_model
from modelc.formats.ir import DType
from modelc.runtime.backends import cuda_gemvp
from modelc.runtime.backends.cuda import cuda_unavailable
from tests.gen_cuda_models import Q4_K_M, SMALL, random_blocks, write_random_llama

WHY = cuda_unavailable()
gpu = pytest.mark.skipif(WHY is not None, reason=f"no CUDA here: {WHY}")
SHARED_MAX = 227 << 10  # an H100's dynamic shared memory a block


@pytest.mark.parametrize(
    ("rows", "rb"),
    [(28672, 2304), (4096, 2304), (1024, 2304), (6144, 2304), (4096, 8064), (4096, 11760),
     (37, 288), (1, 16), (128256, 3360), (2048, 1152), (300, 11760 * 3)],
)  # fmt: skip
def test_the_plan_fits_the_card_and_balances_the_blocks(rows: int, rb: int) -> None:
    """For the 1.1B's and 8B's shapes (Q4_K 2304-byte rows, Q6_K's 11,760, the head) and odd
    ones: a tile of R rows in {8, 4, 2, 1} within TILE_BYTES (one row where a row is wider),
    2..8 stages, shared memory within the card's, no block without a tile, and tiles a block
    differing by at most one; the widest R that leaves every block four tiles."""
    sms = 132
    r, s, grid, smem = cuda_gemvp.plan(rows, rb, sms)
    tiles = -(-rows // r)
    assert r in (8, 4, 2, 1)
    assert r * rb <= max(cuda_gemvp.TILE_BYTES, rb)
    assert cuda_gemvp.MIN_STAGES <= s <= cuda_gemvp.MAX_STAGES
    assert smem == cuda_gemvp.HEADER + s * r * rb
    assert cuda_gemvp.BLOCKS_PER_SM * smem <= SHARED_MAX or r == 1
    assert 1 <= grid <= min(tiles, sms * cuda_gemvp.BLOCKS_PER_SM)
    per = [len(range(b, tiles, grid)) for b in range(grid)]
    assert min(per) >= 1 and max(per) - min(per) <= 1
    wider = [w for w in (8, 4, 2, 1) if w > r and w * rb <= cuda_gemvp.TILE_BYTES]
    for w in wider:  # a wider tile would leave some block under four
        assert -(-rows // w) < cuda_gemvp.TILES_A_BLOCK * sms * cuda_gemvp.BLOCKS_PER_SM


@pytest.fixture(scope="module")
def be() -> Any:
    from modelc.runtime.backends.cuda_backend import CudaBackend

    b = CudaBackend()
    if not b.dev.pipe_ok:
        pytest.skip("the pipelined GEMV needs compute capability 9.0+")
    return b


def rel(a: Any, b: Any) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


@gpu
@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q4_K, DType.Q6_K], ids=lambda d: d.name)
def test_pipelined_gemv_equals_the_wide_gemv(be: Any, dtype: DType) -> None:
    """Within 1e-5 of ``gemvw`` (the sums in another order only where the warps a row
    differ): rows not a multiple of the tile, one tile a block (37 rows) and many (28,672
    rows: ~14 a block), a 14,336-wide row (two or one a tile), x of 1..16 rows."""
    from modelc.runtime.backend import Weight

    cp, dev, rng = be.cp, be.dev, np.random.default_rng(31)
    try:
        dev.exact, dev.gemv_max = False, 16
        for rows, cols in ((37, 512), (1003, 4096), (4096, 14336), (28672, 4096)):
            data, _ = random_blocks(rng, dtype, rows, cols, 0.05)
            dev.gemv_kind = "wide"
            w = dev.upload([Weight(dtype, (rows, cols), data)])
            ns = (1, 2, 3, 8, 11, 16) if rows < 5000 else (1, 4)
            for n in ns:
                x = cp.asarray(rng.standard_normal((n, cols)).astype(np.float32))
                base = cp.asarray(rng.standard_normal((n, rows)).astype(np.float32))
                for acc in (False, True):
                    y0, y1 = base.copy(), base.copy()
                    dev.gemv_kind = "wide"
                    dev.matmul(w, x, n, y0, acc)
                    dev.gemv_kind = "pipe"
                    dev.matmul(w, x, n, y1, acc)
                    assert rel(y1.get(), y0.get()) < 1e-5, (rows, cols, n, acc)
    finally:
        dev.read_env()


@gpu
@pytest.mark.parametrize("dtype", [DType.Q4_0, Q4_K_M], ids=str)
def test_small_models_on_the_pipelined_gemv(be: Any, tmp_path: Path, dtype: DType | str) -> None:
    """A model with its products on the pipelined GEMV, prompts too, in CUDA graphs: held to
    its numpy twin and the CPU's exact mode as the other int8 GEMVs are."""
    from tests.test_cuda_kernels import check_q8_model

    check_q8_model(
        load_model(write_random_llama(tmp_path / "m.gguf", dtype, SMALL, seed=3)),
        list(range(5, 40)),
        12,
        kind="pipe",
    )


@gpu
def test_the_norm_in_the_gemvs_prologue_equals_the_norm_launch(be: Any) -> None:
    """``norm_matmul`` with each pipelined GEMV norming x itself (a Q4_K_M QKV's Q4_K and Q6_K
    parts, 1..8 rows of x with a row stride past the width) against the norm's own launch
    then the same GEMVs (``MODELC_CUDA_PIPE_NORM=0``): within 1e-4 (an 8-bit rounding may
    flip where the two norms' sums differ in the last place); a stack with a part the
    pipelined GEMV does not take (Q5_0) goes the launch's way, its product as before."""
    from modelc.runtime.backend import Weight

    cp, dev, rng = be.cp, be.dev, np.random.default_rng(41)
    cols = 2048
    try:
        dev.exact, dev.gemv_kind = False, "pipe"
        for types in ((DType.Q4_K, DType.Q6_K), (DType.Q4_K, DType.Q5_0)):
            ws = []
            for dtype, rows in zip(types, (1536, 512), strict=True):
                data, _ = random_blocks(rng, dtype, rows, cols, 0.05)
                ws.append(Weight(dtype, (rows, cols), data))
            w = dev.upload(ws)
            wn = cp.asarray(rng.uniform(0.5, 1.5, cols).astype(np.float32))
            for n in (1, 2, 5, 8):
                x = cp.asarray(rng.standard_normal((n, cols + 64)).astype(np.float32))
                h = cp.zeros((n, cols), np.float32)
                ys = []
                for fused in (True, False):
                    dev.pipe_norm = fused
                    y = cp.full((n, w.rows), np.nan, np.float32)
                    dev.norm_matmul(x, n, wn, 1e-5, h, w, y)
                    ys.append(y.get())
                assert np.isfinite(ys[0]).all()
                assert rel(ys[0], ys[1]) < 1e-4, (types, n)
    finally:
        dev.read_env()
