"""Every compiled kernel (CpuBackend, cyx/) against its numpy twin (NumpyBackend).

Tolerances, and why:

* Dequantization / ``get_rows``: bit-exact against ``gguf.quants.dequantize``
  (the llama.cpp reference); the C code performs the same float32 operations.
* Quantized ``matmul`` against a twin that quantizes the activations exactly as
  the kernel does (int8 per 32 or per 256, round half to even) and then multiplies
  in float64: relative error <= 1e-5.  This holds the integer dot products to the
  exact arithmetic; what remains is float32 accumulation order.
* Quantized ``matmul`` against the float32 reference ``x @ dequant(W).T``:
  relative (Frobenius) error <= 1e-2 for the 32-element types and 1.2e-2 for the
  K-quants on random data, 2e-2 on real SmolLM2 tensors and hidden states (measured
  0.4-1.2%: real activations have outlier channels, so max|x|/std(x) is larger).  Quantizing x to int8 with scale d = max|x|/127 adds uniform noise of
  standard deviation d/sqrt(12) per element, so for Gaussian x the expected
  relative error is about max|x| / (127 sqrt(12) std(x)): ~2.3/440 = 5.2e-3 for
  blocks of 32 and ~3/440 = 6.8e-3 for blocks of 256 (measured: 4-6e-3, 5-8e-3).
* ``matmul="exact"`` (float activations) against the reference: 1e-5, every dtype.
* F32/F16 ``matmul`` and the float kernels (norms, RoPE, softmax, SiLU, GELU,
  attention): 1e-5 relative (float32 rounding and summation order).

Every test runs each code path the CPU has (AVX2 + VNNI, AVX2, NEON) and the forced
portable scalar path.
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from modelc.errors import ConfigError
from modelc.formats.gguf import open_reader
from modelc.formats.ir import BLOCK_SIZES, DType
from modelc.runtime.backend import F32Array, Weight
from modelc.runtime.backends import cpu as cpu_backend
from modelc.runtime.backends.cpu import SIMD_LEVELS, CpuBackend, available_simd
from modelc.runtime.backends.numpy_ref import NumpyBackend, dequantize_weight
from tests import assets

MATMUL_DTYPES = [
    DType.F32,
    DType.F16,
    DType.Q4_0,
    DType.Q4_1,
    DType.Q5_0,
    DType.Q8_0,
    DType.Q4_K,
    DType.Q6_K,
    DType.INT8,
    DType.Q5_1,
    DType.Q5_K,
    DType.Q3_K,
    DType.Q2_K,
    DType.BF16,
    DType.IQ4_NL,
    DType.IQ4_XS,
    DType.MXFP4,  # gguf-py's quantizer writes its blocks
]
# the types whose fast path quantizes x in blocks of 256 (the rest: 32)
K_QUANTS = {DType.Q2_K, DType.Q3_K, DType.Q4_K, DType.Q5_K, DType.Q6_K}
FLOAT_DTYPES = (DType.F32, DType.F16, DType.BF16)
# gguf-py cannot quantize these: random blocks with these f16 scales (byte offset: value)
# the repacked types' codes (beyond Q4_1 and Q8_0)
KQ_CODES = {
    DType.Q4_0: cpu_backend._k.Q4_0,
    DType.Q5_0: cpu_backend._k.Q5_0,
    DType.Q5_1: cpu_backend._k.Q5_1,
    DType.IQ4_NL: cpu_backend._k.IQ4_NL,
    DType.IQ4_XS: cpu_backend._k.IQ4_XS,
    DType.MXFP4: cpu_backend._k.MXFP4,
    DType.Q2_K: cpu_backend._k.Q2_K,
    DType.Q3_K: cpu_backend._k.Q3_K,
    DType.Q4_K: cpu_backend._k.Q4_K,
    DType.Q5_K: cpu_backend._k.Q5_K,
    DType.Q6_K: cpu_backend._k.Q6_K,
}
RANDOM_BLOCK_SCALES: dict[DType, dict[int, float]] = {
    DType.Q2_K: {80: 0.02, 82: 0.01},  # d, dmin
    DType.Q3_K: {108: 0.02},
    DType.Q4_K: {0: 0.02, 2: 0.01},
    DType.Q5_K: {0: 0.01, 2: 0.01},
    DType.Q6_K: {208: 0.001},
    DType.IQ4_NL: {0: 0.01},
    DType.IQ4_XS: {0: 0.001},
}


def same_as_repacked(dtype: DType) -> list[str]:
    """The SIMD levels whose kernels on the weights as stored give the repacked kernels'
    results bit for bit: all of them, but Q4_0's and Q5_0's scalar kernels, which round
    (d dx) s and its sum in two steps where the SIMD kernels (and the repacked ones) fuse
    them."""
    return [s for s in available_simd() if s != "scalar" or dtype not in (DType.Q4_0, DType.Q5_0)]


# the f16 scales of the types gguf-py quantizes too, for blocks of hand-set bytes
BOUND_SCALES = {
    **RANDOM_BLOCK_SCALES,
    DType.Q4_0: {0: 0.02},
    DType.Q5_0: {0: 0.02},
    DType.Q5_1: {0: 0.02, 2: 0.01},
}
# where Q6_K's int8 sub-block scales sit in its block (ql 128, qh 64, scales 16, d), and the
# bytes the bounds test also fills them with: -128 and 127 (0xFF, the test's default, is -1)
INT8_SCALES = {DType.Q6_K: slice(192, 208)}
INT8_SCALE_FILLS = {DType.Q6_K: (None, 0x80, 0x7F)}
BATCHES = (1, 3, 8, 17)
REF = NumpyBackend()


@pytest.fixture(params=available_simd())
def cpu(request: pytest.FixtureRequest) -> CpuBackend:
    return CpuBackend(simd=request.param)


def rel_err(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def make_weight(dtype: DType, rows: int, cols: int, rng: np.random.Generator) -> Weight:
    """A random weight in ``dtype``, laid out as the IR holds it."""
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if dtype is DType.F32:
        return Weight(dtype, (rows, cols), w)
    if dtype is DType.F16:
        return Weight(dtype, (rows, cols), w.astype(np.float16))
    if dtype is DType.INT8:
        scale = (np.abs(w).max(axis=1, keepdims=True) / 127).astype(np.float32)  # (rows, 1)
        q = np.round(w / scale).astype(np.int8)
        return Weight(
            dtype, (rows, cols), np.concatenate([scale.view(np.uint8), q.view(np.uint8)], 1)
        )
    if dtype is DType.BF16:
        bf = gguf_quantize(w, gguf.GGMLQuantizationType.BF16)  # (rows, 2 * cols) bytes
        return Weight(dtype, (rows, cols), np.ascontiguousarray(bf).view(np.uint16))
    if dtype in RANDOM_BLOCK_SCALES:
        bs, ts = BLOCK_SIZES[dtype]
        raw = rng.integers(0, 256, (rows, cols // bs, ts), dtype=np.uint8)
        for off, value in RANDOM_BLOCK_SCALES[dtype].items():
            raw[:, :, off : off + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
        return Weight(dtype, (rows, cols), raw.reshape(rows, -1))
    return Weight(dtype, (rows, cols), gguf_quantize(w, gguf.GGMLQuantizationType[dtype.name]))


def quantized_activations(x: np.ndarray[Any, Any], dtype: DType) -> np.ndarray[Any, Any]:
    """The numpy twin of the kernels' activation quantization, dequantized again: (n, K) f32."""
    n, k = x.shape
    bs = 256 if dtype in K_QUANTS else 32
    pad = -k % bs
    xb = np.pad(x, ((0, 0), (0, pad))).reshape(n, -1, bs)  # (n, blocks, bs)
    d = np.abs(xb).max(axis=-1, keepdims=True) / np.float32(127)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.round(xb * inv)  # half to even, as nearbyintf
    return (q * d).astype(np.float32).reshape(n, -1)[:, :k]


def cols_for(dtype: DType) -> int:
    return 100 if dtype in (DType.INT8, *FLOAT_DTYPES) else 512


# ----------------------------------------------------------------- quantized rows


@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
def test_get_rows_matches_reference_dequantization(cpu: CpuBackend, dtype: DType) -> None:
    rng = np.random.default_rng(1)
    w = make_weight(dtype, 37, cols_for(dtype), rng)
    ids = np.array([0, 36, 5, 5, 17], dtype=np.int64)
    got = cpu.get_rows(w, ids)
    np.testing.assert_array_equal(got, REF.get_rows(w, ids))
    if dtype.is_block_quantized:
        full = gguf_dequantize(w.data, gguf.GGMLQuantizationType[dtype.name])
        np.testing.assert_array_equal(got, full[ids])


def test_get_rows_rejects_bad_id() -> None:
    w = make_weight(DType.Q8_0, 4, 32, np.random.default_rng(0))
    with pytest.raises(IndexError):
        CpuBackend().get_rows(w, np.array([4]))


# ----------------------------------------------------------------------- matmul


@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
def test_matmul_exact_against_quantized_activation_twin(cpu: CpuBackend, dtype: DType) -> None:
    rng = np.random.default_rng(2)
    w = make_weight(dtype, 67, cols_for(dtype), rng)
    dense = dequantize_weight(w).astype(np.float64)
    for n in BATCHES:
        x = rng.standard_normal((n, w.shape[1])).astype(np.float32)
        xq = x if dtype in FLOAT_DTYPES else quantized_activations(x, dtype)
        want = xq.astype(np.float64) @ dense.T
        assert rel_err(cpu.matmul(w, x), want) <= 1e-5, (dtype, n)


