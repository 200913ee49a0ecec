"""The "wide" int8 GEMV of the CUDA backend (CUDA C, appended after :mod:`.cuda_gemvq`):
the same quantized activations (``quant_q8``'s xq / xs) and the same integer arithmetic as
``gemvq``, but each lane issues 16-byte loads of weight quants, ``U`` units of them
(unrolled, all loads before any ``dp4a``), and reads x's int8 values 16 bytes at a time:
more bytes in flight per thread than gemvq's 4-byte words, which an H100 needs to read
HBM near its bandwidth (Little's law: ~16-20 KB in flight per SM).

``MODELC_CUDA_GEMV=wide``, the default (never in ``exact`` mode; ``q8`` the GEMV before it).  Types and units (what a
group of lanes reads):

* Q4_K (code 12) repacked in place (:func:`.cuda_repack.repack`: 144-byte super-blocks,
  16-byte aligned, the same size): 8 lanes a super-block, lane ``t`` its 16-byte header (d,
  dmin, then the 12 bytes of 6-bit scales and mins rearranged so that lane pair
  ``c = t >> 1``'s four -- sub-blocks ``2c``, ``2c + 1``'s scales, then their mins -- are the 24 bits
  at bit ``24 c``: one funnel shift and four field extracts, where the stored packing took
  ~20 operations) and nibble bytes ``16 t .. 16 t + 15`` (sub-blocks ``2c`` and ``2c + 1``,
  16 weights each).
* Q6_K (code 14) repacked at upload (:func:`.cuda_repack.repack`): a row's quant bytes (ql
  128 + qh 64 a super-block, as stored) first, then its scales (16 a super-block, reordered
  so a lane's four are one word), then its f16 d's, padded to 16 bytes. 4 lanes a
  super-block, lane ``t = 2 rr + hh``: three 16-byte loads (ql ``rr*64 + 16 hh``, ql
  ``rr*64 + 32 + 16 hh``, qh ``128 + rr*32 + 16 hh``) = weights ``16 hh .. 16 hh + 15`` of the
  super-block's groups ``4 rr .. 4 rr + 3``.
* Q4_0 (code 2) repacked: a row's 16-byte nibble blocks, then its f16 d's, padded to 16
  bytes.  A lane a group.

Same row bytes as the GGUF blocks wherever a row's super-blocks (Q6_K) or groups (Q4_0)
come in eights.  A repacked part says so (``DevPart.layout == "wide"``) and is only ever
read by these kernels: ``gemvw`` on the int8 path, ``deq8w`` (:mod:`.cuda_deq`'s coalesced
``deq8`` launch with ``deq4w`` reading the repacked rows; bit for bit ``deq_rows``'s values)
for cuBLAS batches, embedding rows and exact mode (also under ``MODELC_CUDA_DEQ=deq32``).  The default GEMV since session
23 (an H100, one stream: the 1.1B Q4_K_M 749 -> 929 tok/s, the 8B 212 -> 292).  Rows of x: 1, 2, 4, 8 a launch
(more: launches of 8).  ``tests/test_cuda_repack.py`` checks the layouts, the dequantizer
and each lane's sums on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from modelc.runtime.backends.cuda_gemvq import q8_bytes
from modelc.runtime.backends.cuda_repack import REPACKED

WIDE_TYPES = (2, 12, 14)  # GGML's numbers: Q4_0 Q4_K Q6_K
WIDE_ROWS = (1, 2, 4, 8)
WIDE_UNROLL = {2: 4, 12: 4, 14: 2}  # units a lane loads before its dp4a (U)
WIDE_UNITS = {2: (32, 1), 12: (256, 8), 14: (256, 4)}  # a unit's weights and lanes (Wide<T>)
# blocks of 256 an SM by rows of x (__launch_bounds__: 4 caps a thread at 64 registers)
WIDE_BLOCKS = {1: 4, 2: 4, 4: 3, 8: 2}

# 16-byte loads: weights past L1 (read once), x and its scales through it (every row reads them)
LOADS = {
    "na": 'asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"',
    "na256": 'asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"',
    "ldg": 'asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"',
}
LOAD = "na"

LOAD_SRC = r"""
__device__ __forceinline__ uint4 ldw(const u8* p) {
  uint4 v;
  __WLOAD__ : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// a weight load from global memory (ldw) or, for the pipelined GEMV (cuda_gemvp), shared
template <bool SH> __device__ __forceinline__ uint4 ldwt(const u8* p) { return ldw(p); }
template <> __device__ __forceinline__ uint4 ldwt<true>(const u8* p) { return *(const uint4*)p; }
__device__ __forceinline__ int4 ldx(const signed char* p) { return __ldg((const int4*)p); }
__device__ __forceinline__ float2 lds(const float2* p) { return __ldg(p); }
// x's values and scales from global memory or, where the pipelined GEMV staged them, shared
template <bool SX> __device__ __forceinline__ int4 ldxt(const signed char* p) { return ldx(p); }
template <> __device__ __forceinline__ int4 ldxt<true>(const signed char* p) { return *(const int4*)p; }
template <bool SX> __device__ __forceinline__ float2 ldst(const float2* p) { return lds(p); }
template <> __device__ __forceinline__ float2 ldst<true>(const float2* p) { return *p; }
// two neighbouring groups' (scale, sum), 16-byte aligned (an even group)
template <bool SX> __device__ __forceinline__ float4 ldst4(const float2* p) { return __ldg((const float4*)p); }
template <> __device__ __forceinline__ float4 ldst4<true>(const float2* p) { return *(const float4*)p; }
__device__ __forceinline__ int dp4us(u32 a, int b, int c) {  // unsigned bytes of a, signed of b
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
"""

SOURCE = r"""
__device__ __forceinline__ int dp16(uint4 w, int4 x) {  // 16 int8 pairs
  return __dp4a((int)w.w, x.w, __dp4a((int)w.z, x.z, __dp4a((int)w.y, x.y, __dp4a((int)w.x, x.x, 0))));
}
// a constant byte b (in each byte of the word) times 16 int8, added to c
__device__ __forceinline__ int dp4a16(u32 b, int4 x, int c) {
  return __dp4a((int)b, x.w, __dp4a((int)b, x.z, __dp4a((int)b, x.y, __dp4a((int)b, x.x, c))));
}
// 16 unsigned bytes . 16 int8, added to c
__device__ __forceinline__ int dp16us(uint4 w, int4 x, int c) {
  return dp4us(w.w, x.w, dp4us(w.z, x.z, dp4us(w.y, x.y, dp4us(w.x, x.x, c))));
}
// 16 high nibbles in place (q & 0xf0..: each 16 times its value) . 16 int8: 16 times the sum
__device__ __forceinline__ int dp16hi(uint4 q, int4 x) {
  uint4 h = make_uint4(q.x & 0xf0f0f0f0u, q.y & 0xf0f0f0f0u, q.z & 0xf0f0f0f0u, q.w & 0xf0f0f0f0u);
  return dp16us(h, x, 0);
}
__device__ __forceinline__ uint4 nib4(uint4 q, int sh) {  // 16 nibbles (sh 0: low, 4: high)
  return make_uint4((q.x >> sh) & 0x0f0f0f0fu, (q.y >> sh) & 0x0f0f0f0fu, (q.z >> sh) & 0x0f0f0f0fu,
                    (q.w >> sh) & 0x0f0f0f0fu);
}

// a type's unit (what LANES lanes read: WEIGHTS weights of a row), its loads (load: only
// loads, into Reg) and its share of the NR sums (dot: unit u of the row, lane t of its LANES)
template <int T> struct Wide;
template <> struct Wide<12> {  // Q4_K repacked in place: 8 lanes a super-block
  static constexpr int LANES = 8, WEIGHTS = 256;
  struct Reg { uint4 h, q; };
  template <bool SH = false>
  static __device__ __forceinline__ void load(const u8* __restrict__ wr, int cols, int u, int t, Reg& r) {
    const u8* b = wr + (size_t)u * 144;
    r.h = ldwt<SH>(b);
    r.q = ldwt<SH>(b + 16 + 16 * t);
  }
  template <int NR, bool SX = false>
  static __device__ __forceinline__ void dot(const Reg& r, int cols, int u, int t,
      const signed char* __restrict__ xq, const float2* __restrict__ xs, int nr, float* a) {
    int c = t >> 1, hh = t & 1, ng = cols >> 5;
    float d = h2f(r.h.x & 0xffff), dmin = h2f(r.h.x >> 16);
    // sub-blocks 2c and 2c + 1's 6-bit scales and mins: the 24 bits at bit 24 c of the
    // header's last 12 bytes (repack's order)
    u32 f = __funnelshift_r(c < 2 ? r.h.y : c == 2 ? r.h.z : r.h.w, c < 2 ? r.h.z : r.h.w, (24 * c) & 31);
    // the min once a group: lane hh of the pair takes sub-block 2c + hh's (no lane idle)
    float ml = __fmul_rn(dmin, (float)((f >> (12 + 6 * hh)) & 63));
    if constexpr (NR == 1) {
      // sub-block 2c (low nibbles) and 2c + 1 (high, left in place: 16 times the sum, the
      // scale a 16th: the same products to the bit); their x scales and sums in one load
      float dl0 = __fmul_rn(d, (float)(f & 63)), dl1 = __fmul_rn(d, (float)((f >> 6) & 63)) * 0.0625f;
      int g = u * 8 + 2 * c;
      const signed char* xr = xq + g * 32 + 16 * hh;
      int4 x0 = ldxt<SX>(xr), x1 = ldxt<SX>(xr + 32);
      float4 sv = ldst4<SX>(xs + g);
      a[0] += dl0 * (sv.x * (float)dp16(nib4(r.q, 0), x0)) - ml * (hh ? sv.w : sv.y);
      a[0] += dl1 * (sv.z * (float)dp16hi(r.q, x1));
      return;
    }
#pragma unroll
    for (int j = 0; j < 2; j++) {  // sub-block 2c + j: low (j 0) or high (j 1) nibbles
      int g = u * 8 + 2 * c + j;
      float dl = __fmul_rn(d, (float)((f >> (6 * j)) & 63));
      uint4 w = nib4(r.q, 4 * j);
#pragma unroll
      for (int i = 0; i < NR; i++) {
        if (i < nr) {
          int4 xv = ldxt<SX>(xq + (size_t)i * cols + g * 32 + 16 * hh);
          float2 sv = ldst<SX>(xs + (size_t)i * ng + g);
          if (j == 0)  // with sub-block 2c + hh's min (the pair's other lane the other's)
            a[i] += dl * (sv.x * (float)dp16(w, xv)) - ml * ldst<SX>(xs + (size_t)i * ng + g + hh).y;
          else
            a[i] += dl * (sv.x * (float)dp16(w, xv));
        }
      }
    }
  }
};
template <> struct Wide<14> {  // Q6_K repacked: 4 lanes a super-block
  static constexpr int LANES = 4, WEIGHTS = 256;
  struct Reg { uint4 a, b, h; u32 sc, d; };
  template <bool SH = false>
  static __device__ __forceinline__ void load(const u8* __restrict__ wr, int cols, int u, int t, Reg& r) {
    const u8* q = wr + (size_t)u * 192 + (t >> 1) * 64 + 16 * (t & 1);
    r.a = ldwt<SH>(q);
    r.b = ldwt<SH>(q + 32);
    r.h = ldwt<SH>(wr + (size_t)u * 192 + 128 + 16 * t);
    int nsb = cols >> 8;
    const u8* aux = wr + (size_t)nsb * 192;
    r.sc = ld32(aux + (size_t)u * 16 + 4 * t);
    r.d = ld16(aux + (size_t)nsb * 16 + 2 * u);
  }
  // the lane's 16 quants of group 4 rr + f, unsigned (0..63): ql's low (f < 2) or high
  // nibbles, qh's bits 2f above them
  static __device__ __forceinline__ uint4 quants(const Reg& r, int f) {
    uint4 l = nib4(f & 1 ? r.b : r.a, (f >> 1) * 4);
    return make_uint4(l.x | (((r.h.x >> (2 * f)) & 0x03030303u) << 4),
                      l.y | (((r.h.y >> (2 * f)) & 0x03030303u) << 4),
                      l.z | (((r.h.z >> (2 * f)) & 0x03030303u) << 4),
                      l.w | (((r.h.w >> (2 * f)) & 0x03030303u) << 4));
  }
  template <int NR, bool SX = false>
  static __device__ __forceinline__ void dot(const Reg& r, int cols, int u, int t,
      const signed char* __restrict__ xq, const float2* __restrict__ xs, int nr, float* a) {
    int hh = t & 1, ng = cols >> 5;
    float d = h2f((u16)r.d);
    if constexpr (NR == 1) {
      // one row of x: the quants left unsigned (0..63) for an unsigned-by-signed dp4a, the
      // 32 off each taken as -32 times x's bytes in the same chain (the same integer sum)
#pragma unroll
      for (int f = 0; f < 4; f++) {
        int4 xv = ldxt<SX>(xq + (u * 8 + (t >> 1) * 4 + f) * 32 + 16 * hh);
        int s = dp16us(quants(r, f), xv, dp4a16(0xe0e0e0e0u, xv, 0));
        float dl = __fmul_rn(d, (float)(signed char)(r.sc >> (8 * f)));
        a[0] += dl * (ldst<SX>(xs + u * 8 + (t >> 1) * 4 + f).x * (float)s);
      }
      return;
    }
#pragma unroll
    for (int f = 0; f < 4; f++) {  // group 4 rr + f
      uint4 q = quants(r, f), w = make_uint4(sub4(q.x, 0x20202020u), sub4(q.y, 0x20202020u),
                                             sub4(q.z, 0x20202020u), sub4(q.w, 0x20202020u));
      float dl = __fmul_rn(d, (float)(signed char)(r.sc >> (8 * f)));
      int g = u * 8 + (t >> 1) * 4 + f;
#pragma unroll
      for (int i = 0; i < NR; i++) {
        if (i < nr) {
          int4 xv = ldxt<SX>(xq + (size_t)i * cols + g * 32 + 16 * hh);
          a[i] += dl * (ldst<SX>(xs + (size_t)i * ng + g).x * (float)dp16(w, xv));
        }
      }
    }
  }
};
template <> struct Wide<2> {  // Q4_0 repacked: a lane a group
  static constexpr int LANES = 1, WEIGHTS = 32;
  struct Reg { uint4 q; u32 d; };
  template <bool SH = false>
  static __device__ __forceinline__ void load(const u8* __restrict__ wr, int cols, int u, int t, Reg& r) {
    r.q = ldwt<SH>(wr + (size_t)u * 16);
    r.d = ld16(wr + (size_t)(cols >> 1) + 2 * u);
  }
  template <int NR, bool SX = false>
  static __device__ __forceinline__ void dot(const Reg& r, int cols, int u, int t,
      const signed char* __restrict__ xq, const float2* __restrict__ xs, int nr, float* a) {
    uint4 lo = nib4(r.q, 0), hi = nib4(r.q, 4);
    lo = make_uint4(sub4(lo.x, 0x08080808u), sub4(lo.y, 0x08080808u), sub4(lo.z, 0x08080808u), sub4(lo.w, 0x08080808u));
    hi = make_uint4(sub4(hi.x, 0x08080808u), sub4(hi.y, 0x08080808u), sub4(hi.z, 0x08080808u), sub4(hi.w, 0x08080808u));
    float d = h2f((u16)r.d);
    int ng = cols >> 5;
#pragma unroll
    for (int i = 0; i < NR; i++) {
      if (i < nr) {
        const signed char* xp = xq + (size_t)i * cols + u * 32;
        int s = dp16(lo, ldxt<SX>(xp)) + dp16(hi, ldxt<SX>(xp + 16));
        a[i] += d * (ldst<SX>(xs + (size_t)i * ng + u).x * (float)s);
      }
    }
  }
};

// weights 4 sub .. of group g of a repacked row (cuda_deq's deq8 with L = 1: cuBLAS
// batches, embedding rows), the float steps of deq4<T> on the stored blocks
template <> __device__ __forceinline__ void deq4w<2>(const u8* __restrict__ row, int cols, int g, int sub, float* w) {
  float d = h2f(ld16(row + (size_t)(cols >> 1) + 2 * g));
  u32 v = ld32(row + (size_t)g * 16 + (sub & 3) * 4);
  int sh = (sub >> 2) * 4;
#pragma unroll
  for (int k = 0; k < 4; k++) w[k] = __fmul_rn(d, (float)((int)((v >> (8 * k + sh)) & 15) - 8));
}
template <> __device__ __forceinline__ void deq4w<12>(const u8* __restrict__ row, int cols, int g, int sub, float* w) {
  const u8* b = row + (size_t)(g >> 3) * 144;
  int s = g & 7, c = s >> 1, j = s & 1;
  float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
  u32 lo = ld32(b + 4 + 4 * (c * 3 / 4)), hi = ld32(b + 8 + 4 * (c * 3 / 4));
  u32 f = __funnelshift_r(lo, hi, (24 * c) & 31);
  float dl = __fmul_rn(d, (float)((f >> (6 * j)) & 63)), ml = __fmul_rn(dmin, (float)((f >> (12 + 6 * j)) & 63));
  u32 v = ld32(b + 16 + c * 32 + sub * 4);
  int sh = j * 4;
#pragma unroll
  for (int k = 0; k < 4; k++) w[k] = __fsub_rn(__fmul_rn(dl, (float)((v >> (8 * k + sh)) & 15)), ml);
}
template <> __device__ __forceinline__ void deq4w<14>(const u8* __restrict__ row, int cols, int g, int sub, float* w) {
  int sb = g >> 3, s = g & 7, r = s >> 2, f = s & 3, nsb = cols >> 8;
  const u8* b = row + (size_t)sb * 192;
  const u8* aux = row + (size_t)nsb * 192;
  float d = h2f(ld16(aux + (size_t)nsb * 16 + 2 * sb));
  float dl = __fmul_rn(d, (float)(signed char)aux[(size_t)sb * 16 + 8 * r + 4 * (sub >> 2) + f]);
  u32 l = ld32(b + r * 64 + (f & 1) * 32 + sub * 4), h = ld32(b + 128 + r * 32 + sub * 4);
  int lsh = (f >> 1) * 4;
#pragma unroll
  for (int k = 0; k < 4; k++) {
    int q = (int)(((l >> (8 * k + lsh)) & 15) | (((h >> (8 * k + 2 * f)) & 3) << 4)) - 32;
    w[k] = __fmul_rn(dl, (float)q);
  }
}
"""

KERNELS = r"""
// warp k (of the wpr splitting the row wr)'s share of the row's NR sums: its units U at a
// time, all their loads before any arithmetic; the weights (SH) and x (SX) from global
// memory or shared (cuda_gemvp's)
template <int T, int NR, int U, bool SH, bool SX>
__device__ __forceinline__ void row_units(const u8* __restrict__ wr, int cols, int k, int lane, int wpr,
                                          const signed char* xq, const float2* xs, int nr, float* a) {
  typedef Wide<T> P;
  constexpr int UPW = 32 / P::LANES;  // units a warp reads a pass
  int t = lane % P::LANES, nu = cols / P::WEIGHTS, step = UPW * wpr;
  for (int u0 = k * UPW + lane / P::LANES; u0 < nu; u0 += U * step) {
    typename P::Reg r[U];
#pragma unroll
    for (int j = 0; j < U; j++)
      if (u0 + j * step < nu) P::template load<SH>(wr, cols, u0 + j * step, t, r[j]);
#pragma unroll
    for (int j = 0; j < U; j++)
      if (u0 + j * step < nu) P::template dot<NR, SX>(r[j], cols, u0 + j * step, t, xq, xs, nr, a);
  }
}

// y[r, row] (+)= W[row] . x[r] for nr <= NR rows of the quantized x; wpr warps a row, each
// lane U units at a time: their loads first, then their sums
template <int T, int NR, int U, bool SX = false>
__device__ __forceinline__ void gemvw(const u8* __restrict__ W, long long rb, int rows, int cols,
                                      const signed char* __restrict__ xq, const float2* __restrict__ xs,
                                      int nr, float* __restrict__ y, int ldy, int acc, int wpr) {
  __shared__ float part[8][NR];
  // wpr a power of two: shifts, not the divisions a runtime divisor costs (~30 instructions
  // each, three a warp before its first load)
  int lw = __ffs(wpr) - 1, wib = threadIdx.x >> 5, lane = threadIdx.x & 31, k = wib & (wpr - 1);
  int per = 8 >> lw, groups = (rows + per - 1) >> (3 - lw);
  // a block per group of 8 / wpr rows, or fewer blocks each taking every gridDim.x-th group
  for (int rg = blockIdx.x; rg < groups; rg += gridDim.x) {
    int row = rg * per + (wib >> lw);
    bool ok = row < rows;
    float a[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) a[i] = 0.f;
    if (ok) row_units<T, NR, U, false, SX>(W + (size_t)row * rb, cols, k, lane, wpr, xq, xs, nr, a);
    rows_out<NR>(a, part, wib, lane, k, wpr, ok, nr, y + row, ldy, acc);
    if (wpr > 1 && rg + gridDim.x < groups) __syncthreads();  // part[] read before it is reused
  }
}
"""


def instances(unroll: dict[int, int] | None = None, blocks: int = 0) -> str:
    """The kernels' entry points; ``unroll``: U by type (:data:`WIDE_UNROLL` where absent);
    ``blocks``: one row of x's launch bound in blocks an SM (0: :data:`WIDE_BLOCKS`'s)."""
    us = {**WIDE_UNROLL, **(unroll or {})}
    bs = {**WIDE_BLOCKS, **({1: blocks} if blocks else {})}
    out = [
        f'extern "C" __global__ void __launch_bounds__(256, {bs[nr]}) '
        f"gemvw_{t}_{nr}(const u8* W, long long rb, int rows, "
        "int cols, const signed char* xq, const float2* xs, int nr, float* y, int ldy, "
        f"int acc, int wpr) {{ enter_gemv(W, rb, rows, wpr); "
        f"gemvw<{t}, {nr}, {us[t]}>(W, rb, rows, cols, xq, xs, nr, y, "
        "ldy, acc, wpr); }"
        for t in WIDE_TYPES
        for nr in WIDE_ROWS
    ]
    out += [
        f'extern "C" __global__ void deq8w_{t}_{f}(const u8* W, long long rb, int cols, '
        "const i64* ids, int bpr, void* out, int ldo, int vec) "
        f"{{ ENTER(); deq8<{t}, {f}, 1>(W, rb, cols, ids, bpr, out, ldo, vec); }}"
        for t in REPACKED
        for f in (0, 1)
    ]
    return "\n".join(out)


def source(unroll: dict[int, int] | None = None, load: str = LOAD, blocks: int = 0) -> str:
    """This module's CUDA C (after :mod:`.cuda_gemvq`'s, whose ``sub4`` it uses, and
    :mod:`.cuda_gemv`'s ``rows_out``); ``unroll``, ``load`` (a key of :data:`LOADS`) and
    ``blocks`` (:func:`instances`): the variants ``bench/cuda_gemv_sweep.py`` times."""
    body = LOAD_SRC.replace("__WLOAD__", LOADS[load]) + SOURCE + KERNELS
    return body + instances(unroll, blocks)


def names() -> list[str]:
    gemvw = [f"gemvw_{t}_{nr}" for t in WIDE_TYPES for nr in WIDE_ROWS]
    return gemvw + [f"deq8w_{t}_{f}" for t in REPACKED for f in (0, 1)]


def launch(
    fn: dict[str, Any],
    p: Any,
    q8: tuple[Any, Any],
    n: int,
    y: Any,
    ldy: int,
    acc: bool,
    sms: int,
    waves: int = 0,
    wpr: int = 0,
    split_k: bool = True,
) -> None:
    """``y[:n] (+)= xq[:n] . p`` by ``gemvw``: n rows of the quantized x (launches of at most
    8); warps a weight row by :func:`split` on ``sms`` multiprocessors (``wpr`` > 0: that
    many; ``split_k`` False: one); ``waves``: the grid capped at that many resident waves of
    blocks, each block taking every grid-th group of rows (0: a block a group)."""
    for nr, args in passes(p, q8, n, y, ldy, acc):
        w = wpr or (split(p.code, p.rows, p.cols, nr, sms) if split_k else 1)
        groups = (p.rows + 8 // w - 1) // (8 // w)
        cap = sms * WIDE_BLOCKS[nr] * waves if sms and waves else groups
        fn[f"gemvw_{p.code}_{nr}"]((min(groups, cap),), (256,), (*args, np.int32(w)))


def split(code: int, rows: int, cols: int, nr: int, sms: int) -> int:
    """Warps a weight row for ``gemvw`` (1, 2, 4 or 8): the fewest that give each warp one
    unrolled pass over its units (a long row split: its loads in flight at once), doubled once
    more where that fills the last resident wave of blocks at least 15 % better.

    From ``bench/cuda_gemv_sweep.py`` on an H100 (session 31): the 8B's QKV (6,144 rows,
    1.45 waves at one warp a row) 1.11-1.26x faster at two; its down projection (14,336
    wide, 56 super-blocks a row) 1.15x at four; the O projection (0.97 waves) and gate+up
    (28,672 rows) best at one, as the 1.1B's shapes."""
    units = cols // WIDE_UNITS[code][0]
    per = WIDE_UNROLL[code] * (32 // WIDE_UNITS[code][1])  # units a warp's unrolled pass reads
    w = 1
    while w < 8 and units > w * per:
        w *= 2
    slots = max(1, sms * WIDE_BLOCKS[nr])

    def fill(w: int) -> float:
        blocks = -(-rows // (8 // w))
        return blocks / (-(-blocks // slots) * slots)

    if w < 8 and units >= 2 * w * (32 // WIDE_UNITS[code][1]) and fill(2 * w) > 1.15 * fill(w):
        w *= 2
    return w


def passes(
    p: Any, q8: tuple[Any, Any], n: int, y: Any, ldy: int, acc: bool
) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """A wide-layout GEMV's launches over n rows of the quantized x, at most 8 a launch: each
    one's NR and its arguments up to ``acc`` (the kernels' common head)."""
    for r0 in range(0, n, max(WIDE_ROWS)):
        m = min(max(WIDE_ROWS), n - r0)
        nr = next(r for r in WIDE_ROWS if r >= m)
        qb, sb = q8_bytes(r0, p.cols)
        args: tuple[Any, ...] = (p.data, np.int64(p.row_bytes), np.int32(p.rows), np.int32(p.cols))
        args += (q8[0][qb:], q8[1][sb:], np.int32(m), y[r0:] if r0 else y, np.int32(ldy))
        yield nr, (*args, np.int32(int(acc)))
