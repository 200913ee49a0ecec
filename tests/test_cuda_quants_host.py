"""The CUDA backend's unpacking of every block type it keeps on the GPU
(:mod:`modelc.runtime.backends.cuda_quants`: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K
to Q6_K, IQ4_NL, IQ4_XS, MXFP4, BF16), compiled here as C++ for the CPU and held bit for bit to
:mod:`modelc.formats.quants`, so their bit layouts are checked in CI, which has no GPU
(the H200 runs ``tests/test_cuda.py`` over the same types through the real kernels).

The CUDA intrinsics become plain float operations each rounded once (``__fmul_rn`` is a
multiply with ``-ffp-contract=off``), ``h2f`` a ``_Float16`` conversion, ``__byte_perm``
the byte select it is.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelc.formats.ir import DType
from modelc.formats.quants import dequantize
from modelc.runtime.backends import cuda_deq, cuda_gemvq, cuda_quants, cuda_src, cuda_weights
from tests.gen_cuda_models import random_blocks

CODES = cuda_weights.CODES  # every type the GPU keeps in its blocks (GGML numbers)
PRELUDE = r"""
#include <cstring>
typedef unsigned char u8; typedef unsigned short u16; typedef unsigned int u32;
struct float4 { float x, y, z, w; };
#define __device__
#define __forceinline__ inline
#define __constant__
#define __restrict__ __restrict
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
static inline float h2f(u16 h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
static inline u16 ld16(const u8* p) { u16 v; memcpy(&v, p, 2); return v; }
static inline float __uint_as_float(u32 u) { float f; memcpy(&f, &u, 4); return f; }
static inline u32 ld32(const u8* p) { u32 v; memcpy(&v, p, 4); return v; }
static inline u32 __funnelshift_r(u32 lo, u32 hi, u32 sh) {  // CUDA's shf.r.clamp
  sh = sh < 32 ? sh : 32;
  return (u32)((((unsigned long long)hi << 32) | lo) >> sh);
}
static inline u32 __byte_perm(u32 x, u32 y, u32 s) {  // CUDA's prmt, selectors 0..7 only
  unsigned long long v = ((unsigned long long)y << 32) | x; u32 r = 0;
  for (int k = 0; k < 4; k++) r |= (u32)((v >> (8 * ((s >> (4 * k)) & 7))) & 0xff) << (8 * k);
  return r;
}
template <int T> void deq32(const u8* __restrict__ row, int g, float* w);
template <int T> void deq4(const u8* __restrict__ row, int g, int sub, float* w);
typedef long long i64;
struct uint4 { u32 x, y, z, w; };
struct dim3_ { unsigned x, y, z; };
static dim3_ blockIdx, threadIdx, blockDim;  // set by the loops that stand in for a launch
struct int2 { int x, y; };
struct float2 { float x, y; };
static inline int __dp4a(int a, int b, int c) {  // signed bytes
  for (int k = 0; k < 4; k++) c += (int)(signed char)(a >> (8 * k)) * (int)(signed char)(b >> (8 * k));
  return c;
}
static inline u16 f2h(float f) { _Float16 h = (_Float16)f; u16 v; memcpy(&v, &h, 2); return v; }
static inline u32 pack_h2(float lo, float hi) { return (u32)f2h(lo) | ((u32)f2h(hi) << 16); }
"""


def host_lib(source: str, folder: Path, name: str) -> ctypes.CDLL:
    """``source`` (PRELUDE and kernel sources as C++, with ``extern "C"`` entries) built
    into a shared library in ``folder`` with the float steps CUDA takes
    (``-ffp-contract=off``); skips where no C++ compiler with ``_Float16`` is found."""
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    src, so = folder / f"{name}.cpp", folder / f"{name}.so"
    src.write_text(source)
    flags = ["-O1", "-std=c++17", "-ffp-contract=off", "-shared", "-fPIC"]
    run = subprocess.run([cxx, *flags, "-o", str(so), str(src)], capture_output=True, text=True)
    if run.returncode and "_Float16" in run.stderr:
        pytest.skip(f"{Path(cxx).name} has no _Float16")
    assert run.returncode == 0, run.stderr[-3000:]
    return ctypes.CDLL(str(so))


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    entry = "\n".join(
        f'extern "C" void d32_{t}(const u8* r, int ng, float* o) '
        f"{{ for (int g = 0; g < ng; g++) deq32<{t}>(r, g, o + 32 * g); }}\n"
        f'extern "C" void d4_{t}(const u8* r, int ng, float* o) {{ for (int g = 0; g < ng; g++) '
        f"for (int s = 0; s < 8; s++) deq4<{t}>(r, g, s, o + 32 * g + 4 * s); }}"
        for t in CODES.values()
    )
    entry += "".join(  # every thread of deq8's launch, one after another
        f'extern "C" void d8_{t}_{f}(const u8* W, long long rb, int cols, const i64* ids, '
        "int blocks, int bpr, void* out, int ldo, int vec) { blockDim.x = 256; "
        "for (int b = 0; b < blocks; b++) for (int t = 0; t < 256; t++) { blockIdx.x = b; "
        f"threadIdx.x = t; deq8<{t}, {f}>(W, rb, cols, ids, bpr, out, ldo, vec); }} }}\n"
        for t in CODES.values()
        for f in (0, 1)
    )
    entry += "".join(  # wq8's integers and scales back to float weights
        f'extern "C" void q8_{t}(const u8* r, int ng, float* o) {{ for (int g = 0; g < ng; g++) '
        "{ int q[2]; float dl, ml, ml0 = 0.f; for (int j = 0; j < 4; j++) { "
        f"wq8<{t}>(r, g, j, q, &dl, &ml); if (j == 0) ml0 = ml; else if (ml != 0.f) ml0 = -1e30f; "
        "for (int k = 0; k < 8; k++) o[32 * g + 8 * j + k] = __fsub_rn(__fmul_rn(dl, "
        "(float)(signed char)(q[k / 4] >> (8 * (k % 4)))), ml0); } } }\n"
        for t in cuda_gemvq.Q8_TYPES
    )
    entry += "".join(  # one weight row's sum with quantized x, in gemvq's pieces, one lane
        f'extern "C" float dot_{t}(const u8* r, int ng, const int2* xq, const float2* xs) '
        "{ float a = 0.f; for (int g = 0; g < ng; g++) for (int j = 0; j < 4; j++) { "
        f"int q[2]; float dl, ml; wq8<{t}>(r, g, j, q, &dl, &ml); "
        "a += piece_dot(q, dl, ml, xq[4 * g + j], xs[g]); } return a; }\n"
        for t in cuda_gemvq.Q8_TYPES
    )
    body = cuda_quants.DEQ32 + cuda_quants.DEQ4 + cuda_deq.SOURCE + cuda_gemvq.SOURCE
    return host_lib(PRELUDE + body + entry, tmp_path_factory.mktemp("cuda-quants"), "deq")


def test_every_type_is_checked() -> None:
    assert sorted(CODES.values()) == sorted(cuda_src.TYPES)


@pytest.mark.parametrize("dtype", list(CODES), ids=lambda d: d.name)
@pytest.mark.parametrize("kind", ["d32", "d4"])
def test_unpacking_matches_the_reference(lib: ctypes.CDLL, dtype: DType, kind: str) -> None:
    """Every weight of 9 random rows of 1024 (36 super-blocks, 288 groups), bit for bit."""
    rng = np.random.default_rng(CODES[dtype])
    rows, cols = 9, 1024
    data, _ = random_blocks(rng, dtype, rows, cols, 0.05)
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1)
    if dtype in (DType.F32, DType.F16):  # stored as they are
        want = np.asarray(data, np.float32)
    else:
        want = dequantize(raw, dtype, (rows, cols)).reshape(rows, cols)
    got = np.zeros((rows, cols), np.float32)
    fn = getattr(lib, f"{kind}_{CODES[dtype]}")
    for r in range(rows):
        fn(
            raw[r].ctypes.data_as(ctypes.c_void_p),
            cols // 32,
            got[r].ctypes.data_as(ctypes.c_void_p),
        )
    assert np.isfinite(want).all() and np.abs(want).max() > 0
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def _blocks(
    dtype: DType, rows: int, cols: int
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(raw bytes (rows, row_bytes), the reference's f32 weights (rows, cols))."""
    data, _ = random_blocks(np.random.default_rng(CODES[dtype] + 100), dtype, rows, cols, 0.05)
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1)
    if dtype in (DType.F32, DType.F16):
        return raw, np.asarray(data, np.float32)
    return raw, dequantize(raw, dtype, (rows, cols)).reshape(rows, cols)