@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
def test_matmul_against_f32_reference(cpu: CpuBackend, dtype: DType) -> None:
    rng = np.random.default_rng(3)
    w = make_weight(dtype, 67, cols_for(dtype), rng)
    tol = 1e-5 if dtype in FLOAT_DTYPES else 1.2e-2 if dtype in K_QUANTS else 1e-2
    for n in BATCHES:
        x = rng.standard_normal((n, w.shape[1])).astype(np.float32)
        assert rel_err(cpu.matmul(w, x), REF.matmul(w, x)) <= tol, (dtype, n)


@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
@pytest.mark.parametrize("simd", available_simd())
def test_exact_matmul_against_f32_reference(simd: str, dtype: DType) -> None:
    rng = np.random.default_rng(16)
    w = make_weight(dtype, 67, cols_for(dtype), rng)
    exact = CpuBackend(simd=simd, matmul="exact")
    for n in BATCHES:
        x = rng.standard_normal((n, w.shape[1])).astype(np.float32)
        assert rel_err(exact.matmul(w, x), REF.matmul(w, x)) <= 1e-5, (dtype, n)


@pytest.mark.parametrize("repack", [False, True])
@pytest.mark.parametrize("simd", available_simd())
@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_batched_matmul_equals_one_row_at_a_time(
    mode: str, dtype: DType, simd: str, repack: bool
) -> None:
    """Every batch kernel (8 rows, 4 rows, 1 row; 41 rows = 5 x 8 + 1), on the weights as
    stored or repacked (Q4_1, Q8_0 on VNNI), keeps each row's arithmetic."""
    rng = np.random.default_rng(4)
    w = make_weight(dtype, 45, cols_for(dtype), rng)
    x = rng.standard_normal((41, w.shape[1])).astype(np.float32)
    cpu = CpuBackend(matmul=mode, simd=simd, repack=repack)
    batched = cpu.matmul(w, x)
    single = np.concatenate([cpu.matmul(w, x[i : i + 1]) for i in range(41)])
    np.testing.assert_array_equal(batched, single)
    np.testing.assert_array_equal(cpu.matmul(w, x[3:15]), single[3:15])  # 8 + 4 (padded)
    np.testing.assert_array_equal(cpu.matmul(w, x[3:13]), single[3:13])  # 8 + 2 one by one
    for n in (2, 4, 5):  # one by one, one by one, one padded group
        np.testing.assert_array_equal(cpu.matmul(w, x[:n]), single[:n])


@pytest.mark.parametrize("simd", available_simd())
@pytest.mark.parametrize("dtype", [*FLOAT_DTYPES, DType.Q4_K])
@pytest.mark.parametrize("cols", [768, 2304])
def test_float_gemm_is_bit_identical_to_the_row_kernels(cols: int, dtype: DType, simd: str) -> None:
    """The float GEMM (cyx/mc_gemm_float.h; AVX-512, from 4 x rows, K a multiple of 16) on
    F32 / F16 / BF16 weights and on the exact mode's dequantized Q4_K tiles: register tiles
    of 6 x 4 (AVX2: 3 x 2), passes of 1024 columns (2304: three, the last short, the
    accumulators kept between them), blocks of 36 x rows; each row as alone through the row
    kernels."""
    rng = np.random.default_rng(21)
    w = make_weight(dtype, 45, cols, rng)  # 45 = 2 x 16 + 13: a last group of one weight row
    x = rng.standard_normal((39, cols)).astype(np.float32)  # 36 + 3: a second, short block
    cpu = CpuBackend(simd=simd, matmul="exact" if dtype is DType.Q4_K else "fast")
    single = np.concatenate([cpu.matmul(w, x[i : i + 1]) for i in range(39)])
    np.testing.assert_array_equal(cpu.matmul(w, x), single)
    for n in (4, 5, 6, 7, 33):
        np.testing.assert_array_equal(cpu.matmul(w, x[:n]), single[:n])
    assert rel_err(single, REF.matmul(w, x)) <= 1e-5
    w2 = make_weight(dtype, 20, cols, rng)  # Q / K / V style: one pool job for both
    for n in (1, 39):
        many = cpu.matmul_many([w, w2], x[:n])
        np.testing.assert_array_equal(many[0], single[:n])
        np.testing.assert_array_equal(many[1], cpu.matmul(w2, x[:n]))


@pytest.mark.parametrize("simd", available_simd())
@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q8_0])
def test_batched_matmul_over_many_groups(dtype: DType, simd: str) -> None:
    """More x rows than one pass of the GEMM takes (128): 17 groups of 8 and a lone row."""
    rng = np.random.default_rng(5)
    w = make_weight(dtype, 23, 96, rng)  # 3 blocks: an odd count
    x = rng.standard_normal((137, 96)).astype(np.float32)
    cpu = CpuBackend(simd=simd, repack=True)
    single = np.concatenate([cpu.matmul(w, x[i : i + 1]) for i in range(137)])
    np.testing.assert_array_equal(cpu.matmul(w, x), single)
    assert rel_err(single, REF.matmul(w, quantized_activations(x, dtype))) <= 1e-5


@pytest.mark.parametrize("simd", available_simd())
@pytest.mark.parametrize("dtype", MATMUL_DTYPES)
@pytest.mark.parametrize("mode", ["fast", "balanced", "exact"])
@pytest.mark.parametrize("n", [1, 8, 13])
def test_matmul_many_equals_separate_calls(n: int, mode: str, dtype: DType, simd: str) -> None:
    """Q, K and V style: one shared x, weights of different heights, one call (repacked
    where the backend repacks)."""
    rng = np.random.default_rng(6)
    ws = [make_weight(dtype, rows, cols_for(dtype), rng) for rows in (64, 16, 16)]
    x = rng.standard_normal((n, cols_for(dtype))).astype(np.float32)
    cpu = CpuBackend(matmul=mode, simd=simd, repack=True)
    outs = [np.full((n, w.shape[0]), np.nan, np.float32) for w in ws]
    got = cpu.matmul_many(ws, x, outs)
    for g, o, w in zip(got, outs, ws, strict=True):
        assert g is o  # written in place
        np.testing.assert_array_equal(g, cpu.matmul(w, x))
    fresh = cpu.matmul_many(ws, x)
    for g, w in zip(fresh, ws, strict=True):
        np.testing.assert_array_equal(g, cpu.matmul(w, x))


@pytest.mark.parametrize(
    ("dtype", "simd_name"),
    [
        (DType.Q8_0, "avx512vnni"),
        (DType.Q4_1, "avx512vnni"),
        (DType.Q8_0, "avx2"),
        (DType.Q4_1, "avx2"),
    ],
)
def test_gemm_aux_path_is_bit_identical(dtype: DType, simd_name: str) -> None:
    """Q8_0 and Q4_1 repacked 8 rows to a group (weights as the vector operand of vpdpbusd,
    or of vpmaddubsw on AVX2 (Q8_0 by the sign trick); no unpacking through memory) give
    what the kernels on the weights as stored give, for x row counts around the 8 x 8
    tiles; data of the wrong shape is refused."""
    from modelc._kernels import kernels as kk

    rng = np.random.default_rng(8)
    code = kk.Q8_0 if dtype is DType.Q8_0 else kk.Q4_1
    w = make_weight(dtype, 37, 96, rng)
    raw = np.ascontiguousarray(w.data)
    aux = kk.repack(code, raw, 96)
    per = 272 if dtype is DType.Q8_0 else 160  # bytes a block of 8 rows
    assert aux.shape == (5, 3 * per)  # 37 rows: 5 groups of 8, the last padded
    if simd_name not in available_simd():
        pytest.skip(f"needs {simd_name}")
    simd = SIMD_LEVELS[simd_name]
    assert kk.repack_simd(code, simd) and not kk.repack_simd(kk.BF16, simd)
    for n in (1, 3, 5, 8, 13, 17):
        x = rng.standard_normal((n, 96)).astype(np.float32)
        with_aux, without = np.empty((n, 37), np.float32), np.empty((n, 37), np.float32)
        kk.matmul(code, raw, 96, x, with_aux, simd, 2, 1e38, aux)
        kk.matmul(code, raw, 96, x, without, simd, 2, 1e38, None)
        np.testing.assert_array_equal(with_aux, without)
        outs = [np.empty((n, 37), np.float32), np.empty((n, 37), np.float32)]
        kk.matmul_multi(code, [raw, raw], 96, x, outs, simd, 2, 1e38, [aux, aux])
        np.testing.assert_array_equal(outs[0], without)
        np.testing.assert_array_equal(outs[1], without)
    ids = np.array([0, 7, 8, 36, 17, 36], np.int64)  # the padded last group's row too
    rows_aux, rows = np.empty((6, 96), np.float32), np.empty((6, 96), np.float32)
    kk.get_rows(code, raw, 96, ids, rows_aux, simd, aux)  # each row put back, then dequantized
    kk.get_rows(code, raw, 96, ids, rows, simd, None)
    np.testing.assert_array_equal(rows_aux, rows)
    with pytest.raises(ValueError, match="GEMM data does not match"):
        kk.matmul(code, raw, 96, x, without, simd, 2, 1e38, np.ascontiguousarray(aux[:, :8]))


