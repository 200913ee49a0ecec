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
// by the whole block (rms_norm_v4_q8's work)
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
"""


def source() -> str:
    """This module's CUDA C."""
    return SOURCE


def names() -> list[str]:
    return ["rms_norm_v4", "rms_norm_v4_q8"]


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
