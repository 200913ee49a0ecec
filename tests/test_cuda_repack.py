"""The wide int8 GEMV's layouts (:mod:`modelc.runtime.backends.cuda_repack`, read by
:mod:`.cuda_gemvw`) on the CPU: the repack at upload round-trips to the GGUF blocks, its
dequantizer (``deq8w``, compiled here as C++ as ``tests/test_cuda_quants_host.py`` does)
gives the reference's weights bit for bit, each lane's loads and sums (``Wide<T>::load`` /
``dot``, every lane of every unit one after another) give the product with quantized x as
gemvq's pieces do, and the launch splits rows of x into passes of at most 8. The kernels
themselves run in ``tests/test_cuda_kernels.py`` (GPU).
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from modelc.formats.ir import DType
from modelc.formats.quants import dequantize
from modelc.runtime.backends import cuda_deq, cuda_gemvq, cuda_gemvw, cuda_quants, cuda_repack
from tests.gen_cuda_models import random_blocks
from tests.test_cuda_kernels import k_mins, q8_reference
from tests.test_cuda_quants_host import PRELUDE, host_lib

TYPES = {2: DType.Q4_0, 12: DType.Q4_K, 14: DType.Q6_K}
WIDE_PRELUDE = r"""
struct int4 { int x, y, z, w; };
static inline uint4 make_uint4(u32 x, u32 y, u32 z, u32 w) { uint4 v = {x, y, z, w}; return v; }
static inline uint4 ldw(const u8* p) { uint4 v; memcpy(&v, p, 16); return v; }
template <bool SH> static inline uint4 ldwt(const u8* p) { return ldw(p); }  // global or shared
static inline int4 ldx(const signed char* p) { int4 v; memcpy(&v, p, 16); return v; }
static inline float2 lds(const float2* p) { return *p; }
template <bool SX> static inline int4 ldxt(const signed char* p) { return ldx(p); }
template <bool SX> static inline float2 ldst(const float2* p) { return lds(p); }
template <bool SX> static inline float4 ldst4(const float2* p) { float4 v; memcpy(&v, p, 16); return v; }
static inline int dp4us(u32 a, int b, int c) {  // PTX dp4a.u32.s32
  for (int k = 0; k < 4; k++) c += (int)((a >> (8 * k)) & 255) * (int)(signed char)(b >> (8 * k));
  return c;
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    entry = "".join(  # a row's two sums (NR 2), every lane of every unit in turn
        f'extern "C" void wdot_{t}(const u8* r, int cols, const signed char* xq, '
        "const float2* xs, float* out) { typedef Wide<" + str(t) + "> P; "
        "for (int u = 0; u < cols / P::WEIGHTS; u++) for (int t = 0; t < P::LANES; t++) { "
        "P::Reg reg; P::load(r, cols, u, t, reg); float a[2] = {0.f, 0.f}; "
        "P::dot<2>(reg, cols, u, t, xq, xs, 2, a); out[0] += a[0]; out[1] += a[1]; } }\n"
        for t in cuda_gemvw.WIDE_TYPES
    )
    entry += "".join(  # the same with one row of x (NR 1: the types' own one-row paths)
        f'extern "C" void wdot1_{t}(const u8* r, int cols, const signed char* xq, '
        "const float2* xs, float* out) { typedef Wide<" + str(t) + "> P; "
        "for (int u = 0; u < cols / P::WEIGHTS; u++) for (int t = 0; t < P::LANES; t++) { "
        "P::Reg reg; P::load(r, cols, u, t, reg); float a[1] = {0.f}; "
        "P::dot<1>(reg, cols, u, t, xq, xs, 1, a); out[0] += a[0]; } }\n"
        for t in cuda_gemvw.WIDE_TYPES
    )
    entry += "".join(  # gemvq's pieces of one row (x row 0), for comparison
        f'extern "C" float gq_{t}(const u8* r, int ng, const int2* xq, const float2* xs) '
        "{ float a = 0.f; for (int g = 0; g < ng; g++) for (int j = 0; j < 4; j++) { "
        f"int q[2]; float dl, ml; wq8<{t}>(r, g, j, q, &dl, &ml); "
        "a += piece_dot(q, dl, ml, xq[4 * g + j], xs[g]); } return a; }\n"
        for t in cuda_gemvw.WIDE_TYPES
    )
    entry += "".join(  # every thread of deq8w's launch (deq8 over repacked rows) in turn
        f'extern "C" void d8w_{t}_{f}(const u8* W, long long rb, int cols, const i64* ids, '
        "int blocks, int bpr, void* out, int ldo, int vec) { blockDim.x = 256; "
        "for (int b = 0; b < blocks; b++) for (int t = 0; t < 256; t++) { blockIdx.x = b; "
        f"threadIdx.x = t; deq8<{t}, {f}, 1>(W, rb, cols, ids, bpr, out, ldo, vec); }} }}\n"
        for t in cuda_repack.REPACKED
        for f in (0, 1)
    )
    body = cuda_quants.DEQ32 + cuda_quants.DEQ4 + cuda_deq.SOURCE + cuda_gemvq.SOURCE
    source = PRELUDE + WIDE_PRELUDE + body + cuda_gemvw.SOURCE + entry
    return host_lib(source, tmp_path_factory.mktemp("cuda-wide"), "wide")


def _raw(code: int, rows: int, cols: int, seed: int = 0) -> np.ndarray[Any, Any]:
    data, _ = random_blocks(np.random.default_rng(seed + code), TYPES[code], rows, cols, 0.05)
    return np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1)