@pytest.mark.skipif("avx512vnni" not in available_simd(), reason="the zmm kernels are VNNI's")
@pytest.mark.parametrize("dtype", [DType.Q4_1, DType.Q8_0])
def test_repacked_pairs_of_groups_are_bit_identical(dtype: DType) -> None:
    """Q4_1 and Q8_0 repacked, two groups of 8 weight rows at once on AVX512 (zmm: lanes
    8-15 the next group; mc_gemm_zmm41.h), the last odd group and a padded tail on the
    ymm kernel: the results of the weights as stored (one x row at a time and batched)
    and of the AVX2 kernels on the repacked weights (ymm only), for weight row counts with even and odd group counts and tails, every x row count of
    one group and past it, 1 and 2 threads (tiles of other heights)."""
    from modelc._kernels import kernels as kk

    rng = np.random.default_rng(12)
    code = kk.Q8_0 if dtype is DType.Q8_0 else kk.Q4_1
    vnni, avx2 = SIMD_LEVELS["avx512vnni"], SIMD_LEVELS["avx2"]
    for M, K in [(8, 96), (16, 96), (24, 64), (40, 96), (1000, 96), (37, 576)]:
        w = make_weight(dtype, M, K, rng)
        raw = np.ascontiguousarray(w.data)
        aux = kk.repack(code, raw, K)
        for n in (*range(1, 10), 17):
            x = rng.standard_normal((n, K)).astype(np.float32)
            want = np.empty((n, M), np.float32)
            for i in range(n):
                kk.matmul(code, raw, K, x[i : i + 1], want[i : i + 1], vnni, 1, 1e38, None)
            ymm = np.empty((n, M), np.float32)
            kk.matmul(code, raw, K, x, ymm, avx2, 2, 1e38, aux)
            np.testing.assert_array_equal(ymm, want, err_msg=f"{M=} {n=}")
            for nth in (1, 2):
                stored, got = np.empty((n, M), np.float32), np.empty((n, M), np.float32)
                kk.matmul(code, raw, K, x, stored, vnni, nth, 1e38, None)
                kk.matmul(code, raw, K, x, got, vnni, nth, 1e38, aux)
                np.testing.assert_array_equal(stored, want, err_msg=f"{M=} {n=} {nth=}")
                np.testing.assert_array_equal(got, want, err_msg=f"{M=} {n=} {nth=}")


@pytest.mark.parametrize("dtype", list(KQ_CODES))
def test_kquant_repacked_path_is_bit_identical(dtype: DType) -> None:
    """Q2_K to Q6_K repacked 8 rows to a group (VNNI and AVX2 kernels: each
    256-column block's exact integer sums for 8 weight rows in 8 lanes, then the scalar
    kernel's float operations) give what the scalar, AVX2 and VNNI kernels on the weights as
    stored give, for x row counts around the 8 x 8 tiles; rows read back from the copy are
    the same."""
    from modelc._kernels import kernels as kk

    rng = np.random.default_rng(10)
    code = KQ_CODES[dtype]
    w = make_weight(dtype, 37, 512, rng)
    raw = np.ascontiguousarray(w.data)
    aux = kk.repack(code, raw, 512)
    # as large as W (Q3_K, Q5_K: 114, 180 bytes a row and block against 110, 176: the
    # scales unpacked)
    sizes = {
        DType.Q4_0: 144,
        DType.Q5_0: 176,
        DType.Q5_1: 192,
        DType.IQ4_NL: 144,
        DType.IQ4_XS: 138,
        DType.MXFP4: 136,
        DType.Q2_K: 84,
        DType.Q3_K: 114,
        DType.Q4_K: 148,
        DType.Q5_K: 180,
        DType.Q6_K: 210,
    }
    per = sizes[dtype]
    assert aux.shape == (5, 16 * per)
    assert not kk.repack_simd(code, SIMD_LEVELS["scalar"])
    levels = [SIMD_LEVELS[s] for s in ("avx2", "avx512vnni") if s in available_simd()]
    if not levels:
        pytest.skip("the repacked kernels need AVX2")
    for level in levels:
        assert kk.repack_simd(code, level)
        for n in (1, 2, 5, 8, 9, 17):
            x = rng.standard_normal((n, 512)).astype(np.float32)
            with_aux = np.empty((n, 37), np.float32)
            kk.matmul(code, raw, 512, x, with_aux, level, 2, 1e38, aux)
            for simd in same_as_repacked(dtype):
                want = np.empty((n, 37), np.float32)
                kk.matmul(code, raw, 512, x, want, SIMD_LEVELS[simd], 2, 1e38, None)
                np.testing.assert_array_equal(with_aux, want, err_msg=f"{level=}: {simd}, {n} rows")
            outs = [np.empty((n, 37), np.float32), np.empty((n, 37), np.float32)]
            kk.matmul_multi(code, [raw, raw], 512, x, outs, level, 2, 1e38, [aux, aux])
            np.testing.assert_array_equal(outs[0], with_aux)
            np.testing.assert_array_equal(outs[1], with_aux)
            ref = REF.matmul(w, quantized_activations(x, dtype))
            assert rel_err(with_aux, ref) <= 1e-5
    ids = np.array([0, 7, 8, 36, 17, 36], np.int64)  # the scales and mins packed back too
    rows_aux, rows = np.empty((6, 512), np.float32), np.empty((6, 512), np.float32)
    kk.get_rows(code, raw, 512, ids, rows_aux, levels[-1], aux)
    kk.get_rows(code, raw, 512, ids, rows, levels[-1], None)
    np.testing.assert_array_equal(rows_aux, rows)
    with pytest.raises(ValueError, match="rows do not hold"):
        kk.repack(code, raw, 384 if dtype in K_QUANTS | {DType.IQ4_XS} else 544)  # too wide


@pytest.mark.skipif("avx2" not in available_simd(), reason="the repacked kernels need AVX2")
@pytest.mark.parametrize("dtype", list(KQ_CODES))
def test_kquant_repacked_16_rows_are_bit_identical(dtype: DType) -> None:
    """Q2_K to Q6_K repacked weights go through the 512-bit kernels two groups of 8 rows at
    a time on VNNI (mc_gemm_zmm.h; from 32 x rows on each pair unpacked once first) and a
    tile's last single group through the 256-bit ones (every type on AVX2: every group
    through those): every height (one group; an odd number of groups; a last
    group of fewer than 8 rows; tiles ending 9-15 rows past a pair) and x row count (1-9,
    17, 35: a last group of x rows of every size) gives what the scalar, AVX2 and VNNI
    kernels on the weights as stored give, on 1 and 2 threads (at the best SIMD level here)."""
    from modelc._kernels import kernels as kk

    rng = np.random.default_rng(16)
    code = KQ_CODES[dtype]
    best = SIMD_LEVELS[available_simd()[0]]
    for rows in (8, 13, 24, 29, 40, 72):
        blocks = np.array(make_weight(dtype, rows, 512, rng).data).reshape(rows, 2, -1)
        for off, value in RANDOM_BLOCK_SCALES.get(
            dtype, {}
        ).items():  # f16 scales of every row apart
            scales = (value * rng.uniform(0.5, 2.0, (rows, 2))).astype(np.float16)
            blocks[:, :, off : off + 2] = scales.view(np.uint8).reshape(rows, 2, 2)
        raw = np.ascontiguousarray(blocks.reshape(rows, -1))
        aux = kk.repack(code, raw, 512)
        for n in (*range(1, 10), 17, 35):
            x = rng.standard_normal((n, 512)).astype(np.float32)
            for nth in (1, 2):
                with_aux = np.empty((n, rows), np.float32)
                kk.matmul(code, raw, 512, x, with_aux, best, nth, 1e38, aux)
                for simd in same_as_repacked(dtype):
                    want = np.empty((n, rows), np.float32)
                    kk.matmul(code, raw, 512, x, want, SIMD_LEVELS[simd], nth, 1e38, None)
                    np.testing.assert_array_equal(
                        with_aux, want, err_msg=f"{simd}, {rows} x {n} rows, {nth} threads"
                    )


