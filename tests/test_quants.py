"""The numpy GGML formats against gguf-py's reference, bit for bit."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as G

from modelc.errors import UnsupportedError
from modelc.formats.gguf import load_gguf
from modelc.formats.ir import BLOCK_SIZES, DType, row_bytes
from modelc.formats.quants import dequantize, quantize
from tests import assets

# byte offsets of each block type's f16 scales (d, m / dmin)
SCALE_OFFSETS = {
    DType.Q4_0: [0],
    DType.Q4_1: [0, 2],
    DType.Q5_0: [0],
    DType.Q5_1: [0, 2],
    DType.Q8_0: [0],
    DType.Q2_K: [80, 82],
    DType.Q3_K: [108],
    DType.Q4_K: [0, 2],
    DType.Q5_K: [0, 2],
    DType.Q6_K: [208],
    DType.IQ4_NL: [0],
    DType.IQ4_XS: [0],
    DType.MXFP4: [],  # its scale is one E8M0 byte: see _random_blocks
}
GGUF_CAN_QUANTIZE = [DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.Q8_0]
MODELC_QUANTIZE = [DType.Q8_0, DType.Q4_0, DType.Q4_1]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def _random_blocks(
    dtype: DType, rows: int, blocks_per_row: int, seed: int, sane: bool
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    _, ts = BLOCK_SIZES[dtype]
    raw = rng.integers(0, 256, size=(rows * blocks_per_row, ts), dtype=np.uint8)
    if sane:
        for off in SCALE_OFFSETS[dtype]:
            scale = rng.uniform(-3, 3, size=raw.shape[0]).astype(np.float16)
            raw[:, off : off + 2] = scale.view(np.uint8).reshape(-1, 2)
        if dtype is DType.MXFP4:  # 2^(e - 128) for e in 100..140
            raw[:, 0] = rng.integers(100, 141, size=raw.shape[0], dtype=np.uint8)
    return raw.reshape(rows, blocks_per_row * ts)


@pytest.mark.parametrize("dtype", list(BLOCK_SIZES))
@pytest.mark.parametrize("sane", [True, False])
def test_dequantize_random_bytes_matches_gguf(dtype: DType, sane: bool) -> None:
    bs, _ = BLOCK_SIZES[dtype]
    raw = _random_blocks(
        dtype, rows=7, blocks_per_row=3, seed=list(BLOCK_SIZES).index(dtype) * 2 + sane, sane=sane
    )
    with np.errstate(all="ignore"):  # garbage scales give inf * 0 = nan, in both
        ref = gguf.quants.dequantize(raw, G[dtype.name])
        got = dequantize(raw, dtype, (7, 3 * bs))
    assert got.dtype == np.float32
    assert _same(got, ref.astype(np.float32))
    if sane:
        assert np.isfinite(got).all() and np.abs(got).max() > 0


@pytest.mark.parametrize("dtype", GGUF_CAN_QUANTIZE)
def test_dequantize_gguf_quantized_blocks(dtype: DType) -> None:
    x = np.random.default_rng(3).standard_normal((5, 256)).astype(np.float32)
    x[0] = 0.0  # an all-zero row: zero scale
    raw = gguf.quants.quantize(x, G[dtype.name])
    assert _same(dequantize(raw, dtype, x.shape), gguf.quants.dequantize(raw, G[dtype.name]))


@pytest.mark.parametrize("dtype", MODELC_QUANTIZE)
def test_quantize_matches_gguf_bytes(dtype: DType) -> None:
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((9, 128)) * rng.uniform(0.01, 100, size=(9, 1))).astype(np.float32)
    x[1] = 0.0
    x[2, :32] = 7.0  # a constant block
    x[3, 5] = -40.0  # the largest magnitude is negative
    got = quantize(x, dtype)
    assert got.dtype == np.uint8 and got.shape == (9, row_bytes(dtype, 128))
    assert np.array_equal(got, gguf.quants.quantize(x, G[dtype.name]))


@pytest.mark.parametrize(
    ("dtype", "levels"), [(DType.Q8_0, 127), (DType.Q4_0, 8), (DType.Q4_1, 15)]
)
def test_quantize_round_trip_error(dtype: DType, levels: int) -> None:
    x = np.random.default_rng(5).uniform(-1, 1, size=(4, 64)).astype(np.float32)
    y = dequantize(quantize(x, dtype), dtype, x.shape)
    blocks = x.reshape(-1, 32)
    step = (
        (blocks.max(1) - blocks.min(1)) / levels
        if dtype is DType.Q4_1
        else np.abs(blocks).max(1) / levels
    )
    err = np.abs(y - x).reshape(-1, 32).max(1)
    # half a step (plus f16 scale rounding); Q4_0 maps -amax..amax onto -8..7, so one end
    # of the range can be a whole step off
    bound = 1.01 if dtype is DType.Q4_0 else 0.51
    assert (err <= step * bound + 1e-3).all()


def test_int8_round_trip() -> None:
    x = np.random.default_rng(6).standard_normal((6, 40)).astype(np.float32)
    x[2] = 0.0
    q = quantize(x, DType.INT8)
    assert q.shape == (6, 44) and q.dtype == np.uint8
    scale = q[:, :4].copy().view(np.float32)[:, 0]
    assert np.allclose(scale, np.abs(x).max(1) / 127) and scale[2] == 0.0
    values = q[:, 4:].view(np.int8)
    assert values.max() == 127 or values.min() == -127
    y = dequantize(q, DType.INT8, x.shape)
    assert np.array_equal(y, values.astype(np.float32) * scale[:, None])
    assert (np.abs(y - x) <= scale[:, None] / 2 + 1e-7).all()
    assert not y[2].any()


def test_plain_conversions() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    assert _same(dequantize(x, DType.F32, x.shape), x)
    h = x.astype(np.float16)
    assert _same(dequantize(h, DType.F16, x.shape), h.astype(np.float32))
    assert _same(dequantize(h.view(np.uint8), DType.F16, x.shape), h.astype(np.float32))
    bf = gguf.quants.quantize(x, G.BF16)  # uint8 bytes of bf16
    ref = gguf.quants.dequantize(bf, G.BF16)
    assert _same(dequantize(bf.view(np.uint16), DType.BF16, x.shape), ref)
    assert _same(dequantize(bf, DType.BF16, x.shape), ref)


def test_bad_requests() -> None:
    with pytest.raises(UnsupportedError, match="q6_k"):
        quantize(np.zeros((1, 256), np.float32), DType.Q6_K)
    with pytest.raises(UnsupportedError, match="multiple of 32"):
        quantize(np.zeros((1, 33), np.float32), DType.Q8_0)


@pytest.mark.slow
def test_every_smollm2_tensor_matches_gguf() -> None:
    path: Path = assets.smollm2_gguf()
    ir = load_gguf(path)
    reader = gguf.GGUFReader(path)
    seen: set[DType] = set()
    for rt in reader.tensors:
        t = ir.tensors[rt.name]
        ref = gguf.quants.dequantize(rt.data, rt.tensor_type).reshape(t.shape)
        got = dequantize(t.data(), t.dtype, t.shape)
        assert _same(got, ref.astype(np.float32)), rt.name
        seen.add(t.dtype)
    assert seen == {DType.F32, DType.Q4_1, DType.Q8_0}