@pytest.mark.parametrize("dtype", list(CODES), ids=lambda d: d.name)
def test_deq8_launch_writes_every_row_as_the_reference(lib: ctypes.CDLL, dtype: DType) -> None:
    """deq8's whole launch (every block and thread of :func:`cuda_deq.launch_shape`) over
    picked rows: f32 bit for bit the reference (as ``deq_rows``), f16 its round to nearest,
    with 16-byte stores and without, into rows wider than the weight (ldo > cols)."""
    rows, cols, ldo = 5, 1280, 1288  # 5 super-blocks a row: a block's last threads idle
    raw, want = _blocks(dtype, rows, cols)
    ids = np.array([4, 0, 2, 4, 1, 3], np.int64)
    blocks, bpr = cuda_deq.launch_shape(len(ids), cols)
    assert bpr * 256 * 8 >= cols > (bpr - 1) * 256 * 8
    for f16, dt in ((0, np.float32), (1, np.float16)):
        for vec in (0, 1):
            out = np.full((len(ids), ldo), 7, dt)
            getattr(lib, f"d8_{CODES[dtype]}_{f16}")(
                raw.ctypes.data_as(ctypes.c_void_p), ctypes.c_longlong(raw.shape[1]), cols,
                ids.ctypes.data_as(ctypes.c_void_p), blocks, bpr,
                out.ctypes.data_as(ctypes.c_void_p), ldo, vec,
            )  # fmt: skip
            ref = want[ids].astype(dt)
            np.testing.assert_array_equal(
                out[:, :cols].view(f"u{out.itemsize}"), ref.view(f"u{out.itemsize}")
            )
            assert (out[:, cols:] == 7).all()  # nothing past the row's width