@pytest.mark.parametrize("dtype", list(KQ_CODES))
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_kquant_repacked_sums_at_their_bounds_are_bit_identical(dtype: DType, sign: float) -> None:
    """The repacked kernels' integer steps hold at the extremes: every int and scale at its
    largest (every byte but the f16 scales 0xFF) against x rows quantizing to +-127
    everywhere, the widest sums the 16-bit steps can see (the zmm Q4_K kernel takes each
    half sub-block's sum as an int16, which Q5_K's ints would overflow), at row counts
    for every path (1, 8, 16, 35 x rows), equal the kernels' on the weights as stored.
    Q6_K's int8 scales also at -128 and 127 (0xFF is -1), as its zmm kernels multiply a
    sum by one split into int16 halves (sum & 255, sum >> 8) against (sc, 256 sc)."""
    from modelc._kernels import kernels as kk

    rows, cols = 24, 512
    bs, ts = BLOCK_SIZES[dtype]
    code = KQ_CODES[dtype]
    best = SIMD_LEVELS[available_simd()[0]]
    for fill in INT8_SCALE_FILLS.get(dtype, (None,)):
        raw = np.full((rows, cols // bs, ts), 0xFF, np.uint8)
        for off, value in BOUND_SCALES.get(dtype, {}).items():
            raw[:, :, off : off + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
        if dtype is DType.MXFP4:  # its E8M0 scale: 2^-1 (0xFF: 2^127)
            raw[:, :, 0] = 127
        if fill is not None:
            raw[:, :, INT8_SCALES[dtype]] = fill
        raw = np.ascontiguousarray(raw.reshape(rows, -1))
        aux = kk.repack(code, raw, cols)
        for n in (1, 8, 16, 35):
            x = np.full((n, cols), sign, np.float32)
            with_aux = np.empty((n, rows), np.float32)
            kk.matmul(code, raw, cols, x, with_aux, best, 2, 1e38, aux)
            want = np.empty((n, rows), np.float32)
            kk.matmul(
                code, raw, cols, x, want, SIMD_LEVELS[same_as_repacked(dtype)[-1]], 1, 1e38, None
            )
            np.testing.assert_array_equal(with_aux, want, err_msg=f"{n} x rows, scale bytes {fill}")


@pytest.mark.skipif("avx2" not in available_simd(), reason="the wide kernels are AVX2's")
@pytest.mark.parametrize("dtype", [DType.Q3_K, DType.Q4_K, DType.Q5_K, DType.Q6_K])
def test_kquant_wide_x_path_is_bit_identical(dtype: DType) -> None:
    """From 32 x rows on AVX2 the K-quants' repacked weights go through mc_gemm_kwide.h
    (each group unpacked once, x rows in the lanes, two weight rows a step against 4
    groups of 8 x rows): its results equal the stored weights' at every SIMD level here,
    for x row counts that leave a last tile of 1-4 groups and a last group of 1-8 rows,
    weight heights that leave a last group of fewer than 8 rows and more than one unpacked
    chunk (up to 4 groups; 2 at 8192 columns), on 1 and 2 threads; and they match numpy."""
    from modelc._kernels import kernels as kk

    rng = np.random.default_rng(32)
    code = KQ_CODES[dtype]
    avx2 = SIMD_LEVELS["avx2"]
    for rows, K, counts in (
        (13, 512, (32, 33, 47)),
        (72, 512, (40, 64, 100)),
        (29, 8192, (35, 57)),
    ):
        blocks = np.array(make_weight(dtype, rows, K, rng).data).reshape(rows, K // 256, -1)
        for off, value in RANDOM_BLOCK_SCALES[dtype].items():  # f16 scales of every row apart
            scales = (value * rng.uniform(0.5, 2.0, (rows, K // 256))).astype(np.float16)
            blocks[:, :, off : off + 2] = scales.view(np.uint8).reshape(rows, K // 256, 2)
        raw = np.ascontiguousarray(blocks.reshape(rows, -1))
        w = Weight(dtype, (rows, K), raw)
        aux = kk.repack(code, raw, K)
        for n in counts:
            x = rng.standard_normal((n, K)).astype(np.float32)
            x[:, 5] *= 40.0  # a column far above the rest (int8 blocks with a large scale)
            for nth in (1, 2):
                got = np.empty((n, rows), np.float32)
                kk.matmul(code, raw, K, x, got, avx2, nth, 1e38, aux)
                for simd in available_simd():
                    want = np.empty((n, rows), np.float32)
                    kk.matmul(code, raw, K, x, want, SIMD_LEVELS[simd], nth, 1e38, None)
                    np.testing.assert_array_equal(
                        got, want, err_msg=f"{simd}, {rows} x {K}, {n} x rows, {nth} threads"
                    )
            outs = [np.empty((n, rows), np.float32), np.empty((n, rows), np.float32)]
            kk.matmul_multi(code, [raw, raw], K, x, outs, avx2, 2, 1e38, [aux, aux])
            np.testing.assert_array_equal(outs[0], got)
            np.testing.assert_array_equal(outs[1], got)
            assert rel_err(got, REF.matmul(w, quantized_activations(x, dtype))) <= 1e-5


@pytest.mark.skipif("avx512vnni" not in available_simd(), reason="the repacked kernels are VNNI's")
@pytest.mark.parametrize("dtype", [DType.Q8_0, DType.Q4_1, *KQ_CODES])
def test_repacked_weights_hand_back_file_pages(tmp_path: Path, dtype: DType) -> None:
    """Weights read from a file mapping (as GGUF and .modelc files are): the backend
    repacks them on first use, hands the file's pages back to the OS, and the mapping
    still reads the same bytes; results equal the unpacking kernels' for 1-9 x rows."""
    from modelc._kernels import kernels as kk
    from modelc.runtime.backends.cpu_weights import file_mapped

    rng = np.random.default_rng(9)
    w = make_weight(dtype, 4096, 256, rng)  # 160-ish pages of rows
    raw = np.ascontiguousarray(w.data)
    path = tmp_path / "w.bin"
    raw.tofile(path)
    mapped = np.memmap(path, np.uint8, "r", shape=raw.shape)
    assert file_mapped(mapped) and not file_mapped(raw)
    cpu = CpuBackend(simd="avx512vnni")  # repacks what is file-mapped, not what is in memory
    assert cpu._gemm_aux(w, raw) is None
    code = {DType.Q8_0: kk.Q8_0, DType.Q4_1: kk.Q4_1, **KQ_CODES}[dtype]
    for n in (1, 2, 5, 8, 9):
        x = rng.standard_normal((n, 256)).astype(np.float32)
        want = np.empty((n, 4096), np.float32)
        kk.matmul(code, raw, 256, x, want, cpu.simd, 2, 1e38, None)  # no repacked copy
        np.testing.assert_array_equal(cpu.matmul(Weight(dtype, w.shape, mapped), x), want)
    wm = Weight(dtype, w.shape, mapped)
    assert cpu._gemm_aux(wm, cpu._rows(wm)) is not None  # the mapped weight's copy was made
    ids = np.array([3, 4095, 1000], np.int64)  # a tied embedding's lookups: from the copy
    np.testing.assert_array_equal(cpu.get_rows(wm, ids), REF.get_rows(w, ids))
    np.testing.assert_array_equal(np.asarray(mapped), raw)  # the pages read back intact
    if sys.platform == "linux":  # MADV_PAGEOUT (Linux 5.4+)
        assert kk.release_pages(mapped)
        np.testing.assert_array_equal(np.asarray(mapped), raw)


def _huge_kib(addr: int) -> int:
    """AnonHugePages (KiB) of the mapping of this process holding ``addr``, as the kernel
    reports it in /proc/self/smaps."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    raise AssertionError(f"no mapping holds {addr:#x}")


@pytest.mark.skipif(
    not Path("/sys/kernel/mm/transparent_hugepage/enabled").exists()
    or "[never]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text(),
    reason="transparent huge pages are Linux's, when not turned off",
)
@pytest.mark.skipif("avx512vnni" not in available_simd(), reason="the repacked kernels are VNNI's")
def test_repacked_weights_sit_in_huge_pages(tmp_path: Path) -> None:
    """The repacked copies (what batch-1 decode streams every token) are packed one after
    another into 2 MiB pages, as the kernel's own accounting shows, even where each is
    smaller than numpy's 4 MiB threshold for advising huge pages; results unchanged."""
    from modelc.runtime.backends.hugemem import HUGE, HugeArena

    rng = np.random.default_rng(3)
    cpu = CpuBackend(simd="avx512vnni")
    copies = []
    for i in range(6):  # 6 x 576 KiB: small weights, as a 1B's attention matrices are
        w = make_weight(DType.Q4_K, 4096, 256, rng)
        path = tmp_path / f"w{i}.bin"
        np.ascontiguousarray(w.data).tofile(path)
        wm = Weight(DType.Q4_K, w.shape, np.memmap(path, np.uint8, "r", shape=w.data.shape))
        x = rng.standard_normal((1, 256)).astype(np.float32)
        np.testing.assert_array_equal(
            cpu.matmul(wm, x), CpuBackend(simd="avx512vnni", repack=False).matmul(w, x)
        )
        copies.append(cpu._gemm_aux(wm, cpu._rows(wm)))
    addrs = [c.ctypes.data for c in copies if c is not None]
    assert len(addrs) == 6 and all(a % 64 == 0 for a in addrs)
    assert [b - a for a, b in itertools.pairwise(addrs)] == [copies[0].nbytes] * 5  # packed
    assert _huge_kib(addrs[0]) >= HUGE // 1024  # the kernel backs them with huge pages
    a = HugeArena(chunk=HUGE)
    big = a.empty((3, HUGE), np.uint8)  # larger than a chunk: a region of its own
    small = a.empty((10,), np.float32)
    assert big.ctypes.data % HUGE == 0 and small.ctypes.data % HUGE == 0
    assert big.shape == (3, HUGE) and small.dtype == np.float32


def test_matmul_many_mixed_types_and_errors() -> None:
    rng = np.random.default_rng(7)
    cpu = CpuBackend()
    ws = [make_weight(DType.Q4_1, 32, 64, rng), make_weight(DType.Q8_0, 8, 64, rng)]
    x = rng.standard_normal((3, 64)).astype(np.float32)
    for g, w in zip(cpu.matmul_many(ws, x), ws, strict=True):  # one call per type
        np.testing.assert_array_equal(g, cpu.matmul(w, x))
    with pytest.raises(ValueError, match="2 weights but 1 outputs"):
        cpu.matmul_many(ws, x, [np.empty((3, 32), np.float32)])
    with pytest.raises(ValueError, match="shape mismatch"):
        cpu.matmul_many(ws[:1] * 2, x[:, :32])
    assert rel_err(cpu.matmul_many(ws, x)[0], REF.matmul_many(ws, x)[0]) <= 1e-2


@pytest.mark.parametrize("dtype", [d for d in MATMUL_DTYPES if d.is_quantized])
def test_balanced_mode(dtype: DType) -> None:
    """Gaussian rows: the int8 path.  A few outliers: taken out of the int8 rows and
    added back in float (twin below).  Many outliers: the float (exact) path."""
    rng = np.random.default_rng(18)
    w = make_weight(dtype, 50, 512, rng)
    dense = dequantize_weight(w).astype(np.float64)
    fast, exact = CpuBackend(matmul="fast"), CpuBackend(matmul="exact")
    balanced = CpuBackend(matmul="balanced")
    x = rng.standard_normal((3, 512)).astype(np.float32)
    np.testing.assert_array_equal(balanced.matmul(w, x), fast.matmul(w, x))

    # each swamps its block's scale; positions reach every nibble / quarter layout
    x[1, 7], x[1, 300], x[2, 117], x[2, 400] = 400.0, -250.0, 90.0, 60.0
    outl = np.zeros_like(x)
    for i, j in [(1, 7), (1, 300), (2, 117), (2, 400)]:
        outl[i, j] = x[i, j]
    want = quantized_activations(x - outl, dtype).astype(np.float64) @ dense.T + outl @ dense.T
    got = balanced.matmul(w, x)
    assert rel_err(got, want) <= 1e-5
    assert rel_err(fast.matmul(w, x), REF.matmul(w, x)) > 1e-2 > rel_err(got, REF.matmul(w, x))

    x[0, ::32] = 300.0  # 16 outliers: more than the 4 a row may set aside
    np.testing.assert_array_equal(balanced.matmul(w, x)[0], exact.matmul(w, x)[0])

    # each row decides alone: in a batch of 11, row 0 takes the float path, the rest int8
    xb = np.concatenate([x, rng.standard_normal((8, 512)).astype(np.float32)])  # (11, 512)
    got = balanced.matmul(w, xb)
    for i in range(len(xb)):
        np.testing.assert_array_equal(got[i], balanced.matmul(w, xb[i : i + 1])[0])
    np.testing.assert_array_equal(got[0], exact.matmul(w, xb[:1])[0])
    np.testing.assert_array_equal(got[3:], fast.matmul(w, xb[3:]))


def test_matmul_threads_give_identical_results() -> None:
    rng = np.random.default_rng(5)
    w = make_weight(DType.Q4_1, 1000, 576, rng)
    x = rng.standard_normal((8, 576)).astype(np.float32)
    np.testing.assert_array_equal(
        CpuBackend(threads=1).matmul(w, x), CpuBackend(threads=2).matmul(w, x)
    )


def test_simd_and_scalar_paths_agree() -> None:
    rng = np.random.default_rng(6)
    for dtype in MATMUL_DTYPES:
        w = make_weight(dtype, 33, cols_for(dtype), rng)
        x = rng.standard_normal((5, w.shape[1])).astype(np.float32)
        slow = CpuBackend(simd="scalar").matmul(w, x).astype(np.float64)
        for name in available_simd():
            assert rel_err(CpuBackend(simd=name).matmul(w, x), slow) <= 1e-6, (dtype, name)
    if {"avx2", "avx512vnni"} <= set(available_simd()):  # same integer sums, same float ops
        for dtype in MATMUL_DTYPES:
            w = make_weight(dtype, 33, cols_for(dtype), rng)
            x = rng.standard_normal((13, w.shape[1])).astype(np.float32)
            want = CpuBackend(simd="avx2").matmul(w, x)
            for simd, repack in [("avx512vnni", False), ("avx512vnni", True), ("avx2", True)]:
                got = CpuBackend(simd=simd, repack=repack).matmul(w, x)
                np.testing.assert_array_equal(got, want)


def test_matmul_writes_into_out_and_tolerates_readonly_weights() -> None:
    rng = np.random.default_rng(7)
    w = make_weight(DType.Q8_0, 40, 64, rng)
    w.data.flags.writeable = False
    x = rng.standard_normal((3, 64)).astype(np.float32)
    out = np.full((3, 40), np.nan, dtype=np.float32)
    assert CpuBackend().matmul(w, x, out) is out
    assert rel_err(out, REF.matmul(w, x)) <= 1e-2


def test_type_without_kernel_falls_back_to_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every GGUF weight type has a kernel now; one taken out of the dispatch table runs on
    the numpy twin, and ``kernel_for`` says so."""
    rng = np.random.default_rng(8)
    dense = rng.standard_normal((9, 64)).astype(np.float32)
    w = Weight(DType.Q5_1, (9, 64), gguf_quantize(dense, gguf.GGMLQuantizationType.Q5_1))
    monkeypatch.delitem(cpu_backend.TYPE_CODES, DType.Q5_1)
    cpu = CpuBackend()
    assert cpu.kernel_for(DType.Q5_1) == "numpy"
    x = rng.standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_allclose(cpu.matmul(w, x), REF.matmul(w, x), rtol=1e-6)


def test_matmul_rejects_mismatched_shapes() -> None:
    w = make_weight(DType.Q8_0, 4, 64, np.random.default_rng(0))
    with pytest.raises(ValueError):
        CpuBackend().matmul(w, np.zeros((2, 32), dtype=np.float32))


# ------------------------------------------------------------ environment knobs


def test_env_selects_scalar_path_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELC_SIMD", "scalar")
    monkeypatch.setenv("MODELC_THREADS", "3")
    monkeypatch.setenv("MODELC_MATMUL", "exact")
    b = CpuBackend()
    assert (b.simd, b.threads, b.exact, b.tol) == (0, 3, True, 0.0)
    monkeypatch.setenv("MODELC_MATMUL", "balanced")
    assert CpuBackend().tol == 0.01


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("MODELC_THREADS", "lots"),
        ("MODELC_THREADS", "0"),
        ("MODELC_SIMD", "sse9"),
        ("MODELC_MATMUL", "turbo"),
    ],
)
def test_bad_env_raises_config_error(monkeypatch: pytest.MonkeyPatch, var: str, value: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=var):
        CpuBackend()


# -------------------------------------------------------------- real SmolLM2


@pytest.fixture(scope="module")
def smollm2() -> dict[str, Weight | np.ndarray[Any, Any]]:
    reader = open_reader(assets.smollm2_gguf())  # gguf's reader, fields read in one piece
    want = {
        "token_embd.weight",
        "blk.0.attn_norm.weight",
        "blk.0.attn_q.weight",
        "blk.0.attn_k.weight",
        "blk.0.ffn_down.weight",
    }
    out: dict[str, Weight | np.ndarray[Any, Any]] = {}
    for t in reader.tensors:
        if t.name not in want:
            continue
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            out[t.name] = np.asarray(t.data, dtype=np.float32)
        else:
            cols, rows = (int(s) for s in t.shape)
            out[t.name] = Weight(DType[t.tensor_type.name], (rows, cols), np.asarray(t.data))
    return out


def REF_DENSE(w: Weight) -> np.ndarray[Any, Any]:
    return REF._dense(w).astype(np.float64)


def test_real_smollm2_tensors(cpu: CpuBackend, smollm2: dict[str, Any]) -> None:
    embd: Weight = smollm2["token_embd.weight"]
    assert embd.dtype is DType.Q8_0
    ids = np.array([1, 504, 2260, 28, 49151, 17, 9, 3000], dtype=np.int64)
    x = cpu.get_rows(embd, ids)  # (8, 576) real activations
    full = gguf_dequantize(np.asarray(embd.data)[ids], gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(x, full)
    h = cpu.rms_norm(x, smollm2["blk.0.attn_norm.weight"], 1e-5)
    np.testing.assert_allclose(
        h, REF.rms_norm(x, smollm2["blk.0.attn_norm.weight"], 1e-5), rtol=1e-5, atol=1e-6
    )
    rng_ffn = np.random.default_rng(9).standard_normal((8, 1536)).astype(np.float32)
    exact = CpuBackend(
        simd=next(n for n in available_simd() if SIMD_LEVELS[n] == cpu.simd), matmul="exact"
    )
    head = Weight(DType.Q8_0, (4096, 576), np.asarray(embd.data)[:4096])  # part of the tied head
    for w, act in [
        (smollm2["blk.0.attn_q.weight"], h),
        (smollm2["blk.0.attn_k.weight"], h),
        (smollm2["blk.0.ffn_down.weight"], rng_ffn),
        (head, h),
    ]:
        assert w.dtype in (DType.Q4_1, DType.Q8_0)
        for n in BATCHES:
            a = np.ascontiguousarray(np.resize(act, (n, act.shape[1])))
            got = cpu.matmul(w, a)
            want = quantized_activations(a, w.dtype).astype(np.float64) @ REF_DENSE(w).T
            assert rel_err(got, want) <= 1e-5
            assert rel_err(got, REF.matmul(w, a)) <= 2e-2
            assert rel_err(exact.matmul(w, a), REF.matmul(w, a)) <= 1e-5


# ------------------------------------------------------------- float kernels


def test_rms_norm_and_layer_norm(cpu: CpuBackend) -> None:
    rng = np.random.default_rng(10)
    for n, d in [(1, 576), (3, 37), (17, 384)]:
        x = (rng.standard_normal((n, d)) * 3 + 0.5).astype(np.float32)
        w = rng.standard_normal(d).astype(np.float32)
        b = rng.standard_normal(d).astype(np.float32)
        np.testing.assert_allclose(
            cpu.rms_norm(x, w, 1e-6), REF.rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-6
        )
        got = cpu.layer_norm(x, w, b, 1e-12)
        np.testing.assert_allclose(got, REF.layer_norm(x, w, b, 1e-12), rtol=1e-5, atol=1e-5)
        out = np.empty_like(x)
        assert cpu.rms_norm(x, w, 1e-6, out=out) is out


@pytest.mark.parametrize("neox", [False, True])
def test_rope(cpu: CpuBackend, neox: bool) -> None:
    rng = np.random.default_rng(11)
    for n, heads, hd, rot in [(1, 9, 64, 64), (3, 3, 64, 64), (17, 4, 80, 32)]:
        x = rng.standard_normal((n, heads, hd)).astype(np.float32)
        pos = rng.integers(0, 8192, n).astype(np.int64)
        inv_freq = (1.0 / 100000.0 ** (np.arange(0, rot, 2) / rot)).astype(np.float32)
        want = REF.rope(x.copy(), REF.rope_angles(pos, inv_freq), neox)
        got = x.copy()
        angles = cpu.rope_angles(pos, inv_freq)
        for a, b in zip(angles, REF.rope_angles(pos, inv_freq), strict=True):
            np.testing.assert_array_equal(a, b)  # the same float32 cos / sin
        assert cpu.rope(got, angles, neox) is got
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[..., rot:], x[..., rot:])  # past rot_dim untouched


def test_rope_on_strided_view_is_in_place(cpu: CpuBackend) -> None:
    rng = np.random.default_rng(12)
    qkv = rng.standard_normal((5, 12, 64)).astype(np.float32)
    q = qkv[:, :9]  # not contiguous
    inv_freq = (1.0 / 10000.0 ** (np.arange(0, 64, 2) / 64)).astype(np.float32)
    pos = np.arange(5)
    want = REF.rope(q.copy(), REF.rope_angles(pos, inv_freq), False)
    cpu.rope(q, cpu.rope_angles(pos, inv_freq), False)
    np.testing.assert_allclose(qkv[:, :9], want, rtol=1e-5, atol=1e-5)


def test_softmax_silu_gelu(cpu: CpuBackend) -> None:
    rng = np.random.default_rng(13)
    for n, d in [(1, 49152), (3, 7), (17, 100)]:
        x = (rng.standard_normal((n, d)) * 20).astype(np.float32)
        x[0, 0] = -np.inf  # masked entry
        got = cpu.softmax(x.copy())
        np.testing.assert_allclose(got, REF.softmax(x.copy()), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-5)
        g, u = x.copy(), rng.standard_normal((n, d)).astype(np.float32)
        g[0, 0] = -200.0
        np.testing.assert_allclose(cpu.silu_mul(g, u), REF.silu_mul(g, u), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(cpu.gelu(g), REF.gelu(g), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(cpu.gelu_erf(g), REF.gelu_erf(g), rtol=1e-5, atol=1e-6)


def test_gelu_erf_against_math_erf(cpu: CpuBackend) -> None:
    """BERT's exact GELU x / 2 (1 + erf(x / sqrt 2)) in C (float32 arithmetic, the numpy
    twin's erf formula) against Python's math.erf: within 3e-7 of the float64 value (scaled
    by |x| past 1), for x across the range where it is neither 0 nor x, 0, signs, huge."""
    x = np.concatenate(
        [np.linspace(-12, 12, 4801), [0.0, -0.0, 1e-30, -1e-30, 30.0, -30.0, 1e30, -1e30]]
    ).astype(np.float32)
    want = np.asarray([v / 2 * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    got = cpu.gelu_erf(x)
    assert np.all(np.abs(got - want) <= 3e-7 * np.maximum(1.0, np.abs(x)))
    assert cpu.gelu_erf(x, out=x) is x  # in place
    np.testing.assert_array_equal(x, got)


@pytest.mark.parametrize("threads", [2, 3])
def test_norm_and_activations_split_across_threads_are_bit_identical(
    cpu: CpuBackend, threads: int
) -> None:
    """rms_norm (16 rows a chunk), silu_mul, gelu and gelu_erf (32768 elements a chunk) on a prefill's
    sizes go to the thread pool: the same bits as one thread, for row and element counts
    that leave a part chunk and a tail shorter than a vector, and near the numpy twins."""
    level = next(k for k, v in SIMD_LEVELS.items() if v == cpu.simd)
    one, many = CpuBackend(threads=1, simd=level), CpuBackend(threads=threads, simd=level)
    rng = np.random.default_rng(42)
    x = (rng.standard_normal((41, 2048)) * 3).astype(np.float32)
    w = rng.standard_normal(2048).astype(np.float32)
    got = many.rms_norm(x, w, 1e-5)
    np.testing.assert_array_equal(got, one.rms_norm(x, w, 1e-5))
    np.testing.assert_allclose(got, REF.rms_norm(x, w, 1e-5), rtol=1e-5, atol=1e-6)
    g = (rng.standard_normal(100_003) * 4).astype(np.float32)
    u = rng.standard_normal(100_003).astype(np.float32)
    got = many.silu_mul(g, u)
    np.testing.assert_array_equal(got, one.silu_mul(g, u))
    np.testing.assert_allclose(got, REF.silu_mul(g, u), rtol=1e-5, atol=1e-6)
    got = many.gelu(g)
    np.testing.assert_array_equal(got, one.gelu(g))
    np.testing.assert_allclose(got, REF.gelu(g), rtol=1e-5, atol=1e-6)
    got = many.gelu_erf(g)
    np.testing.assert_array_equal(got, one.gelu_erf(g))
    np.testing.assert_allclose(got, REF.gelu_erf(g), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("simd", available_simd())
def test_tanh_against_numpy(simd: str) -> None:
    """The vectorised tanh the soft-capped attention scores go through: within 2e-7
    relative of numpy's (float64) tanh from denormals through the polynomial / exp
    branches' seam at 0.625 to |x| past exp's clamp, exactly +-0 and +-1 at the ends,
    NaN kept; any length (the tail goes through a padded vector)."""
    rng = np.random.default_rng(31)
    mags = np.concatenate([np.logspace(-44, 2.5, 30_000), np.linspace(0, 60, 30_001)])
    seam = np.float32(0.625)
    x = np.concatenate(
        [
            mags,
            -mags,
            rng.standard_normal(10_000) * 5,
            [seam, np.nextafter(seam, np.float32(0)), 44.0, 44.5, 88.0, 89.0, 1e30, np.inf],
            [-0.0, -np.inf, 1e-45, -1e-45, 1.2e-38],
        ]
    ).astype(np.float32)
    want = np.tanh(x.astype(np.float64))
    for n in (len(x), len(x) - 3, 5, 1):  # tails of every length in 1 .. 7 here
        got = np.full(n, np.nan, np.float32)
        cpu_backend._k.tanh(x[:n], got, SIMD_LEVELS[simd])
        tiny = np.abs(want[:n]) < 1e-37  # denormal results: within a denormal's spacing
        np.testing.assert_allclose(got[~tiny], want[:n][~tiny], rtol=2e-7, atol=0)
        np.testing.assert_allclose(got[tiny], want[:n][tiny], rtol=0, atol=2e-45)
    out = np.empty_like(x)
    cpu_backend._k.tanh(x, out, SIMD_LEVELS[simd])
    assert np.all(out[np.abs(x) >= 10] == np.sign(x[np.abs(x) >= 10]))
    assert out[x == 0].tolist() == [0.0] * int((x == 0).sum())
    assert np.signbit(out[np.signbit(x) & (x == 0)]).all()  # -0 stays -0
    nan = np.full(9, np.nan, np.float32)
    cpu_backend._k.tanh(nan, nan, SIMD_LEVELS[simd])  # in place
    assert np.isnan(nan).all()


@pytest.mark.parametrize(
    ("n_q", "q_pos0", "n_kv"), [(1, 0, 1), (1, 149, 150), (3, 40, 43), (17, 0, 17), (8, 120, 128)]
)
def test_attention(cpu: CpuBackend, n_q: int, q_pos0: int, n_kv: int) -> None:
    rng = np.random.default_rng(14)
    n_head, n_head_kv, hd = 9, 3, 64
    q = rng.standard_normal((n_q, n_head, hd)).astype(np.float32)
    k = rng.standard_normal((n_kv, n_head_kv, hd)).astype(np.float32)
    v = rng.standard_normal((n_kv, n_head_kv, hd)).astype(np.float32)
    scale = 1.0 / np.sqrt(hd)
    want = REF.attention(q, k, v, q_pos0, scale)
    out = np.empty_like(q)
    assert cpu.attention(q, k, v, q_pos0, scale, out=out) is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_attention_prefill_equals_decode_steps(cpu: CpuBackend) -> None:
    rng = np.random.default_rng(15)
    q = rng.standard_normal((6, 4, 32)).astype(np.float32)
    k = rng.standard_normal((6, 2, 32)).astype(np.float32)
    v = rng.standard_normal((6, 2, 32)).astype(np.float32)
    full = cpu.attention(q, k, v, 0, 0.2)
    for i in range(6):
        step = cpu.attention(q[i : i + 1], k[: i + 1], v[: i + 1], i, 0.2)
        np.testing.assert_allclose(step[0], full[i], rtol=1e-6, atol=1e-6)


def attention_batch_case(
    rng: np.random.Generator, kv_dtype: type[np.floating[Any]]
) -> tuple[list[F32Array], list[np.ndarray[Any, Any]], list[np.ndarray[Any, Any]], list[int]]:
    """Prefill chunks and single decode tokens of mixed lengths (9 query heads over 3 KV
    heads of 64): qs, ks, vs (caches of ``kv_dtype``) and each sequence's q_pos0."""
    shapes = [(17, 0), (1, 149), (5, 40), (1, 0), (1, 7), (64, 64)]  # (n_q, q_pos0)
    qs = [rng.standard_normal((n, 9, 64)).astype(np.float32) for n, _ in shapes]
    ks = [rng.standard_normal((n + p0, 3, 64)).astype(kv_dtype) for n, p0 in shapes]
    vs = [rng.standard_normal((n + p0, 3, 64)).astype(kv_dtype) for n, p0 in shapes]
    return qs, ks, vs, [p0 for _, p0 in shapes]


def test_attention_batch_equals_per_sequence_attention(cpu: CpuBackend) -> None:
    """One batched call over prefill chunks and single decode tokens of mixed lengths
    (GQA) gives each sequence exactly what its own ``attention`` call gives."""
    qs, ks, vs, p0s = attention_batch_case(np.random.default_rng(16), np.float32)
    scale = 0.125
    outs = [np.full_like(q, np.nan) for q in qs]
    got = cpu.attention_batch(qs, ks, vs, p0s, scale, outs=outs)
    assert all(g is o for g, o in zip(got, outs, strict=True))
    want_ref = REF.attention_batch(qs, ks, vs, p0s, scale)
    for i, (q, k, v, p0) in enumerate(zip(qs, ks, vs, p0s, strict=True)):
        np.testing.assert_array_equal(got[i], cpu.attention(q, k, v, p0, scale), err_msg=f"seq {i}")
        np.testing.assert_allclose(got[i], want_ref[i], rtol=1e-5, atol=1e-5, err_msg=f"seq {i}")
    # without outs: fresh arrays, same values
    for g, w in zip(cpu.attention_batch(qs, ks, vs, p0s, scale), got, strict=True):
        np.testing.assert_array_equal(g, w)
    assert cpu.attention_batch([], [], [], [], scale) == []
    with pytest.raises(ValueError, match="sequence 1"):
        cpu.attention_batch(qs[:2], [ks[0], ks[0][:, :1]], vs[:2], p0s[:2], scale)


@pytest.mark.parametrize("kv", [np.float32, np.float16])
def test_attention_append_writes_then_attends(cpu: CpuBackend, kv: type) -> None:
    """The new rows land in each store exactly as numpy's assignment puts them (f16: round
    to nearest even), and each sequence gets what attention_batch gives over its stores."""
    rng = np.random.default_rng(17)
    n_head, n_head_kv, hd, scale = 9, 3, 64, 0.125
    shapes = [(17, 0), (1, 149), (5, 40), (1, 7), (64, 64)]  # (new rows, cached rows)
    rows = sum(n for n, _ in shapes)
    starts, counts = [p0 for _, p0 in shapes], [n for n, _ in shapes]

    def stores() -> list[list[np.ndarray[Any, Any]]]:  # 3 spare slots each
        g = np.random.default_rng(18)
        return [
            [g.standard_normal((n + p0 + 3, n_head_kv, hd)).astype(kv) for _ in range(2)]
            for n, p0 in shapes
        ]

    q = rng.standard_normal((rows, n_head, hd)).astype(np.float32)
    k_new = rng.standard_normal((rows, n_head_kv, hd)).astype(np.float32)
    v_new = rng.standard_normal((rows, n_head_kv, hd)).astype(np.float32)

    def run(be: Any, k: np.ndarray[Any, Any], st: list[list[Any]], out: Any) -> Any:
        ks, vs = [s[0] for s in st], [s[1] for s in st]
        return be.attention_append(q, k, v_new, ks, vs, starts, counts, scale, out)

    # the stored rows: conversion edge cases (subnormal, underflow, overflow, ties, inf)
    edge = k_new.copy()
    edge[0, 0, :6] = [1e-6, -3e-8, 70000.0, 2049.0, 2051.0, np.inf]
    got_st, want_st = stores(), stores()
    r = 0
    with np.errstate(over="ignore"):
        for (n, p0), (wk, wv) in zip(shapes, want_st, strict=True):
            wk[p0 : p0 + n], wv[p0 : p0 + n] = edge[r : r + n], v_new[r : r + n]
            r += n
        run(cpu, edge, got_st, np.empty_like(q))
    for i, (g, w) in enumerate(zip(got_st, want_st, strict=True)):
        np.testing.assert_array_equal(g[0].view(np.uint8), w[0].view(np.uint8), err_msg=f"seq {i}")
        np.testing.assert_array_equal(g[1].view(np.uint8), w[1].view(np.uint8), err_msg=f"seq {i}")

    # the attention: as attention_batch over the stores once written, and the reference
    st = stores()
    out = np.full_like(q, np.nan)
    assert run(cpu, k_new, st, out) is out
    bounds = np.cumsum([0, *counts])
    want = cpu.attention_batch(
        [q[a:b] for a, b in itertools.pairwise(bounds)],
        [s[0][: p0 + n] for s, (n, p0) in zip(st, shapes, strict=True)],
        [s[1][: p0 + n] for s, (n, p0) in zip(st, shapes, strict=True)],
        starts,
        scale,
    )
    np.testing.assert_array_equal(out, np.concatenate(want))
    ref = run(REF, k_new, stores(), np.empty_like(q))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_attention_append_rejects_bad_input(cpu: CpuBackend) -> None:
    q = np.zeros((3, 4, 8), np.float32)
    kv = np.zeros((3, 2, 8), np.float32)
    st = [np.zeros((4, 2, 8), np.float32)]
    with pytest.raises(ValueError, match="does not fit"):
        cpu.attention_append(q, kv, kv, st, st, [2], [3], 1.0, np.empty_like(q))
    with pytest.raises(ValueError, match="add up"):
        cpu.attention_append(q, kv, kv, st, st, [0], [2], 1.0, np.empty_like(q))
    with pytest.raises(ValueError, match="all be float32 or all float16"):
        cpu.attention_append(q, kv, kv, st, [st[0].astype(np.float16)], [0], [3], 1.0, q.copy())
    with pytest.raises(ValueError, match="storage shape"):
        cpu.attention_append(
            q, kv, kv, st, [np.zeros((3, 2, 8), np.float32)], [0], [3], 1.0, q.copy()
        )


# f16 KV cache: (n_head, n_head_kv, hd, n_q, q_pos0) covering GQA groups of 3, MQA with a
# group larger than one work item holds (32 heads of 128: two items of 16), hd not a
# multiple of 8 (scalar kernel on every path), hd/8 not a multiple of 4 (40), rows
# converted in blocks smaller than a 64-row chunk (hd 128: 32 rows, hd 512: 8 rows),
# decode rows and prefill chunks.
F16_ATT_SHAPES = [
    (9, 3, 64, 1, 0),
    (9, 3, 64, 1, 200),
    (9, 3, 64, 7, 40),
    (32, 1, 128, 1, 90),
    (6, 2, 20, 5, 11),
    (4, 4, 32, 3, 64),
    (6, 2, 40, 3, 70),
    (2, 1, 512, 2, 100),
]


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize(("n_head", "n_head_kv", "hd", "n_q", "q_pos0"), F16_ATT_SHAPES)
def test_attention_f16_cache(
    cpu: CpuBackend, threads: int, n_head: int, n_head_kv: int, hd: int, n_q: int, q_pos0: int
) -> None:
    """An f16 cache is read directly.  f16 -> f32 widening is exact and each head's
    arithmetic is the f32 kernel's, so the result is bit for bit the f32 kernel's on the
    widened cache, whether the heads of a KV head share one work item (threads=1) or
    get one each (threads=4 with fewer grouped items than threads); and within 1e-5 of
    the numpy twin."""
    be = CpuBackend(threads=threads, simd=next(k for k, v in SIMD_LEVELS.items() if v == cpu.simd))
    rng = np.random.default_rng(18)
    n_kv = q_pos0 + n_q
    q = rng.standard_normal((n_q, n_head, hd)).astype(np.float32)
    k = (rng.standard_normal((n_kv, n_head_kv, hd)) * 3).astype(np.float16)
    v = rng.standard_normal((n_kv, n_head_kv, hd)).astype(np.float16)
    scale = 1.0 / np.sqrt(hd)
    got = be.attention(q, k, v, q_pos0, scale)
    k32, v32 = k.astype(np.float32), v.astype(np.float32)
    np.testing.assert_array_equal(got, be.attention(q, k32, v32, q_pos0, scale))
    np.testing.assert_allclose(got, REF.attention(q, k, v, q_pos0, scale), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        REF.attention(q, k, v, q_pos0, scale), REF.attention(q, k32, v32, q_pos0, scale)
    )


@pytest.mark.skipif("avx512vnni" not in available_simd(), reason="no 512-bit attention here")
@pytest.mark.parametrize("hd", [40, 64, 128])
@pytest.mark.parametrize("kv", [np.float32, np.float16])
def test_attention_zmm_equals_avx2_bit_for_bit(hd: int, kv: type) -> None:
    """The VNNI level's attention tiles run their score and P . V GEMMs on 512-bit registers
    (cyx/mc_attn_zmm.h): the same FMA chains per output as the AVX2 level's, so the same
    bits, for head sizes with a last 16 or 8 columns (40 = 32 + 8), chunks whose last keys
    fill 16, 32 or 48 columns, decode rows and prefill tiles, GQA, a window and a soft cap."""
    rng = np.random.default_rng(41)
    zmm, ymm = CpuBackend(simd="avx512vnni", threads=2), CpuBackend(simd="avx2", threads=2)
    n_head, n_head_kv = 8, 2
    for n_q, q_pos0, window, softcap in [
        (1, 0, 0, 0.0),
        (1, 149, 0, 0.0),
        (7, 40, 0, 0.0),
        (70, 0, 0, 0.0),
        (33, 100, 0, 30.0),
        (40, 60, 24, 0.0),
    ]:
        n_kv = q_pos0 + n_q
        q = rng.standard_normal((n_q, n_head, hd)).astype(np.float32)
        k = rng.standard_normal((n_kv, n_head_kv, hd)).astype(kv)
        v = rng.standard_normal((n_kv, n_head_kv, hd)).astype(kv)
        args = (q, k, v, q_pos0, 1.0 / np.sqrt(hd))
        got = zmm.attention(*args, window=window, softcap=softcap)
        want = ymm.attention(*args, window=window, softcap=softcap)
        np.testing.assert_array_equal(got, want, err_msg=f"{n_q} rows from {q_pos0}")
        np.testing.assert_allclose(
            got, REF.attention(*args, window=window, softcap=softcap), rtol=1e-5, atol=1e-5
        )


def test_attention_batch_f16_equals_per_sequence(cpu: CpuBackend) -> None:
    """A batch of f16 caches: each sequence gets exactly its own ``attention`` result.
    A batch mixing f16 and f32 caches is computed in f32 (widened), same values."""
    rng = np.random.default_rng(19)
    qs, ks, vs, p0s = attention_batch_case(rng, np.float16)
    n_head_kv, hd, scale = 3, 64, 0.125
    got = cpu.attention_batch(qs, ks, vs, p0s, scale)
    for i, (q, k, v, p0) in enumerate(zip(qs, ks, vs, p0s, strict=True)):
        np.testing.assert_array_equal(got[i], cpu.attention(q, k, v, p0, scale), err_msg=f"seq {i}")
    mixed_k = [k.astype(np.float32) if i % 2 else k for i, k in enumerate(ks)]
    for g, w in zip(cpu.attention_batch(qs, mixed_k, vs, p0s, scale), got, strict=True):
        np.testing.assert_array_equal(g, w)
    # a strided f16 array is copied to a contiguous one first: same result
    big = rng.standard_normal((80, n_head_kv, hd)).astype(np.float16)
    strided = big[::2]  # (40, n_head_kv, hd), not contiguous
    q1 = qs[1][:1]
    np.testing.assert_array_equal(
        cpu.attention(q1, strided, strided, 39, scale),
        cpu.attention(q1, strided.copy(), strided.copy(), 39, scale),
    )


# windowed / soft-capped attention: (n_head, n_head_kv, hd) for GQA groups of 1, 4 and 8,
# head sizes 64 and 128 (AVX2 kernel where the CPU has it) and 20 (hd % 8 != 0: the
# portable kernels on every path)
WINDOW_HEADS = [(4, 4, 64), (8, 2, 128), (8, 1, 64), (16, 2, 20), (8, 2, 64)]
WINDOWS = [0, 1, 7, 64, 1000]  # 1000: wider than every context here
SOFTCAPS = [0.0, 50.0, 2.0]  # 2.0: the cap changes most scores


@pytest.mark.parametrize("kv", [np.float32, np.float16])
@pytest.mark.parametrize(("n_head", "n_head_kv", "hd"), WINDOW_HEADS)
def test_attention_append_window_softcap(
    cpu: CpuBackend, kv: type, n_head: int, n_head_kv: int, hd: int
) -> None:
    """``window`` (query p sees keys p - window + 1 .. p) and ``softcap`` (scores
    c * tanh(s / c)) in one batch of prefill chunks and decode tokens: within 1e-5 of the
    numpy twin; and bit for bit: a window at least the context as no window, and each
    windowed query row as plain attention over its window's rows alone (the old
    per-row path: its chunks start where the window does)."""
    rng = np.random.default_rng(20)
    shapes = [(17, 0), (1, 149), (5, 40), (1, 7), (64, 64), (1, 300), (70, 3)]  # (new, cached)
    rows = sum(n for n, _ in shapes)
    starts, counts = [p0 for _, p0 in shapes], [n for n, _ in shapes]
    bounds = np.cumsum([0, *counts])
    scale = 1.0 / np.sqrt(hd)
    q = (rng.standard_normal((rows, n_head, hd)) * 3).astype(np.float32)  # scores of a few units
    k_new = rng.standard_normal((rows, n_head_kv, hd)).astype(np.float32)
    v_new = rng.standard_normal((rows, n_head_kv, hd)).astype(np.float32)
    cached = [
        [rng.standard_normal((n + p0, n_head_kv, hd)).astype(kv) for _ in range(2)]
        for n, p0 in shapes
    ]

    def run(be: Any, window: int, softcap: float, **kw: Any) -> F32Array:
        st = [[a.copy() for a in c] for c in cached]
        out = np.full_like(q, np.nan)
        args = (q, k_new, v_new, [c[0] for c in st], [c[1] for c in st], starts, counts, scale)
        be.attention_append(*args, out, window=window, softcap=softcap, **kw)
        return out

    base = run(cpu, 0, 0.0)
    np.testing.assert_array_equal(base, run(cpu, 1000, 0.0))  # the window covers everything
    st = [[a.copy() for a in c] for c in cached]
    plain = np.empty_like(q)  # no keyword arguments: the kernel before window / softcap
    cpu.attention_append(q, k_new, v_new, [c[0] for c in st], [c[1] for c in st], starts, counts, scale, plain)  # fmt: skip
    np.testing.assert_array_equal(base, plain)
    # the stores as the kernel leaves them (f16: rounded), for the per-row check
    ks, vs = [c[0] for c in st], [c[1] for c in st]
    for window in WINDOWS:
        for softcap in SOFTCAPS:
            msg = f"window {window}, softcap {softcap}"
            got = run(cpu, window, softcap)
            want = run(REF, window, softcap)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=msg)
            if window in (0, 1000) and softcap == 0.0:
                np.testing.assert_array_equal(got, base, err_msg=msg)
            if softcap == 2.0 and window == 0:  # the cap matters here
                assert np.abs(got - base).max() > 1e-2
            if window == 7 and softcap == 0.0:  # the window matters here
                assert np.abs(got - base).max() > 1e-2
            if window not in (7, 64):
                continue
            # batched attention with the same window: the same rows
            bat = cpu.attention_batch(
                [q[a:b] for a, b in itertools.pairwise(bounds)],
                [kk[: p0 + n] for kk, (n, p0) in zip(ks, shapes, strict=True)],
                [vv[: p0 + n] for vv, (n, p0) in zip(vs, shapes, strict=True)],
                starts,
                scale,
                window=window,
                softcap=softcap,
            )
            np.testing.assert_array_equal(got, np.concatenate(bat), err_msg=msg)
            for s, ((n, p0), a) in enumerate(zip(shapes, bounds, strict=False)):
                for i in range(0, n, 5):  # every fifth row of each sequence
                    p = p0 + i
                    lo = max(0, p - window + 1)
                    one = cpu.attention(
                        q[a + i : a + i + 1],
                        ks[s][lo : p + 1],
                        vs[s][lo : p + 1],
                        p - lo,
                        scale,
                        softcap=softcap,
                    )
                    np.testing.assert_array_equal(got[a + i], one[0], err_msg=f"{msg}, seq {s}")


def test_attention_window_softcap_reject_negative(cpu: CpuBackend) -> None:
    q = np.zeros((1, 2, 8), np.float32)
    kv = np.zeros((1, 2, 8), np.float32)
    with pytest.raises(ValueError, match="window"):
        cpu.attention(q, kv, kv, 0, 1.0, window=-1)
    with pytest.raises(ValueError, match="softcap"):
        cpu.attention_batch([q], [kv], [kv], [0], 1.0, softcap=-2.0)
    with pytest.raises(ValueError, match="softcap"):
        cpu.attention_append(q, kv, kv, [kv.copy()], [kv.copy()], [0], [1], 1.0, q.copy(), softcap=float("nan"))  # fmt: skip


def test_concurrent_calls_from_python_threads() -> None:
    """The GIL is released: calls from several threads share the pool safely."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(17)
    w = make_weight(DType.Q4_1, 2000, 576, rng)
    xs = [rng.standard_normal((n, 576)).astype(np.float32) for n in (1, 3, 8, 17) * 4]
    cpu = CpuBackend(threads=2)
    serial = [cpu.matmul(w, x) for x in xs]
    with ThreadPoolExecutor(4) as ex:
        parallel = list(ex.map(lambda x: cpu.matmul(w, x), xs))
    for a, b in zip(serial, parallel, strict=True):
        np.testing.assert_array_equal(a, b)


def _run_simd_check(tmp_path: Any, cc: str, runner: list[str]) -> None:
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which(cc) is None or (runner and shutil.which(runner[0]) is None):
        pytest.skip(f"{cc} {' '.join(runner)} not installed")
    root = Path(__file__).resolve().parents[1]
    exe = tmp_path / "check_simd"
    # -O0: the program's SIMD paths are held to its scalar ones, which no optimisation level
    # changes (-ffp-contract=off); it compiles in 6 CPU-s against -O2's 15 and runs in 0.1 s.
    # The kernels' optimised build is the extension's, held to the numpy twins above.
    subprocess.run(
        [
            cc,
            "-O0",
            "-std=gnu11",
            "-ffp-contract=off",
            f"-I{root / 'cyx'}",
            str(root / "cyx" / "check_simd_impl.c"),
            "-o",
            str(exe),
            "-lm",
            "-lpthread",
        ],
        check=True,
    )
    r = subprocess.run([*runner, str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(" ok") >= 32 and "BAD" not in r.stdout, r.stdout


def test_c_simd_check_native(tmp_path: Any) -> None:
    _run_simd_check(tmp_path, "cc", [])


def test_c_simd_check_neon_under_qemu(tmp_path: Any) -> None:
    _run_simd_check(
        tmp_path, "aarch64-linux-gnu-gcc", ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]
    )


def test_kernels_work_in_a_forked_child() -> None:
    """The thread pool starts afresh in a child process (its workers do not survive fork)."""
    import multiprocessing

    rng = np.random.default_rng(19)
    w = make_weight(DType.Q8_0, 3000, 256, rng)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    cpu = CpuBackend(threads=2)
    want = cpu.matmul(w, x)  # the parent's pool exists now
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply(cpu.matmul, (w, x))
    np.testing.assert_array_equal(got, want)
