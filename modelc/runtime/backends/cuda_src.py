"""CUDA C source of the CUDA backend's kernels, compiled at run time by NVRTC (through CuPy).

No headers: half <-> float goes through inline PTX, so NVRTC needs nothing beyond itself.
Weights stay in their GGUF blocks; ``deq32<T>`` unpacks one 32-weight group of a row (the
unit every kernel works in), with the float steps of :mod:`modelc.formats.quants` in the
same order (``d * q + m`` rounded twice, not fused), so dequantized values agree bit for
bit with the numpy reference and the CPU backend's ``exact`` mode.

Type codes (``T``): 0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 8 Q8_0, 12 Q4_K, 14 Q6_K (GGML's numbers);
the others' unpacking is in :mod:`.cuda_quants`.
"""

from __future__ import annotations

from modelc.runtime.backends import (
    cuda_argmax,
    cuda_attn,
    cuda_decode,
    cuda_deq,
    cuda_gemv,
    cuda_gemvp,
    cuda_gemvq,
    cuda_gemvw,
    cuda_norm,
    cuda_quants,
    cuda_sampler,
)

TYPES = (0, 1, 2, 3, 8, 12, 14, *cuda_quants.TYPES)
GEMV_ROWS = (1, 2, 4, 8, 16)  # activation rows one GEMV pass takes (NR)
HEAD_LANES = (1, 2, 3, 4, 8)  # head_dim / 32 that attention is built for
ATTN_WARPS = 8  # warps a (row, head) block of attention: WARPS in the source

