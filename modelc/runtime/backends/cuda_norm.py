"""RMS norms of the CUDA backend held in registers (CUDA C, appended to :mod:`.cuda_src`).

``rms_norm`` (in :mod:`.cuda_src`) reads a row twice with one float a thread a load, so a
2,048-wide row took ~6 us of dependent loads on an H100 (45 launches a 1.1B step, 14 %
of it).  Here a row is read once, four floats a thread a load (``float4``), into
registers: up to :data:`NV4` float4s a thread, 1,024 threads a block, so rows up to
16,384 wide; the squares summed in double as numpy does (``rms_norm``'s order of terms
differs, so its bits may too in the last place), then each thread scales its own values.
``rms_norm_v4_q8`` also quantizes its output for the int8 GEMV, a group of 32 being 8
neighbouring lanes' float4s.  :meth:`Device.rms_norm <.cuda.Device.rms_norm>` takes
these where rows, weights and outputs are 16-byte aligned, ``rms_norm`` elsewhere.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from modelc.runtime.backends.cuda_gemvw import WIDE_BLOCKS, WIDE_TYPES, WIDE_UNROLL, grid

NV4 = 4  # float4s a thread at most
MAX_THREADS = 1024

SOURCE = r"""
#define NV4 4
// a thread's float4s of the row r (d, 16-byte aligned): t, t + blockDim.x, ...; zeros past it
__device__ __forceinline__ void load_v4(const float* __restrict__ r, int d, float4* v) {
#pragma unroll
  for (int k = 0; k < NV4; k++) {
    int i = threadIdx.x + k * blockDim.x;
    v[k] = i < (d >> 2) ? ((const float4*)r)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// 1 / rms of the row xr (d, 16-byte aligned) for the whole block, its float4s left in v
// (load_v4's); a norm's weights loaded before it are in flight with x's
__device__ __forceinline__ float row_scale_v4(const float* __restrict__ xr, int d, float eps, float4* v) {
  double s = 0.0;
  load_v4(xr, d, v);
#pragma unroll
  for (int k = 0; k < NV4; k++) {
    double a = v[k].x, b = v[k].y, c = v[k].z, e = v[k].w;
    s += a * a; s += b * b; s += c * c; s += e * e;
  }
  return (float)(1.0 / sqrt(block_sum(s) / d + (double)eps));
}

__device__ __forceinline__ float4 scaled4(float4 v, float s, float4 w) {
  return make_float4(v.x * s * w.x, v.y * s * w.y, v.z * s * w.z, v.w * s * w.w);
}

// out[i] (+)= x[rows[i]] / rms * w (rows null: i); one block a row
extern "C" __global__ void __launch_bounds__(1024) rms_norm_v4(const float* __restrict__ x, int ldx, const i64* __restrict__ rows,
                                       const float* __restrict__ w, float eps, int d,
                                       float* __restrict__ out, int ldo, int acc) {
  ENTER();
  int i = blockIdx.x, n4 = d >> 2;
  float4 v[NV4];
  float s = row_scale_v4(x + (size_t)(rows ? rows[i] : i) * ldx, d, eps, v);
  float4* o = (float4*)(out + (size_t)i * ldo);
#pragma unroll
  for (int k = 0; k < NV4; k++) {
    int j = threadIdx.x + k * blockDim.x;
    if (j < n4) {
      float4 r = scaled4(v[k], s, ((const float4*)w)[j]);
      if (acc) { float4 p = o[j]; r = make_float4(p.x + r.x, p.y + r.y, p.z + r.z, p.w + r.w); }
      o[j] = r;
    }
  }
}

// a row xr (d, 16-byte aligned) / rms * w into out (null: not written) and quantized for the
// int8 GEMV into xq / xs (as quant_q8: scale amax / 127 a group of 32, the group's float sum),
// by the whole block: rms_norm_v4_q8's work, and the normed wide GEMV's prologue (gemvwn:
// into shared memory)
__device__ __forceinline__ void norm_q8_v4(const float* __restrict__ xr, const float* __restrict__ w,
                                           float eps, int d, float* __restrict__ out,
                                           signed char* xq, float2* xs) {
  int n4 = d >> 2, lane = threadIdx.x & 31;
  float4 v[NV4], wv[NV4];
  load_v4(w, d, wv);
  float s = row_scale_v4(xr, d, eps, v);
#pragma unroll
  for (int k = 0; k < NV4; k++) {
    int j = threadIdx.x + k * blockDim.x;
    bool ok = j < n4;  // a whole group of 8 lanes in or out (d % 32 == 0)
    float4 r = scaled4(v[k], s, wv[k]);
    if (ok && out) ((float4*)out)[j] = r;
    float amax = fmaxf(fmaxf(fabsf(r.x), fabsf(r.y)), fmaxf(fabsf(r.z), fabsf(r.w)));
    float sum = r.x + r.y + r.z + r.w;
    for (int m = 4; m > 0; m >>= 1) {  // the 8 lanes of the group
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
      sum += __shfl_xor_sync(0xffffffffu, sum, m);
    }
    float dq = amax / 127.f;
    if (ok) {
      char4 q = dq > 0.f ? make_char4(__float2int_rn(r.x / dq), __float2int_rn(r.y / dq),
                                      __float2int_rn(r.z / dq), __float2int_rn(r.w / dq))
                         : make_char4(0, 0, 0, 0);
      *(char4*)(xq + 4 * j) = q;
      if ((lane & 7) == 0) xs[j >> 3] = make_float2(dq, sum);
    }
  }
}

// rms_norm_v4 (rows 0..n-1, no acc) and its output quantized for the int8 GEMV, one launch
extern "C" __global__ void __launch_bounds__(1024) rms_norm_v4_q8(const float* __restrict__ x, int ldx,
                                          const float* __restrict__ w, float eps, int d,
                                          float* __restrict__ out, int ldo,
                                          signed char* __restrict__ xq, float2* __restrict__ xs) {
  ENTER();
  int i = blockIdx.x;
  norm_q8_v4(x + (size_t)i * ldx, w, eps, d, out + (size_t)i * ldo, xq + (size_t)i * d, xs + (size_t)i * (d >> 5));
}

// y = (x / rms * wn) . W for one row of x (f32, d = cols <= 4 * NV4 * 256): the wide GEMV
// (cuda_gemvw's gemvw) with the norm and x's quantizing in each block's prologue, into shared
// memory (cols int8, then cols / 32 (scale, sum)), where a launch of rms_norm_v4_q8 had been
// (its bits); the grid capped so that each block norms once
template <int T, int U>
__device__ __forceinline__ void gemvwn(const u8* __restrict__ W, long long rb, int rows, int cols,
                                       const float* __restrict__ x, const float* __restrict__ wn,
                                       float eps, float* __restrict__ y, int wpr) {
  extern __shared__ __align__(16) u8 xsm[];
  signed char* sq = (signed char*)xsm;
  float2* ss = (float2*)(xsm + cols);
  norm_q8_v4(x, wn, eps, cols, nullptr, sq, ss);
  __syncthreads();
  gemvw<T, 1, U, true>(W, rb, rows, cols, sq, ss, 1, y, 1, 0, wpr);
}
"""

NORM_GEMV_COLS = 4 * NV4 * 256  # the normed wide GEMV's widest x (its 256 threads' float4s)


def source() -> str:
    """This module's CUDA C (after :mod:`.cuda_gemvw`'s, whose ``gemvw`` the normed GEMV
    runs) with the normed wide GEMV's entry points, one a wide type."""
    entries = [
        f'extern "C" __global__ void __launch_bounds__(256, {WIDE_BLOCKS[1]}) gemvwn_{t}('
        "const u8* W, long long rb, int rows, int cols, const float* x, const float* wn, "
        f"float eps, float* y, int wpr) {{ enter_gemv(W, rb, rows, wpr); "
        f"gemvwn<{t}, {WIDE_UNROLL[t]}>(W, rb, rows, cols, x, wn, eps, y, wpr); }}"
        for t in WIDE_TYPES
    ]
    return SOURCE + "\n".join(entries) + "\n"


def names() -> list[str]:
    return ["rms_norm_v4", "rms_norm_v4_q8", *(f"gemvwn_{t}" for t in WIDE_TYPES)]


def threads(d: int) -> int | None:
    """Threads a block for a row of ``d`` floats, or None where the register norms do not
    take it (``d`` not a multiple of 32, or over 16,384)."""
    n4 = d // 4
    if d % 32 or n4 > NV4 * MAX_THREADS:
        return None
    return max(32, min(MAX_THREADS, (-(-n4 // NV4) + 31) // 32 * 32))  # NV4 float4s a thread


def aligned(*arrays_and_strides: int) -> bool:
    """Every pointer and row stride (bytes) a multiple of 16."""
    return all(v % 16 == 0 for v in arrays_and_strides)


def launch_normed(
    fn: dict[str, Any], p: Any, x: Any, wn: Any, eps: float, y: Any, sms: int, waves: int,
    wpr: int = 0, split_k: bool = True,
) -> None:  # fmt: skip
    """``y[0] = (x[0] / rms * wn) . p`` by ``gemvwn``: one row of x, normed and quantized in
    each block's prologue (no norm launch); warps a row by :func:`~.cuda_gemvw.split` (``wpr``
    > 0: that many; ``split_k`` False: one), the grid capped at ``waves`` resident waves of
    blocks (at least one: a block norms once, however many groups of rows it takes)."""
    w, blocks = grid(p, 1, sms, max(1, waves), wpr, split_k)
    head = (p.data, np.int64(p.row_bytes), np.int32(p.rows), np.int32(p.cols))
    args = (*head, x, wn, np.float32(eps), y, np.int32(w))
    fn[f"gemvwn_{p.code}"]((blocks,), (256,), args, shared_mem=p.cols + p.cols // 4)


def normed_wide(dev: Any, x: Any, n: int, wn: Any, eps: float, w: Any, y: Any) -> bool:
    """``y[:1] = (x[:1] / rms * wn) . w`` by :func:`launch_normed` a part, where the device
    takes it (``MODELC_CUDA_NORM_GEMV`` on, one row, every part on the wide GEMV's int8 path, a
    norm as wide as w and no wider than :data:`NORM_GEMV_COLS`, x and the norm 16-byte
    aligned): whether it did."""
    if not (dev.norm_gemv and n == 1 and dev.gemv_kind == "wide" and dev._use_q8(w, 1)):
        return False
    if int(wn.shape[0]) != w.cols or w.cols > NORM_GEMV_COLS:
        return False
    if not all(p.layout or p.code in WIDE_TYPES for p in w.parts):
        return False
    if not aligned(int(x.data.ptr), int(wn.data.ptr)):
        return False
    for p, yp in w.columns(y):
        launch_normed(dev.fn, p, x, wn, eps, yp, dev.sms, dev.waves, dev.wpr, dev.split_k)
    return True
