"""GGML quantization formats in plain numpy: the reference ("numpy twin") for the kernels.

Every block type stores, per block of 32 (``Q*_0/1``) or 256 (``Q*_K``) weights, one or
two f16 scales and packed low-bit integers.  ``dequantize`` unpacks them with the same
float32 operations, in the same order, as GGML's reference C and ``gguf.quants``, so
results agree bit for bit.  ``quantize`` implements GGML's reference rounding for
Q8_0, Q4_0, Q4_1 and modelc's per-row INT8 (f32 scale, then int8 values).

Block layouts (bytes, in order):

* Q4_0  d:f16, qs[16]             q = nibble - 8;         x = d*q
* Q4_1  d:f16, m:f16, qs[16]      q = nibble;             x = d*q + m
* Q5_0  d:f16, qh[4], qs[16]      q = nibble | hbit<<4 - 16
* Q5_1  d:f16, m:f16, qh[4], qs[16]
* Q8_0  d:f16, qs[32] int8
* Q2_K  scales[16] (4-bit scale | 4-bit min), qs[64] 2-bit, d:f16, dmin:f16
* Q3_K  hmask[32], qs[64] 2-bit, scales[12] (16 x 6-bit), d:f16
* Q4_K  d:f16, dmin:f16, scales[12] (8 x 6-bit scale + 8 x 6-bit min), qs[128]
* Q5_K  as Q4_K, then qh[32] before qs[128]
* Q6_K  ql[128], qh[64], scales[16] int8, d:f16
* IQ4_NL  d:f16, qs[16]           x = d*KVALUES[nibble]
* IQ4_XS  d:f16, scales_h:u16, scales_l[4], qs[128]: 8 groups of 32, 6-bit scale - 32
* MXFP4   e:E8M0, qs[16]           x = MXFP4_KVALUES[nibble] * 2^(e - 128) (E2M1 doubled)

In the first half of a 32-weight block the low nibbles hold weights 0..15 and the high
nibbles weights 16..31; K-quants pack 32-weight groups the same way, 2 or 4 groups per
byte run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from modelc.errors import UnsupportedError
from modelc.formats.ir import BLOCK_SIZES, NUMPY_DTYPES, DType, row_bytes

__all__ = ["dequantize", "quantize"]

F32 = np.float32
U8 = np.uint8
QK_K = 256

Array = np.ndarray[Any, Any]


def _f16(b: Array) -> Array:
    """(n, 2) uint8 -> (n, 1) float32."""
    return np.ascontiguousarray(b).view(np.float16).astype(F32)


def _nibbles(qs: Array, group: int) -> Array:
    """Split bytes into nibbles: per run of ``group`` bytes, all low nibbles then all high."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, group) >> np.array([0, 4], dtype=U8).reshape(1, 1, 2, 1)
    return (q & U8(0x0F)).reshape(n, -1)


def _bits(b: Array, per_byte: int, group: int) -> Array:
    """Unpack ``8 // per_byte``-bit fields: field k of each byte forms output run k."""
    n, width = b.shape[0], 8 // per_byte
    shifts = np.arange(0, 8, width, dtype=U8).reshape(1, 1, per_byte, 1)
    q = b.reshape(n, -1, 1, group) >> shifts
    return (q & U8((1 << width) - 1)).reshape(n, -1)


def _high_bits32(qh: Array) -> Array:
    """(n, 4) bytes = one little-endian u32 -> (n, 32) bits, bit j for weight j."""
    h = np.ascontiguousarray(qh).view(np.uint32).reshape(-1, 1)
    return ((h >> np.arange(32, dtype=np.uint32).reshape(1, 32)) & np.uint32(1)).astype(U8)


def _q4_0(b: Array) -> Array:
    d = _f16(b[:, :2])
    q = _nibbles(b[:, 2:], 16).astype(np.int8) - np.int8(8)
    return d * q.astype(F32)


def _q4_1(b: Array) -> Array:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    return d * _nibbles(b[:, 4:], 16).astype(F32) + m


def _q5_0(b: Array) -> Array:
    d = _f16(b[:, :2])
    q = (_nibbles(b[:, 6:], 16) | (_high_bits32(b[:, 2:6]) << U8(4))).astype(np.int8) - np.int8(16)
    out: Array = d * q.astype(F32)
    return out


def _q5_1(b: Array) -> Array:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    q = _nibbles(b[:, 8:], 16) | (_high_bits32(b[:, 4:8]) << U8(4))
    out: Array = d * q.astype(F32) + m
    return out


def _q8_0(b: Array) -> Array:
    d = _f16(b[:, :2])
    return np.ascontiguousarray(b[:, 2:]).view(np.int8).astype(F32) * d


def _q2_k(b: Array) -> Array:
    n = b.shape[0]
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (scales & U8(0x0F)).astype(F32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> U8(4)).astype(F32)).reshape(n, 16, 1)
    q = _bits(qs, 4, 32).reshape(n, 16, 16).astype(F32)  # 2-bit fields
    out: Array = (dl * q - ml).reshape(n, QK_K)
    return out