SOURCE = r"""
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
#define INFINITY __int_as_float(0x7f800000)

// Programmatic dependent launch (cuda_launch, MODELC_CUDA_PDL): a kernel launched so may
// start while the one before it in the stream ends.  Every kernel begins with ENTER():
// wait for the kernels before to finish and their writes to be seen (before reading or
// writing anything), then let the next kernel launch (triggering before the wait was
// measured no faster, session 32); a no-op for a plain launch.  What a kernel does before
// ENTER() may only read weights (prefetch_l2).
#if __CUDA_ARCH__ >= 900
#define ENTER() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define ENTER()
#endif
// the first bytes (up to 64 KB) of [p, p + n) into L2, 128-byte lines over the block's threads:
// a GEMV's weight rows, fetched while the kernel before it ends
__device__ __forceinline__ void prefetch_l2(const u8* p, long long n) {
#if __CUDA_ARCH__ >= 900
  n = n < 65536 ? n : 65536;
  for (long long o = 128LL * threadIdx.x; o < n; o += 128LL * blockDim.x)
    asm volatile("prefetch.global.L2 [%0];" :: "l"(p + o));
#endif
}
// a GEMV's ENTER(): first the rows of W its block of 8 warps reads (8 / wpr rows from
// blockIdx.x * (8 / wpr)) into L2, while the kernel before it ends (prefetching the rows
// of the next waves' blocks too was slower on an H100, session 32)
__device__ __forceinline__ void enter_gemv(const u8* W, long long rb, int rows, int wpr) {
  int per = 8 >> (__ffs(wpr) - 1), r0 = blockIdx.x * per, n = rows - r0 < per ? rows - r0 : per;
  if (n > 0) prefetch_l2(W + (size_t)r0 * rb, rb * n);
  ENTER();
}

__device__ __forceinline__ float h2f(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ u16 f2h(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
// two floats as one f16 pair, lo in the low half (each rounded to nearest even, as f2h)
__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ u16 ld16(const u8* p) { return *(const u16*)p; }
__device__ __forceinline__ u32 ld32(const u8* p) { return *(const u32*)p; }
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// one 32-weight group g of a row -> w[32]
template <int T> __device__ __forceinline__ void deq32(const u8* __restrict__ row, int g, float* w);

__DEQ32__
// y[r, :] (+)= W x[r, :] for nr <= NR rows of x; one warp a weight row
template <int T, int NR>
__device__ __forceinline__ void gemv(const u8* __restrict__ W, long long rb, int rows, int cols,
                                     const float* __restrict__ x, int ldx, int nr,
                                     float* __restrict__ y, int ldy, int acc) {
  int row = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5);
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const u8* wr = W + (size_t)row * rb;
  float a[NR];
#pragma unroll
  for (int r = 0; r < NR; r++) a[r] = 0.f;
  int ng = cols >> 5;
  for (int g = lane; g < ng; g += 32) {
    float w[32];
    deq32<T>(wr, g, w);
#pragma unroll
    for (int r = 0; r < NR; r++) {
      if (r < nr) {
        const float4* xp = (const float4*)(x + (size_t)r * ldx + g * 32);
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
          float4 v = __ldg(xp + i);
          s += w[4*i] * v.x + w[4*i+1] * v.y + w[4*i+2] * v.z + w[4*i+3] * v.w;
        }
        a[r] += s;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < NR; r++) {
    float s = warp_sum(a[r]);
    if (lane == 0 && r < nr) {
      float* o = y + (size_t)r * ldy + row;
      *o = acc ? *o + s : s;
    }
  }
}

// rows of W (ids, or 0..n-1 when ids is null) dequantized to f32 (F16O=0) or f16 (F16O=1)
template <int T, int F16O>
__device__ __forceinline__ void deq_rows(const u8* __restrict__ W, long long rb, int cols,
                                         const i64* __restrict__ ids, int n, void* out, int ldo) {
  long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  int ng = cols >> 5;
  if (t >= (long long)n * ng) return;
  int i = (int)(t / ng), g = (int)(t % ng);
  long long src = ids ? ids[i] : i;
  float w[32];
  deq32<T>(W + (size_t)src * rb, g, w);
  if (F16O) {
    u16* o = (u16*)out + (size_t)i * ldo + g * 32;
#pragma unroll
    for (int k = 0; k < 32; k++) o[k] = f2h(w[k]);
  } else {
    float* o = (float*)out + (size_t)i * ldo + g * 32;
#pragma unroll
    for (int k = 0; k < 32; k++) o[k] = w[k];
  }
}

// every thread's s added up, for the whole block (once a kernel: its shared slots are
// not waited on again)
__device__ __forceinline__ double block_sum(double s) {
  __shared__ double part[32];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    double v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) part[0] = v;
  }
  __syncthreads();
  return part[0];
}

// 1 / rms of the row xr (d) for the whole block; sums in double as numpy
__device__ __forceinline__ float row_rms_scale(const float* __restrict__ xr, int d, float eps) {
  double s = 0.0;
  for (int j = threadIdx.x; j < d; j += blockDim.x) { double v = xr[j]; s += v * v; }
  return (float)(1.0 / sqrt(block_sum(s) / d + (double)eps));
}

// out[i] = x[rows[i]] / rms * w (rows null: i; acc: out[i] +=); one block a row
extern "C" __global__ void rms_norm(const float* __restrict__ x, int ldx, const i64* __restrict__ rows,
                                    const float* __restrict__ w, float eps, int d,
                                    float* __restrict__ out, int ldo, int acc) {
  ENTER();
  int i = blockIdx.x;
  const float* xr = x + (size_t)(rows ? rows[i] : i) * ldx;
  float scale = row_rms_scale(xr, d, eps);
  float* o = out + (size_t)i * ldo;
  if (acc) for (int j = threadIdx.x; j < d; j += blockDim.x) o[j] += xr[j] * scale * w[j];
  else for (int j = threadIdx.x; j < d; j += blockDim.x) o[j] = xr[j] * scale * w[j];
}

// each head of q and k in the rows of qkv (n, (nh + 2 nkv) hd) / rms * qn or kn, in place
// (qwen3, gemma3: before RoPE); grid (n, nh + nkv), one warp a head
extern "C" __global__ void head_norm(float* __restrict__ qkv, int width, int nh, int hd,
                                     const float* __restrict__ qn, const float* __restrict__ kn,
                                     float eps) {
  ENTER();
  int h = blockIdx.y;
  float* r = qkv + (size_t)blockIdx.x * width + (size_t)h * hd;
  const float* w = h < nh ? qn : kn;
  double s = 0.0;
  for (int j = threadIdx.x; j < hd; j += 32) { double v = r[j]; s += v * v; }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  float scale = (float)(1.0 / sqrt(s / hd + (double)eps));
  for (int j = threadIdx.x; j < hd; j += 32) r[j] = r[j] * scale * w[j];
}

// x[t] *= s (gemma's embedding scale); x[t] = c * tanh(x[t] / c) (gemma2's logit cap)
extern "C" __global__ void scale_f32(float* __restrict__ x, long long total, float s) {
  ENTER();
  long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (t < total) x[t] *= s;
}
extern "C" __global__ void softcap_f32(float* __restrict__ x, long long total, float c) {
  ENTER();
  long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (t < total) x[t] = tanhf(x[t] / c) * c;
}

// silu(g) * u and gelu_tanh(g) * u (gemma)
__device__ __forceinline__ float silu_of(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__device__ __forceinline__ float gelu_of(float g, float u) {
  return 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g))) * u;
}

// silu (or gelu_tanh)(gu[:, :ff]) * gu[:, ff:] -> out (n, ff)
template <int GELU>
__device__ __forceinline__ void act_mul(const float* __restrict__ gu, int ff, long long total,
                                        float* __restrict__ out) {
  long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (t >= total) return;
  long long i = t / ff, j = t % ff;
  float g = gu[i * 2 * ff + j], u = gu[i * 2 * ff + ff + j];
  out[t] = GELU ? gelu_of(g, u) : silu_of(g, u);
}
extern "C" __global__ void silu_mul(const float* gu, int ff, long long total, float* out) {
  ENTER();
  act_mul<0>(gu, ff, total, out);
}
extern "C" __global__ void gelu_mul(const float* gu, int ff, long long total, float* out) {
  ENTER();
  act_mul<1>(gu, ff, total, out);
}

// RoPE on q and k of each row of qkv (n, (nh + 2 nkv) hd) (+ bias), q -> qo (n, nh hd);
// k and v -> the row's sequence cache at its position.  meta: pos (n), seq (n), base (S), cap (S)
template <typename KV>
__device__ __forceinline__ void store_kv(KV* p, float v);
template <> __device__ __forceinline__ void store_kv<float>(float* p, float v) { *p = v; }
template <> __device__ __forceinline__ void store_kv<u16>(u16* p, float v) { *p = f2h(v); }
template <typename KV>
__device__ __forceinline__ float load_kv(const KV* p);
template <> __device__ __forceinline__ float load_kv<float>(const float* p) { return *p; }
template <> __device__ __forceinline__ float load_kv<u16>(const u16* p) { return h2f(*p); }

// RoPE's rotation of the pair (x0, x1) at position p, frequency f: (y0, y1); sincosf within
// 2 ulp (the CPU rounds double cos/sin of the same angle)
__device__ __forceinline__ float2 rope_rot(float x0, float x1, long long p, float f, float ms = 1.f) {
  float cs, sn;
  sincosf((float)p * f, &sn, &cs);
  if (ms != 1.f) { cs *= ms; sn *= ms; }  // the CPU's scaled tables (YaRN / LongRoPE: rope_store's ms)
  return make_float2(x0 * cs - x1 * sn, x0 * sn + x1 * cs);
}

// rot: the rotated dimensions of a head (hd, or fewer: partial RoPE, the rest as they are);
// ms: the rotation's magnitude (YaRN / LongRoPE's cos and sin factor where the scores cannot
// take it: 1 else)
template <typename KV>
__device__ __forceinline__ void rope_store(const float* __restrict__ qkv, const float* __restrict__ bias,
    const i64* __restrict__ pos, const i64* __restrict__ seq, const i64* __restrict__ base,
    const i64* __restrict__ cap, const float* __restrict__ inv_freq, int nh, int nkv, int hd,
    int neox, int layer, float* __restrict__ qo, int rot, float ms) {
  int i = blockIdx.x;
  int width = (nh + 2 * nkv) * hd, slots = hd / 2, half = rot / 2;
  const float* r = qkv + (size_t)i * width;
  long long p = pos[i], s = seq[i], c = cap[s];
  KV* kc = (KV*)base[s] + ((size_t)layer * 2 * c + p) * nkv * hd;
  KV* vc = kc + (size_t)c * nkv * hd;
  int t0 = blockIdx.y * blockDim.x + threadIdx.x, step = gridDim.y * blockDim.x;
  for (int t = t0; t < (nh + nkv) * slots; t += step) {
    int h = t / slots, j = t % slots;
    // a pair a slot: rotated (j < half), else two dimensions past rot as they are
    int a = j >= half ? rot + 2 * (j - half) : neox ? j : 2 * j;
    int b = j >= half ? a + 1 : neox ? j + half : 2 * j + 1;
    float x0 = r[h * hd + a], x1 = r[h * hd + b];
    if (bias) { x0 += bias[h * hd + a]; x1 += bias[h * hd + b]; }
    float2 y = j < half ? rope_rot(x0, x1, p, inv_freq[j], ms) : make_float2(x0, x1);
    if (h < nh) { qo[(size_t)i * nh * hd + h * hd + a] = y.x; qo[(size_t)i * nh * hd + h * hd + b] = y.y; }
    else { int k = h - nh; store_kv<KV>(kc + k * hd + a, y.x); store_kv<KV>(kc + k * hd + b, y.y); }
  }
  for (int t = t0; t < nkv * hd; t += step) {
    float v = r[(nh + nkv) * hd + t];
    if (bias) v += bias[(nh + nkv) * hd + t];
    store_kv<KV>(vc + t, v);
  }
}
extern "C" __global__ void rope_store_f32(const float* qkv, const float* bias, const i64* pos, const i64* seq,
    const i64* base, const i64* cap, const float* inv_freq, int nh, int nkv, int hd, int neox, int layer, float* qo,
    int rot, float ms) {
  ENTER();
  rope_store<float>(qkv, bias, pos, seq, base, cap, inv_freq, nh, nkv, hd, neox, layer, qo, rot, ms);
}
extern "C" __global__ void rope_store_f16(const float* qkv, const float* bias, const i64* pos, const i64* seq,
    const i64* base, const i64* cap, const float* inv_freq, int nh, int nkv, int hd, int neox, int layer, float* qo,
    int rot, float ms) {
  ENTER();
  rope_store<u16>(qkv, bias, pos, seq, base, cap, inv_freq, nh, nkv, hd, neox, layer, qo, rot, ms);
}

// E values v of a lane, 32 / E lanes a group of 32 (E = 1, 2, 4, 8), to 8 bits: q[0..E),
// and the group's (scale amax / 127, float sum) to *s by its first lane (the int8 GEMV's x)
template <int E>
__device__ __forceinline__ void quant_lanes(const float* v, int lane, signed char* __restrict__ q,
                                            float2* __restrict__ s) {
  float amax = 0.f, sum = 0.f;
#pragma unroll
  for (int e = 0; e < E; e++) { amax = fmaxf(amax, fabsf(v[e])); sum += v[e]; }
  for (int o = 16 / E; o > 0; o >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  float d = amax / 127.f;
#pragma unroll
  for (int e = 0; e < E; e++) q[e] = (signed char)(d > 0.f ? __float2int_rn(v[e] / d) : 0);
  if ((lane * E) % 32 == 0) *s = make_float2(d, sum);
}

__DECODE_ATTN__
__TEMPLATE_INSTANCES__
"""