def _ptr(a: np.ndarray[Any, Any]) -> ctypes.c_void_p:
    return a.ctypes.data_as(ctypes.c_void_p)


@pytest.mark.parametrize("code", cuda_repack.REPACKED)
@pytest.mark.parametrize("cols", [256, 768, 2048, 14336])
def test_repack_round_trips_and_keeps_rows_aligned(code: int, cols: int) -> None:
    """Repacked rows are 16-byte multiples, the GGUF row's size where its units come in
    eights (768: 3 Q6_K super-blocks, padded; Q4_K always: rearranged in place), and unpack
    to the same bytes."""
    raw = _raw(code, 5, cols)
    wide = cuda_repack.repack(code, raw, cols)
    assert wide.dtype == np.uint8 and wide.shape[0] == 5 and wide.shape[1] % 16 == 0
    unit = 8 * (32 if code == 2 else 256)
    assert (wide.shape[1] == raw.shape[1]) == (cols % unit == 0 or code == 12)
    assert wide.shape[1] - raw.shape[1] < 16
    assert cuda_repack.unpack(code, wide, cols).tobytes() == raw.tobytes()


def test_q4k_fields_are_each_lane_pairs_scales_and_mins() -> None:
    """Repacked Q4_K: the header's 12 bytes hold lane pair c's sub-blocks 2c and 2c + 1
    (scale, scale, min, min: 6 bits each) at bit 24 c, the values llama.cpp's
    get_scale_min_k4 reads from the stored bytes; d, dmin and the nibbles in place."""
    raw = _raw(12, 4, 1024, seed=5)
    wide = cuda_repack.repack(12, raw, 1024)
    b, w = raw.reshape(4, 4, 144), wide.reshape(4, 4, 144)
    assert (b[..., :4] == w[..., :4]).all() and (b[..., 16:] == w[..., 16:]).all()
    for r in range(4):
        for u in range(4):
            s = b[r, u, 4:16].astype(int)
            field = int.from_bytes(w[r, u, 4:16].tobytes(), "little")
            for j in range(8):  # get_scale_min_k4
                sc = s[j] & 63 if j < 4 else (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4)
                mn = s[j + 4] & 63 if j < 4 else (s[j + 4] >> 4) | ((s[j] >> 6) << 4)
                f = field >> (24 * (j // 2))
                assert (f >> (6 * (j % 2))) & 63 == sc and (f >> (12 + 6 * (j % 2))) & 63 == mn


def test_q6k_scales_reorder_is_a_permutation() -> None:
    """Lane t = 2 rr + hh's four scales (groups 4 rr + f, weights 16 hh ..) are word t."""
    order = cuda_repack.Q6K_SCALES
    assert sorted(order.tolist()) == list(range(16))
    for t in range(4):
        rr, hh = t >> 1, t & 1
        assert order[4 * t : 4 * t + 4].tolist() == [8 * rr + 2 * f + hh for f in range(4)]


def test_only_the_wide_kind_repacks() -> None:
    raw = _raw(14, 3, 512)
    same, layout = cuda_repack.host_layout(14, raw, 512, wide=False)
    assert same is raw and layout == ""
    q8 = _raw(12, 3, 512).copy()
    same, layout = cuda_repack.host_layout(8, q8, 512, wide=True)  # Q8_0: no wide layout
    assert same is q8 and layout == ""
    wide, layout = cuda_repack.host_layout(14, raw, 512, wide=True)
    assert (
        layout == cuda_repack.LAYOUT
        and wide.tobytes() == cuda_repack.repack(14, raw, 512).tobytes()
    )


@pytest.mark.parametrize("code", cuda_repack.REPACKED)
def test_deq8_over_repacked_rows_is_the_reference(lib: ctypes.CDLL, code: int) -> None:
    """``deq8w`` (deq8's coalesced launch, ``deq4w`` reading the repacked rows: what cuBLAS
    batches and embedding rows take) over picked rows: f32 bit for bit the reference, f16
    its round to nearest, with 16-byte stores and without, nothing past a row's width."""
    rows, cols, ldo = 5, 1792, 1800  # 7 Q6_K super-blocks: a padded tail, idle threads
    raw = _raw(code, rows, cols, seed=3)
    want = dequantize(raw, TYPES[code], (rows, cols)).reshape(rows, cols)
    wide = np.ascontiguousarray(cuda_repack.repack(code, raw, cols))
    ids = np.array([4, 0, 2, 4, 1, 3], np.int64)
    blocks, bpr = cuda_deq.launch_shape(len(ids), cols)
    for f16, dt in ((0, np.float32), (1, np.float16)):
        for vec in (0, 1):
            out = np.full((len(ids), ldo), 7, dt)
            getattr(lib, f"d8w_{code}_{f16}")(
                _ptr(wide), ctypes.c_longlong(wide.shape[1]), cols, _ptr(ids), blocks, bpr,
                _ptr(out), ldo, vec,
            )  # fmt: skip
            u = f"u{out.itemsize}"
            np.testing.assert_array_equal(out[:, :cols].view(u), want[ids].astype(dt).view(u))
            assert (out[:, cols:] == 7).all()


def _quantized(x: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """x (n, cols) as quant_q8 writes it: int8 values and (scale, float sum) a group."""
    g = x.reshape(x.shape[0], -1, 32)
    d = np.abs(g).max(axis=-1) / np.float32(127)
    xq = np.rint(g / d[..., None]).astype(np.int8).reshape(x.shape)
    xs = np.stack([d, g.sum(axis=-1, dtype=np.float32)], axis=-1).astype(np.float32)
    return np.ascontiguousarray(xq), np.ascontiguousarray(xs)


@pytest.mark.parametrize("code", cuda_gemvw.WIDE_TYPES)
@pytest.mark.parametrize("cols", [512, 4096])
def test_lane_sums_are_the_quantized_product(lib: ctypes.CDLL, code: int, cols: int) -> None:
    """Every lane's loads and sums over whole rows (2 rows of x: the row offsets), each type
    repacked: the quantized product within float rounding, and
    gemvq's pieces over the same blocks within 1e-5."""
    rows = 3
    raw = _raw(code, rows, cols, seed=2)
    want = dequantize(raw, TYPES[code], (rows, cols)).reshape(rows, cols)
    wide = np.ascontiguousarray(cuda_repack.host_layout(code, raw, cols, wide=True)[0])
    x = np.random.default_rng(5).standard_normal((2, cols)).astype(np.float32)
    xq, xs = _quantized(x)
    ref = q8_reference(want.astype(np.float64), x, k_mins(raw, rows, TYPES[code]))
    gq = getattr(lib, f"gq_{code}")
    gq.restype = ctypes.c_float
    for r in range(rows):
        out = np.zeros(2, np.float32)
        getattr(lib, f"wdot_{code}")(_ptr(wide[r]), cols, _ptr(xq), _ptr(xs), _ptr(out))
        np.testing.assert_allclose(out, ref[:, r], rtol=1e-5, atol=1e-5 * np.abs(ref).max())
        old = gq(_ptr(raw[r]), cols // 32, _ptr(xq[0]), _ptr(xs[0]))
        assert abs(out[0] - old) <= 1e-5 * max(abs(old), np.abs(ref).max())
        one = np.zeros(1, np.float32)  # one row of x: its own path, the same bits
        getattr(lib, f"wdot1_{code}")(_ptr(wide[r]), cols, _ptr(xq[0]), _ptr(xs[0]), _ptr(one))
        assert one[0] == out[0], (one[0], out[0])  # the same integer sums and float steps


def test_launch_passes_rows_of_x_in_eights() -> None:
    """n rows of x: launches of 8 (the last of 1, 2, 4 or 8 rows, nr the rest), each with
    its rows' xq, xs and y, the grid of the row split ``wpr`` forces."""
    calls: list[tuple[str, Any, Any]] = []

    class Fn:
        def __init__(self, name: str) -> None:
            self.name = name

        def __call__(self, grid: Any, block: Any, args: Any) -> None:
            calls.append((self.name, grid, args))

    fn = {n: Fn(n) for n in cuda_gemvw.names()}
    p = SimpleNamespace(data="W", row_bytes=2304, rows=100, cols=4096, code=12)
    cols, n = 4096, 11
    xq, xs = np.arange(16 * cols, dtype=np.uint8), np.arange(16 * cols // 4, dtype=np.uint8)
    y = np.zeros((16, 100), np.float32)
    cuda_gemvw.launch(fn, p, (xq, xs), n, y, 100, True, 132, wpr=2)
    assert [c[0] for c in calls] == ["gemvw_12_8", "gemvw_12_4"]
    assert all(c[1] == ((100 + 3) // 4,) for c in calls)
    second = calls[1][2]
    qb, sb = cuda_gemvq.q8_bytes(8, cols)
    assert second[4].base is xq and second[4][0] == xq[qb] and second[5][0] == xs[sb]
    assert int(second[6]) == 3 and second[7].base is y and int(second[-1]) == 2
    assert int(second[-2]) == 1 and int(calls[0][2][6]) == 8