def _q3_k(b: Array) -> Array:
    n = b.shape[0]
    hmask, qs, packed, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    # 16 six-bit scales: low 4 bits from bytes 0..7 (low then high nibbles), top 2 bits from 8..11
    low = _nibbles(packed[:, :8], 8)
    high = _bits(packed[:, 8:], 4, 4)
    sc = ((low | (high << U8(4))).astype(np.int8) - np.int8(32)).astype(F32)
    dl = (d * sc).reshape(n, 16, 1)
    ql = _bits(qs, 4, 32).reshape(n, 16, 16)
    hm = _bits(hmask, 8, 32).reshape(n, 16, 16) ^ U8(1)  # a set bit means "no -4 offset"
    q = (ql.astype(np.int8) - (hm << U8(2)).astype(np.int8)).astype(F32)
    out: Array = (dl * q).reshape(n, QK_K)
    return out


def _k_scale_min(s: Array) -> tuple[Array, Array]:
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins."""
    n = s.shape[0]
    s = s.reshape(n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & U8(0x3F), (md & U8(0x0F)) | ((d >> U8(2)) & U8(0x30))], axis=-1)
    mn = np.concatenate([m & U8(0x3F), (md >> U8(4)) | ((m >> U8(2)) & U8(0x30))], axis=-1)
    return sc, mn


def _q4_k(b: Array) -> Array:
    n = b.shape[0]
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _k_scale_min(b[:, 4:16])
    dl = (d * sc.astype(F32)).reshape(n, 8, 1)
    ml = (dmin * mn.astype(F32)).reshape(n, 8, 1)
    q = _nibbles(b[:, 16:], 32).reshape(n, 8, 32).astype(F32)
    out: Array = (dl * q - ml).reshape(n, QK_K)
    return out


def _q5_k(b: Array) -> Array:
    n = b.shape[0]
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _k_scale_min(b[:, 4:16])
    dl = (d * sc.astype(F32)).reshape(n, 8, 1)
    ml = (dmin * mn.astype(F32)).reshape(n, 8, 1)
    ql = _nibbles(b[:, 48:], 32)
    qh = _bits(b[:, 16:48], 8, 32)
    q = (ql | (qh << U8(4))).reshape(n, 8, 32).astype(F32)
    out: Array = (dl * q - ml).reshape(n, QK_K)
    return out


def _q6_k(b: Array) -> Array:
    n = b.shape[0]
    ql, qh = b[:, :128], b[:, 128:192]
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(F32)
    d = _f16(b[:, 208:210])
    dl = (d * sc).reshape(n, 16, 1)
    low = _nibbles(ql, 64)
    high = _bits(qh, 4, 32)
    q = (low | (high << U8(4))).astype(np.int8) - np.int8(32)
    out: Array = (dl * q.reshape(n, 16, 16).astype(F32)).reshape(n, QK_K)
    return out


# IQ4_NL / IQ4_XS: the 16 non-linear levels a nibble indexes
IQ4_KVALUES = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8
)


def _iq4_nl(b: Array) -> Array:
    d = _f16(b[:, :2])
    out: Array = d * IQ4_KVALUES[_nibbles(b[:, 2:], 16)].astype(F32)
    return out


def _iq4_xs(b: Array) -> Array:
    n = b.shape[0]
    d = _f16(b[:, :2])
    sh = np.ascontiguousarray(b[:, 2:4]).view(np.uint16)  # (n, 1): 2 high bits per group
    high = ((sh >> (2 * np.arange(8, dtype=np.uint16))) & np.uint16(3)).astype(U8)  # (n, 8)
    low = _nibbles(b[:, 4:8], 1)  # (n, 8): group 2i in byte i's low nibble, 2i+1 high
    ls = ((low | (high << U8(4))).astype(np.int8) - np.int8(32)).astype(F32)
    dl = (d * ls).reshape(n, 8, 1)
    q = IQ4_KVALUES[_nibbles(b[:, 8:], 16)].astype(F32).reshape(n, 8, 32)
    out: Array = (dl * q).reshape(n, QK_K)
    return out


# MXFP4: the E2M1 values doubled (ggml's kvalues_mxfp4); the scale is halved to match
MXFP4_KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)


def e8m0_half(e: Array) -> Array:
    """ggml's ``GGML_E8M0_TO_FP32_HALF``: 2^(e - 128) as f32 bits (subnormal for e < 2)."""
    e32 = e.astype(np.uint32)
    bits = np.where(e32 < 2, np.uint32(0x00200000) << e32, (e32 - np.uint32(1)) << np.uint32(23))
    out: Array = bits.astype(np.uint32).view(F32)
    return out


def _mxfp4(b: Array) -> Array:
    d = e8m0_half(np.ascontiguousarray(b[:, :1]))
    out: Array = MXFP4_KVALUES[_nibbles(b[:, 1:], 16)].astype(F32) * d
    return out