def _instances() -> str:
    out = []
    for t in TYPES:
        for nr in GEMV_ROWS:
            out.append(
                f'extern "C" __global__ void gemv_{t}_{nr}(const u8* W, long long rb, int rows, '
                "int cols, const float* x, int ldx, int nr, float* y, int ldy, int acc) "
                f"{{ ENTER(); gemv<{t}, {nr}>(W, rb, rows, cols, x, ldx, nr, y, ldy, acc); }}"
            )
        for f16 in (0, 1):
            out.append(
                f'extern "C" __global__ void deq_{t}_{f16}(const u8* W, long long rb, int cols, '
                "const i64* ids, int n, void* out, int ldo) "
                f"{{ ENTER(); deq_rows<{t}, {f16}>(W, rb, cols, ids, n, out, ldo); }}"
            )
    out.append(
        cuda_attn.kv_instances(
            "attn",
            "attend",
            HEAD_LANES,
            "const float* q, const i64* pos, const i64* seq, const i64* base, const i64* cap, "
            "int nh, int nkv, float scale, int window, float softcap, int layer, float* out, "
            "signed char* xq, float2* xs, float* part, unsigned* count, const float* qkv, "
            "const float* bias, const float* inv_freq, int neox, const float* sinks",
            "q, pos, seq, base, cap, nh, nkv, scale, window, softcap, layer, out, xq, xs, part, "
            "count, qkv, bias, inv_freq, neox, sinks",
        )
    )
    return "\n".join(out)


