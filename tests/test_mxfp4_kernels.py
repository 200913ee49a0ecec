"""gpt-oss's kernels on its real shapes: MXFP4 weights repacked 8 rows to a group (the
VNNI / AVX2 GEMM, mc_gemm_vnni.h, and the zmm pairs of groups, mc_gemm_zmm41.h) against
the row kernels on the weights as stored and the numpy reference.  About 3 s."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from modelc.formats.ir import DType
from modelc.runtime.backend import Weight
from modelc.runtime.backends.cpu import SIMD_LEVELS, available_simd
from tests.test_kernels import REF, quantized_activations, rel_err

D = 2880  # gpt-oss-20b's width and expert width: every expert matrix is D x D
REPACK_LEVELS = [s for s in ("avx512vnni", "avx2") if s in available_simd()]
pytestmark = pytest.mark.skipif(not REPACK_LEVELS, reason="the repacked kernels need AVX2")


def mxfp4_rows(
    rows: int, cols: int, scales: np.ndarray[Any, Any], rng: np.random.Generator
) -> np.ndarray[Any, Any]:
    """(rows, cols / 32 * 17) MXFP4 blocks: random nibbles, the E8M0 bytes ``scales``
    (broadcast to (rows, cols / 32))."""
    blocks = rng.integers(0, 256, (rows, cols // 32, 17), dtype=np.uint8)
    blocks[:, :, 0] = np.broadcast_to(scales, (rows, cols // 32))
    return np.ascontiguousarray(blocks.reshape(rows, -1))


def stored_and_repacked(
    raw: np.ndarray[Any, Any], K: int, x: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], dict[str, np.ndarray[Any, Any]]]:
    """The scalar row kernel's x @ W^T one x row at a time, and the repacked kernels' per
    SIMD level (2 threads, all rows at once)."""
    from modelc._kernels import kernels as kk

    n, M = x.shape[0], raw.shape[0]
    aux = kk.repack(kk.MXFP4, raw, K)
    want = np.empty((n, M), np.float32)
    for i in range(n):
        kk.matmul(
            kk.MXFP4, raw, K, x[i : i + 1], want[i : i + 1], SIMD_LEVELS["scalar"], 1, 1e38, None
        )
    got: dict[str, np.ndarray[Any, Any]] = {}
    for level in REPACK_LEVELS:
        out = np.empty((n, M), np.float32)
        kk.matmul(kk.MXFP4, raw, K, x, out, SIMD_LEVELS[level], 2, 1e38, aux)
        got[level] = out
    return want, got


@pytest.mark.parametrize("n", [1, 4, 8, 13, 32])
def test_repacked_mxfp4_on_gptoss_shapes(n: int) -> None:
    """A 2880 x 2880 expert matrix (90 blocks a row, 360 groups of 8 rows: pairs of groups
    on zmm) against 1 (decode), a few (an expert's share of a batch) and 32 (prefill) x
    rows: every repacked path equals the scalar row kernel bit for bit, and numpy's
    product of the dequantized weights and quantized activations."""
    rng = np.random.default_rng(34)
    scales = rng.integers(118, 128, (D, D // 32), dtype=np.uint8)  # gpt-oss's range
    raw = mxfp4_rows(D, D, scales, rng)
    x = rng.standard_normal((n, D)).astype(np.float32)
    want, got = stored_and_repacked(raw, D, x)
    for level, out in got.items():
        np.testing.assert_array_equal(out, want, err_msg=f"{level}, {n} x rows")
    ref = REF.matmul(Weight(DType.MXFP4, (D, D), raw), quantized_activations(x, DType.MXFP4))
    assert rel_err(want, ref) <= 1e-5


def test_repacked_mxfp4_every_scale_byte() -> None:
    """Every E8M0 byte (0 and 1 below float's normal range, 254 and 255 near its top) in
    every lane of a group: the vector conversions of the repacked kernels give the scalar
    kernel's 2^(e - 128), so the results agree bit for bit (overflows to inf included)."""
    rng = np.random.default_rng(35)
    rows, K = 24, 32 * 256  # 3 groups: a zmm pair and a lone group
    scales = (np.arange(K // 32)[None, :] + 37 * np.arange(rows)[:, None]) % 256
    raw = mxfp4_rows(rows, K, scales.astype(np.uint8), rng)
    x = (rng.standard_normal((9, K)) * 1e-3).astype(np.float32)
    want, got = stored_and_repacked(raw, K, x)
    assert np.isinf(want).any() or np.abs(want).max() > 1e30  # the top scales were met
    for level, out in got.items():
        np.testing.assert_array_equal(out, want, err_msg=level)
