"""The CUDA backend's unpacking of every block type it keeps on the GPU
(:mod:`modelc.runtime.backends.cuda_quants`: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K
to Q6_K, IQ4_NL, IQ4_XS), compiled here as C++ for the CPU and held bit for bit to
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

import numpy as np
import pytest

from modelc.formats.ir import DType
from modelc.formats.quants import dequantize
from modelc.runtime.backends import cuda, cuda_quants, cuda_src
from tests.gen_cuda_models import random_blocks

CODES = cuda.CODES  # every type the GPU keeps in its blocks (GGML numbers)
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
static inline u32 ld32(const u8* p) { u32 v; memcpy(&v, p, 4); return v; }
static inline u32 __byte_perm(u32 x, u32 y, u32 s) {  // CUDA's prmt, selectors 0..7 only
  unsigned long long v = ((unsigned long long)y << 32) | x; u32 r = 0;
  for (int k = 0; k < 4; k++) r |= (u32)((v >> (8 * ((s >> (4 * k)) & 7))) & 0xff) << (8 * k);
  return r;
}
template <int T> void deq32(const u8* __restrict__ row, int g, float* w);
template <int T> void deq4(const u8* __restrict__ row, int g, int sub, float* w);
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("cuda-quants")
    entry = "\n".join(
        f'extern "C" void d32_{t}(const u8* r, int ng, float* o) '
        f"{{ for (int g = 0; g < ng; g++) deq32<{t}>(r, g, o + 32 * g); }}\n"
        f'extern "C" void d4_{t}(const u8* r, int ng, float* o) {{ for (int g = 0; g < ng; g++) '
        f"for (int s = 0; s < 8; s++) deq4<{t}>(r, g, s, o + 32 * g + 4 * s); }}"
        for t in CODES.values()
    )
    src, so = d / "deq.cpp", d / "deq.so"
    src.write_text(PRELUDE + cuda_quants.DEQ32 + cuda_quants.DEQ4 + entry)
    flags = ["-O1", "-std=c++17", "-ffp-contract=off", "-shared", "-fPIC"]
    run = subprocess.run([cxx, *flags, "-o", str(so), str(src)], capture_output=True, text=True)
    if run.returncode and "_Float16" in run.stderr:
        pytest.skip(f"{Path(cxx).name} has no _Float16")
    assert run.returncode == 0, run.stderr[-2000:]
    return ctypes.CDLL(str(so))


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