def kernel_names() -> list[str]:
    """Every ``extern "C"`` kernel of :func:`source`."""
    names = [
        *cuda_gemv.names(TYPES),
        "rms_norm",
        "head_norm",
        "scale_f32",
        "softcap_f32",
        "silu_mul",
        "gelu_mul",
        "rope_store_f32",
        "rope_store_f16",
    ]
    names += [f"gemv_{t}_{nr}" for t in TYPES for nr in GEMV_ROWS]
    names += [f"deq_{t}_{f}" for t in TYPES for f in (0, 1)]
    names += cuda_attn.kv_names("attn", HEAD_LANES)
    names += cuda_attn.names()
    names += cuda_deq.names(TYPES) + cuda_gemvq.names() + cuda_gemvw.names()
    names += cuda_gemvp.names()
    return names + cuda_norm.names() + cuda_sampler.NAMES + cuda_argmax.NAMES


def source() -> str:
    body = SOURCE.replace("__DEQ32__", cuda_quants.DEQ32)
    body = body.replace("__TEMPLATE_INSTANCES__", _instances())
    body = body.replace("__DECODE_ATTN__", cuda_decode.DECODE)
    body = body.replace("__ATTN_WARPS__", str(ATTN_WARPS))
    gemv = cuda_gemv.SOURCE.replace("__DEQ4__", cuda_quants.DEQ4)
    deq = cuda_deq.SOURCE + cuda_deq.instances(TYPES)
    gemvq = cuda_gemvq.SOURCE + cuda_gemvq.KERNELS + cuda_gemvq.instances() + cuda_gemvw.source()
    gemvq += cuda_gemvp.source()
    attn = cuda_attn.source()
    tail = cuda_norm.source() + cuda_sampler.SOURCE + cuda_argmax.SOURCE
    return body + attn + gemv + cuda_gemv.instances(TYPES) + deq + gemvq + tail
