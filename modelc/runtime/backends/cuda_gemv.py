"""The coalesced GEMV of the CUDA backend (CUDA C, appended to :mod:`.cuda_src`).

One warp a weight row, as ``gemv``, but the lanes split each 32-weight group: lanes
``8k .. 8k+7`` take group ``g + k``, four consecutive weights each (``deq4<T>``), so a
warp reads its activations as one contiguous 512-byte run per row of x (the first GEMV
gave each lane a whole group: 32 lines touched per load) and its weight bytes as
neighbouring blocks.  Same float steps as ``deq32``; sums in another order.

Also ``to_f16``: activations to half precision for the cuBLAS path.
"""

from __future__ import annotations

GEMV4_ROWS = (1, 2, 4, 8, 16)

SOURCE = r"""
template <int T> __device__ __forceinline__ void deq4(const u8* __restrict__ row, int g, int sub, float* w);

template <> __device__ __forceinline__ void deq4<0>(const u8* __restrict__ row, int g, int sub, float* w) {
  float4 v = *(const float4*)(row + (size_t)(g * 32 + sub * 4) * 4);
  w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
}
template <> __device__ __forceinline__ void deq4<1>(const u8* __restrict__ row, int g, int sub, float* w) {
  const u8* b = row + (size_t)(g * 32 + sub * 4) * 2;
  u32 a = ld32(b), c = ld32(b + 4);
  w[0] = h2f(a & 0xffff); w[1] = h2f(a >> 16); w[2] = h2f(c & 0xffff); w[3] = h2f(c >> 16);
}
template <> __device__ __forceinline__ void deq4<2>(const u8* __restrict__ row, int g, int sub, float* w) {  // Q4_0
  const u8* b = row + (size_t)g * 18;
  float d = h2f(ld16(b));
  const u8* q = b + 2 + (sub & 3) * 4;
  u32 v = ld16(q) | ((u32)ld16(q + 2) << 16);
  int sh = (sub >> 2) * 4;
#pragma unroll
  for (int k = 0; k < 4; k++) w[k] = __fmul_rn(d, (float)((int)((v >> (8 * k + sh)) & 15) - 8));
}
template <> __device__ __forceinline__ void deq4<3>(const u8* __restrict__ row, int g, int sub, float* w) {  // Q4_1
  const u8* b = row + (size_t)g * 20;
  float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
  u32 v = ld32(b + 4 + (sub & 3) * 4);
  int sh = (sub >> 2) * 4;
#pragma unroll
  for (int k = 0; k < 4; k++) w[k] = __fadd_rn(__fmul_rn(d, (float)((v >> (8 * k + sh)) & 15)), m);
}
template <> __device__ __forceinline__ void deq4<8>(const u8* __restrict__ row, int g, int sub, float* w) {  // Q8_0
  const u8* b = row + (size_t)g * 34;
  float d = h2f(ld16(b));
  const u8* q = b + 2 + sub * 4;
  u32 v = ld16(q) | ((u32)ld16(q + 2) << 16);
#pragma unroll
  for (int k = 0; k < 4; k++) w[k] = __fmul_rn((float)(signed char)((v >> (8 * k)) & 0xff), d);
}
template <> __device__ __forceinline__ void deq4<12>(const u8* __restrict__ row, int g, int sub, float* w) {  // Q4_K
  const u8* b = row + (size_t)(g >> 3) * 144;
  int s = g & 7;
  float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
  const u8* S = b + 4;
  int sc, mn;
  if (s < 4) { sc = S[s] & 63; mn = S[s+4] & 63; }
  else { sc = (S[s+4] & 15) | ((S[s-4] >> 6) << 4); mn = (S[s+4] >> 4) | ((S[s] >> 6) << 4); }
  float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)mn);
  u32 v = ld32(b + 16 + (s >> 1) * 32 + sub * 4);
  int sh = (s & 1) * 4;
#pragma unroll
  for (int k = 0; k < 4; k++) w[k] = __fsub_rn(__fmul_rn(dl, (float)((v >> (8 * k + sh)) & 15)), ml);
}
template <> __device__ __forceinline__ void deq4<14>(const u8* __restrict__ row, int g, int sub, float* w) {  // Q6_K
  const u8* b = row + (size_t)(g >> 3) * 210;
  int s = g & 7, r = s >> 2, f = s & 3;
  const u8* ql = b + r * 64 + (f & 1) * 32 + sub * 4;
  const u8* qh = b + 128 + r * 32 + sub * 4;
  int lsh = (f >> 1) * 4;
  float dl = __fmul_rn(h2f(ld16(b + 208)), (float)(signed char)b[192 + 2 * s + (sub >> 2)]);
  u32 l = ld16(ql) | ((u32)ld16(ql + 2) << 16), h = ld16(qh) | ((u32)ld16(qh + 2) << 16);
#pragma unroll
  for (int k = 0; k < 4; k++) {
    int q = (int)(((l >> (8 * k + lsh)) & 15) | (((h >> (8 * k + 2 * f)) & 3) << 4)) - 32;
    w[k] = __fmul_rn(dl, (float)q);
  }
}

__MORE_DEQ4__
// wpr warps split each weight row's groups (a block of 8 warps holds 8 / wpr rows), their
// sums added in shared memory: rows with long K, or too few rows to fill the GPU, get more
// loads in flight
template <int T, int NR>
__device__ __forceinline__ void gemv4(const u8* __restrict__ W, long long rb, int rows, int cols,
                                      const float* __restrict__ x, int ldx, int nr,
                                      float* __restrict__ y, int ldy, int acc, int wpr) {
  __shared__ float part[8][NR];
  int wib = threadIdx.x >> 5, lane = threadIdx.x & 31, sub = lane & 7;
  int row = blockIdx.x * (8 / wpr) + wib / wpr, k = wib % wpr;
  bool ok = row < rows;
  float a[NR];
#pragma unroll
  for (int r = 0; r < NR; r++) a[r] = 0.f;
  if (ok) {
    const u8* wr = W + (size_t)row * rb;
    int ng = cols >> 5;
#pragma unroll 4
    for (int g = k * 4 + (lane >> 3); g < ng; g += 4 * wpr) {
      float w[4];
      deq4<T>(wr, g, sub, w);
#pragma unroll
      for (int r = 0; r < NR; r++) {
        if (r < nr) {
          float4 v = __ldg((const float4*)(x + (size_t)r * ldx + g * 32 + sub * 4));
          a[r] += w[0] * v.x + w[1] * v.y + w[2] * v.z + w[3] * v.w;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < NR; r++) {
    float s = warp_sum(a[r]);
    if (lane == 0) part[wib][r] = s;
  }
  if (wpr > 1) __syncthreads(); else __syncwarp();
  if (ok && k == 0 && lane < nr) {
    float s = 0.f;
    for (int j = 0; j < wpr; j++) s += part[wib + j][lane];
    float* o = y + (size_t)lane * ldy + row;
    *o = acc ? *o + s : s;
  }
}

// x (n, cols) f32 with row stride ldx -> out (n, cols) f16, contiguous
extern "C" __global__ void to_f16(const float* __restrict__ x, int ldx, int cols, long long total,
                                  u16* __restrict__ out) {
  long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (t >= total) return;
  long long i = t / cols, j = t % cols;
  out[t] = f2h(x[i * ldx + j]);
}
"""


def instances(types: tuple[int, ...]) -> str:
    return "\n".join(
        f'extern "C" __global__ void gemv4_{t}_{nr}(const u8* W, long long rb, int rows, '
        "int cols, const float* x, int ldx, int nr, float* y, int ldy, int acc, int wpr) "
        f"{{ gemv4<{t}, {nr}>(W, rb, rows, cols, x, ldx, nr, y, ldy, acc, wpr); }}"
        for t in types
        for nr in GEMV4_ROWS
    )


def names(types: tuple[int, ...]) -> list[str]:
    return ["to_f16"] + [f"gemv4_{t}_{nr}" for t in types for nr in GEMV4_ROWS]
