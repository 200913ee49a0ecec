"""The int8 GEMV of the CUDA backend (CUDA C, appended after :mod:`.cuda_deq`), as
llama.cpp's ``mmvq.cu`` / ``vecdotq.cuh``: the activations quantized once a product to
8 bits a value in groups of 32 (``quant_q8``: scale ``amax / 127``, the group's float
sum kept for the types with a min), then each weight group's integer dot product with
``__dp4a`` on 4-byte words, scaled once a piece of 8 weights.

Types: Q4_0, Q8_0, Q4_K, Q5_K, Q6_K (a Q4_K_M or Q5_K_M file's); the others stay on
``gemv4``.  Layout as
``gemv4`` (a weight row split over ``wpr`` warps) but four lanes a group, eight weights
each, so a warp reads eight groups (a K-quant super-block) an iteration.  Opt-in
(``MODELC_CUDA_GEMV=q8``) until an H100 run holds it to the CPU's fast mode; never in
``exact`` mode.  ``wq8<T>`` is apart from the launch so ``tests/test_cuda_quants_host.py``
checks its bit layouts and a row's sum on the CPU.
"""

from __future__ import annotations

Q8_TYPES = (2, 8, 12, 13, 14)  # GGML's numbers: Q4_0 Q8_0 Q4_K Q5_K Q6_K
GEMVQ_ROWS = (1, 2, 4, 8, 16)

SOURCE = r"""
__device__ __forceinline__ u32 ld32h(const u8* p) { return (u32)ld16(p) | ((u32)ld16(p + 2) << 16); }
__device__ __forceinline__ u32 sub4(u32 a, u32 b) {  // bytewise a - b, no borrow between bytes
  return ((a | 0x80808080u) - b) ^ 0x80808080u;
}

// piece j (weights 8j .. 8j+7) of group g of a row: q[2] eight signed 8-bit weights,
// the float weight is dl * q - ml (ml only on piece 0 of the group, times the group's sum)
template <int T> __device__ __forceinline__ void wq8(const u8* __restrict__ row, int g, int j, int* q, float* dl, float* ml);
template <> __device__ __forceinline__ void wq8<2>(const u8* __restrict__ row, int g, int j, int* q, float* dl, float* ml) {  // Q4_0
  const u8* b = row + (size_t)g * 18;
  const u8* p = b + 2 + (j & 1) * 8;
  int sh = (j >> 1) * 4;
  q[0] = (int)sub4((ld32h(p) >> sh) & 0x0f0f0f0fu, 0x08080808u);
  q[1] = (int)sub4((ld32h(p + 4) >> sh) & 0x0f0f0f0fu, 0x08080808u);
  *dl = h2f(ld16(b)); *ml = 0.f;
}
template <> __device__ __forceinline__ void wq8<8>(const u8* __restrict__ row, int g, int j, int* q, float* dl, float* ml) {  // Q8_0
  const u8* b = row + (size_t)g * 34;
  q[0] = (int)ld32h(b + 2 + 8 * j); q[1] = (int)ld32h(b + 6 + 8 * j);
  *dl = h2f(ld16(b)); *ml = 0.f;
}
template <> __device__ __forceinline__ void wq8<12>(const u8* __restrict__ row, int g, int j, int* q, float* dl, float* ml) {  // Q4_K
  const u8* b = row + (size_t)(g >> 3) * 144;  // 16-byte aligned: word loads throughout
  int s = g & 7, k = 8 * (s & 3);
  u32 dm = ld32(b), s0 = ld32(b + 4), s1 = ld32(b + 8), s2 = ld32(b + 12);
  u32 sc = s < 4 ? (s0 >> k) & 63 : ((s2 >> k) & 15) | (((s0 >> k) >> 6 & 3) << 4);
  u32 mn = s < 4 ? (s1 >> k) & 63 : ((s2 >> k) >> 4 & 15) | (((s1 >> k) >> 6 & 3) << 4);
  const u8* p = b + 16 + (s >> 1) * 32 + 8 * j;
  int sh = (s & 1) * 4;
  q[0] = (int)((ld32(p) >> sh) & 0x0f0f0f0fu); q[1] = (int)((ld32(p + 4) >> sh) & 0x0f0f0f0fu);
  *dl = __fmul_rn(h2f(dm & 0xffff), (float)sc);
  *ml = j == 0 ? __fmul_rn(h2f(dm >> 16), (float)mn) : 0.f;
}
template <> __device__ __forceinline__ void wq8<13>(const u8* __restrict__ row, int g, int j, int* q, float* dl, float* ml) {  // Q5_K
  const u8* b = row + (size_t)(g >> 3) * 176;  // 16-byte aligned
  int s = g & 7, sc, mn;
  k_scale_min(b + 4, s, &sc, &mn);
  const u8* p = b + 48 + (s >> 1) * 32 + 8 * j;
  int sh = (s & 1) * 4;
#pragma unroll
  for (int k = 0; k < 2; k++) {
    u32 h = (ld32(b + 16 + 8 * j + 4 * k) >> s) & 0x01010101u;
    q[k] = (int)(((ld32(p + 4 * k) >> sh) & 0x0f0f0f0fu) | (h << 4));
  }
  *dl = __fmul_rn(h2f(ld16(b)), (float)sc);
  *ml = j == 0 ? __fmul_rn(h2f(ld16(b + 2)), (float)mn) : 0.f;
}
template <> __device__ __forceinline__ void wq8<14>(const u8* __restrict__ row, int g, int j, int* q, float* dl, float* ml) {  // Q6_K
  const u8* b = row + (size_t)(g >> 3) * 210;
  int s = g & 7, r = s >> 2, f = s & 3;
  const u8* ql = b + r * 64 + (f & 1) * 32 + 8 * j;
  const u8* qh = b + 128 + r * 32 + 8 * j;
  int lsh = (f >> 1) * 4;
#pragma unroll
  for (int k = 0; k < 2; k++) {
    u32 l = (ld32h(ql + 4 * k) >> lsh) & 0x0f0f0f0fu, h = (ld32h(qh + 4 * k) >> (2 * f)) & 0x03030303u;
    q[k] = (int)sub4(l | (h << 4), 0x20202020u);
  }
  *dl = __fmul_rn(h2f(ld16(b + 208)), (float)(signed char)b[192 + 2 * s + (j >> 1)]);
  *ml = 0.f;
}

// a piece's share of the dot product with x's quantized piece xv (scale and sum s)
__device__ __forceinline__ float piece_dot(const int* q, float dl, float ml, int2 xv, float2 s) {
  return dl * (s.x * (float)__dp4a(q[1], xv.y, __dp4a(q[0], xv.x, 0))) - ml * s.y;
}
"""