_DEQUANT: dict[DType, Callable[[Array], Array]] = {
    DType.Q4_0: _q4_0,
    DType.Q4_1: _q4_1,
    DType.Q5_0: _q5_0,
    DType.Q5_1: _q5_1,
    DType.Q8_0: _q8_0,
    DType.Q2_K: _q2_k,
    DType.Q3_K: _q3_k,
    DType.Q4_K: _q4_k,
    DType.Q5_K: _q5_k,
    DType.Q6_K: _q6_k,
    DType.IQ4_NL: _iq4_nl,
    DType.IQ4_XS: _iq4_xs,
    DType.MXFP4: _mxfp4,
}


def dequantize(data: Array, dtype: DType, shape: tuple[int, ...]) -> Array:
    """float32 array of ``shape`` from ``data`` (uint8 ``(rows, row_bytes)`` or a plain array)."""
    if dtype in _DEQUANT:
        _, ts = BLOCK_SIZES[dtype]
        blocks = np.ascontiguousarray(data, dtype=U8).reshape(-1, ts)
        return _DEQUANT[dtype](blocks).reshape(shape)
    if dtype is DType.INT8:
        rows = np.ascontiguousarray(data, dtype=U8).reshape(-1, row_bytes(dtype, shape[-1]))
        scale = np.ascontiguousarray(rows[:, :4]).view(F32)  # (rows, 1)
        q = np.ascontiguousarray(rows[:, 4:]).view(np.int8).astype(F32)
        return (q * scale).reshape(shape)
    if dtype not in NUMPY_DTYPES:
        raise UnsupportedError(f"cannot dequantize {dtype}")
    arr = np.asarray(data)
    if arr.dtype == U8 and dtype is not DType.U8:
        arr = np.ascontiguousarray(arr).view(NUMPY_DTYPES[dtype])
    if dtype is DType.BF16:
        bits = np.ascontiguousarray(arr).view(np.uint16).astype(np.uint32) << np.uint32(16)
        return bits.view(F32).reshape(shape)
    return arr.astype(F32).reshape(shape)


# ---------------------------------------------------------------- quantization


def _roundf(x: Array) -> Array:
    """C roundf: halves away from zero."""
    a = np.abs(x)
    f = np.floor(a)
    out: Array = np.sign(x) * (f + np.floor(2 * (a - f)))
    return out


def _inverse(d: Array) -> Array:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, F32(0), F32(1) / d).astype(F32)


def _f16_bytes(d: Array) -> Array:
    return d.astype(np.float16).view(U8).reshape(-1, 2)


def _pack_nibbles(q: Array) -> Array:
    """(n, 32) values 0..15 -> (n, 16) bytes: weight j low nibble, weight j+16 high."""
    out: Array = q[:, :16] | (q[:, 16:] << U8(4))
    return out


def _quant_q8_0(x: Array) -> Array:
    d = np.abs(x).max(axis=1, keepdims=True) / F32(127)
    q = _roundf(x * _inverse(d)).astype(np.int8).view(U8)
    return np.concatenate([_f16_bytes(d), q], axis=1)


def _quant_q4_0(x: Array) -> Array:
    imax = np.abs(x).argmax(axis=1, keepdims=True)
    d = np.take_along_axis(x, imax, axis=1) / F32(-8)
    q = np.trunc(x * _inverse(d) + F32(8.5)).astype(U8).clip(0, 15)
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q)], axis=1)


def _quant_q4_1(x: Array) -> Array:
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    d = (hi - lo) / F32(15)
    q = np.trunc((x - lo) * _inverse(d) + F32(0.5)).astype(U8).clip(0, 15)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q)], axis=1)


_QUANT: dict[DType, Callable[[Array], Array]] = {
    DType.Q8_0: _quant_q8_0,
    DType.Q4_0: _quant_q4_0,
    DType.Q4_1: _quant_q4_1,
}


def quantize(x: Array, dtype: DType) -> Array:
    """uint8 ``(rows, row_bytes)`` from float32 ``(rows, cols)`` in Q8_0, Q4_0, Q4_1 or INT8."""
    x = np.ascontiguousarray(x, dtype=F32)
    if x.ndim != 2:
        x = x.reshape(-1, x.shape[-1] if x.ndim else 1)
    rows, cols = x.shape
    try:
        rb = row_bytes(dtype, cols)
    except ValueError as e:
        raise UnsupportedError(f"cannot quantize a ({rows}, {cols}) tensor: {e}") from e
    if dtype is DType.INT8:
        d = np.abs(x).max(axis=1, keepdims=True) / F32(127)
        q = _roundf(x * _inverse(d)).clip(-127, 127).astype(np.int8).view(U8)
        return np.concatenate([d.astype(F32).view(U8).reshape(rows, 4), q], axis=1)
    if dtype not in _QUANT:
        raise UnsupportedError(
            f"modelc cannot quantize to {dtype} (supported: q8_0, q4_0, q4_1, int8)"
        )
    bs, _ = BLOCK_SIZES[dtype]
    blocks = _QUANT[dtype](x.reshape(-1, bs))
    return np.ascontiguousarray(blocks).reshape(rows, rb)
