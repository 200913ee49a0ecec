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

// a warp's NR sums a[] of its row (warp k of the wpr splitting it) added up, and lane r of
// warp 0 of the row writes (or adds) y[r * ldy] (y: the row's column)
template <int NR>
__device__ __forceinline__ void rows_out(float* a, float (*part)[NR], int wib, int lane, int k,
                                         int wpr, bool ok, int nr, float* __restrict__ y, int ldy,
                                         int acc) {
#pragma unroll
  for (int r = 0; r < NR; r++) {
    float s = warp_sum(a[r]);
    if (lane == 0) part[wib][r] = s;
  }
  if (wpr > 1) __syncthreads(); else __syncwarp();
  if (ok && k == 0 && lane < nr) {
    float s = 0.f;
    for (int j = 0; j < wpr; j++) s += part[wib + j][lane];
    float* o = y + (size_t)lane * ldy;
    *o = acc ? *o + s : s;
  }
}

__DEQ4__
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
  rows_out<NR>(a, part, wib, lane, k, wpr, ok, nr, y + row, ldy, acc);
}

// x (n, cols) f32 with row stride ldx -> out (n, cols) f16, contiguous
extern "C" __global__ void to_f16(const float* __restrict__ x, int ldx, int cols, long long total,
                                  u16* __restrict__ out) {
  ENTER();
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
        f"{{ enter_gemv(W, rb, rows, wpr); gemv4<{t}, {nr}>(W, rb, rows, cols, x, ldx, nr, y, ldy, acc, wpr); }}"
        for t in types
        for nr in GEMV4_ROWS
    )


def names(types: tuple[int, ...]) -> list[str]:
    return ["to_f16"] + [f"gemv4_{t}_{nr}" for t in types for nr in GEMV4_ROWS]