KERNELS = r"""
// x (n, cols) f32, row stride ldx -> xq (n, cols) int8 and xs (n, cols / 32) (scale, float
// sum) a group of 32; a warp a group
extern "C" __global__ void quant_q8(const float* __restrict__ x, int ldx, int cols, int n,
                                    signed char* __restrict__ xq, float2* __restrict__ xs) {
  ENTER();
  long long gw = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31, ng = cols >> 5;
  if (gw >= (long long)n * ng) return;
  int i = (int)(gw / ng), g = (int)(gw % ng);
  float v = x[(size_t)i * ldx + g * 32 + lane];
  quant_lanes<1>(&v, lane, xq + (size_t)i * cols + g * 32 + lane, xs + (size_t)i * ng + g);
}

// rms_norm (rows 0..n-1, no acc) and quant_q8 of its output in one launch: out[i] =
// x[i] / rms * w as rms_norm writes it, and its groups to xq / xs; one block a row
extern "C" __global__ void rms_norm_q8(const float* __restrict__ x, int ldx,
                                       const float* __restrict__ w, float eps, int d,
                                       float* __restrict__ out, int ldo,
                                       signed char* __restrict__ xq, float2* __restrict__ xs) {
  ENTER();
  int i = blockIdx.x, lane = threadIdx.x & 31, ng = d >> 5;
  const float* xr = x + (size_t)i * ldx;
  float scale = row_rms_scale(xr, d, eps);
  for (int g = threadIdx.x >> 5; g < ng; g += blockDim.x >> 5) {
    int j = g * 32 + lane;
    float v = xr[j] * scale * w[j];
    out[(size_t)i * ldo + j] = v;
    quant_lanes<1>(&v, lane, xq + (size_t)i * d + j, xs + (size_t)i * ng + g);
  }
}

// y[r, row] (+)= W[row] . x[r] for nr <= NR rows of the quantized x; wpr warps a row
template <int T, int NR>
__device__ __forceinline__ void gemvq(const u8* __restrict__ W, long long rb, int rows, int cols,
                                      const signed char* __restrict__ xq, const float2* __restrict__ xs,
                                      int nr, float* __restrict__ y, int ldy, int acc, int wpr) {
  __shared__ float part[8][NR];
  int wib = threadIdx.x >> 5, lane = threadIdx.x & 31, j = lane & 3;
  int row = blockIdx.x * (8 / wpr) + wib / wpr, k = wib % wpr;
  bool ok = row < rows;
  float a[NR];
#pragma unroll
  for (int r = 0; r < NR; r++) a[r] = 0.f;
  if (ok) {
    const u8* wr = W + (size_t)row * rb;
    int ng = cols >> 5;
#pragma unroll 8
    for (int g = k * 8 + (lane >> 2); g < ng; g += 8 * wpr) {
      int q[2];
      float dl, ml;
      wq8<T>(wr, g, j, q, &dl, &ml);
#pragma unroll
      for (int r = 0; r < NR; r++) {
        if (r < nr) {
          int2 xv = __ldg((const int2*)(xq + (size_t)r * cols + g * 32 + 8 * j));
          a[r] += piece_dot(q, dl, ml, xv, __ldg(xs + (size_t)r * ng + g));
        }
      }
    }
  }
  rows_out<NR>(a, part, wib, lane, k, wpr, ok, nr, y + row, ldy, acc);
}

// act_mul and quant_q8 of its output in one launch (the down product's x); a warp a group
template <int GELU>
__device__ __forceinline__ void act_mul_q8(const float* __restrict__ gu, int ff, int n,
                                           float* __restrict__ out, signed char* __restrict__ xq,
                                           float2* __restrict__ xs) {
  long long gw = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31, ng = ff >> 5;
  if (gw >= (long long)n * ng) return;
  int i = (int)(gw / ng), j = (int)(gw % ng) * 32 + lane;
  float g = gu[(size_t)i * 2 * ff + j], u = gu[(size_t)i * 2 * ff + ff + j];
  float v = GELU ? gelu_of(g, u) : silu_of(g, u);
  out[(size_t)i * ff + j] = v;
  quant_lanes<1>(&v, lane, xq + (size_t)i * ff + j, xs + gw);
}
extern "C" __global__ void silu_mul_q8(const float* gu, int ff, int n, float* out, signed char* xq,
                                       float2* xs) { ENTER(); act_mul_q8<0>(gu, ff, n, out, xq, xs); }
extern "C" __global__ void gelu_mul_q8(const float* gu, int ff, int n, float* out, signed char* xq,
                                       float2* xs) { ENTER(); act_mul_q8<1>(gu, ff, n, out, xq, xs); }
"""


def instances() -> str:
    return "\n".join(
        f'extern "C" __global__ void gemvq_{t}_{nr}(const u8* W, long long rb, int rows, '
        "int cols, const signed char* xq, const float2* xs, int nr, float* y, int ldy, "
        f"int acc, int wpr) {{ enter_gemv(W, rb, rows, wpr); gemvq<{t}, {nr}>(W, rb, rows, cols, xq, xs, nr, y, ldy, acc, wpr); }}"
        for t in Q8_TYPES
        for nr in GEMVQ_ROWS
    )


def names() -> list[str]:
    fused = ["quant_q8", "rms_norm_q8", "silu_mul_q8", "gelu_mul_q8"]
    return fused + [f"gemvq_{t}_{nr}" for t in Q8_TYPES for nr in GEMVQ_ROWS]


def q8_bytes(n: int, cols: int) -> tuple[int, int]:
    """Bytes of ``n`` rows of ``cols`` quantized activations: the int8 values (n, cols) and
    the float (scale, sum) pairs (n, cols / 32, 2) that follow them."""
    return n * cols, n * (cols // 32) * 8