def test_deq8_vector_stores_only_where_aligned() -> None:
    assert cuda_deq.can_vec(256, 2048, 2) and cuda_deq.can_vec(512, 1288, 4)
    assert not cuda_deq.can_vec(256 + 4, 2048, 4)  # a view 1 float in
    assert not cuda_deq.can_vec(256, 2052, 2)  # rows of 2052 halves: every other row off


@pytest.mark.parametrize("code", cuda_gemvq.Q8_TYPES)
def test_int8_gemv_weights_are_the_reference(lib: ctypes.CDLL, code: int) -> None:
    """wq8's 8-bit weights and scales of every piece give the reference's weights bit for bit
    (dl * q - ml, the min only from the group's first piece)."""
    dtype = next(d for d, c in CODES.items() if c == code)
    rows, cols = 3, 1024
    raw, want = _blocks(dtype, rows, cols)
    got = np.zeros((rows, cols), np.float32)
    for r in range(rows):
        getattr(lib, f"q8_{code}")(
            raw[r].ctypes.data_as(ctypes.c_void_p),
            cols // 32,
            got[r].ctypes.data_as(ctypes.c_void_p),
        )
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("code", cuda_gemvq.Q8_TYPES)
def test_int8_gemv_sums_are_the_quantized_product(lib: ctypes.CDLL, code: int) -> None:
    """gemvq's arithmetic (wq8, dp4a, the scales) over whole rows with x quantized as
    ``quant_q8`` does: the reference's weights times x's 8-bit values, within float
    rounding (Q4_K's and Q5_K's min taken with the float sum of x, as the kernel does)."""
    from tests.test_cuda_kernels import k_mins, q8_reference

    dtype = next(d for d, c in CODES.items() if c == code)
    rows, cols = 4, 2048
    raw, want = _blocks(dtype, rows, cols)
    x = np.random.default_rng(5).standard_normal(cols).astype(np.float32)
    g = x.reshape(-1, 32)
    d = np.abs(g).max(axis=1) / np.float32(127)
    xq = np.ascontiguousarray(np.rint(g / d[:, None]).astype(np.int8))
    xs = np.ascontiguousarray(np.stack([d, g.sum(axis=1, dtype=np.float32)], axis=1), np.float32)
    fn = getattr(lib, f"dot_{code}")
    fn.restype = ctypes.c_float
    got = [
        fn(raw[r].ctypes.data_as(ctypes.c_void_p), cols // 32,
           xq.ctypes.data_as(ctypes.c_void_p), xs.ctypes.data_as(ctypes.c_void_p))
        for r in range(rows)
    ]  # fmt: skip
    mins = k_mins(raw, rows, dtype)
    ref = q8_reference(want.astype(np.float64), x[None], mins)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert np.abs(ref - want.astype(np.float64) @ x).max() > 1e-6  # x was quantized


def test_quantized_activations_fit_their_scratch() -> None:
    """q8_bytes sizes what quant_q8 / rms_norm_q8 write: n * cols int8 values, then a
    float2 (8 bytes) for every group of 32 of every row."""
    assert cuda_gemvq.q8_bytes(3, 2048) == (3 * 2048, 3 * 64 * 8)
    assert cuda_gemvq.q8_bytes(1, 32) == (32, 8)
