"""Decode attention of the CUDA backend (CUDA C, placed in :mod:`.cuda_src`'s source where
its helpers are): a query row at a time over its sequence's cache, a block a row and head
(8 warps, each an online softmax over every 8th position), optionally split over runs of
the positions (flash-decoding, ``MODELC_CUDA_ATTN_SPLIT=S``), optionally rotating q and
storing the row's key and value itself (``MODELC_CUDA_ROPE_ATTN=1``: a decode step's RoPE
and KV store without the rope_store launch); with a head's sink (gpt-oss) in the softmax's
denominator where ``sinks`` is not null."""

from __future__ import annotations

from typing import Any

import numpy as np

# decode attention (a query row at a time over its sequence's cache), in cuda_src's source
# where its helpers are (quant_lanes, load_kv, warp_sum): __ATTN_WARPS__ replaced there
DECODE = r"""
// causal attention of query row i (at pos[i]) and head h over its sequence's cache;
// each warp an online softmax over every WARPS-th position, two positions an iteration
// (their keys' and values' loads in flight together), then the warps combine.  Split
// (gridDim.z = S > 1: flash-decoding): block z takes the z-th of S runs of the positions and
// leaves its (max, sum, unnormalized output) in part; the last of the S blocks to finish
// (count: an atomic a row and head, reset by it) merges them.
#define WARPS __ATTN_WARPS__
template <int E>
__device__ __forceinline__ void attn_out(const float* o, float L, int lane, size_t at, float* __restrict__ out,
                                         signed char* __restrict__ xq, float2* __restrict__ xs) {
  float r[E];
#pragma unroll
  for (int e = 0; e < E; e++) { r[e] = o[e] / L; out[at + e] = r[e]; }
  if constexpr (32 % E == 0) {  // xq: the output quantized for the next product too
    if (xq) quant_lanes<E>(r, lane, xq + at, xs + at / 32);
  }
}
// n runs' (max m, sum l, unnormalized output o: E values a lane) merged into (M, L, out), run k's
// at m[k ms], l[k ms], o[k os + lane E + e]; runs with m -inf (no positions, or all masked)
// skipped: the warps of a block, then (split) the blocks of a row and head
template <int E>
__device__ __forceinline__ void merge_runs(const volatile float* m, const volatile float* l,
                                           const volatile float* o, int n, int ms, int os, int lane,
                                           float& M, float& L, float* out) {
  M = -INFINITY;
  L = 0.f;
  for (int k = 0; k < n; k++) M = fmaxf(M, m[k * ms]);
#pragma unroll
  for (int e = 0; e < E; e++) out[e] = 0.f;
  for (int k = 0; k < n; k++) {
    float mk = m[k * ms];
    if (mk == -INFINITY) continue;
    float f = expf(mk - M);
    L += l[k * ms] * f;
#pragma unroll
    for (int e = 0; e < E; e++) out[e] += o[k * os + lane * E + e] * f;
  }
}
// the softmax's denominator L (over scores of max M) with head h's sink, a logit without a
// value (gpt-oss: a last column in the denominator only), where sinks is not null
__device__ __forceinline__ float sink_sum(const float* __restrict__ sinks, int h, float M, float L) {
  return sinks ? L + expf(sinks[h] - M) : L;
}
// RoPE of one head's values a lane holds (E: lane l's are l E .. l E + E - 1 of the head's raw
// values hr, + hb where not null) at position p, by rope_store's rope_rot: neox pairs j and
// j + hd / 2 (lanes l and l ^ 16), else 2j and 2j + 1 (within a lane: E even)
template <int E>
__device__ __forceinline__ void rope_lane(const float* hr, const float* hb, long long p,
                                          const float* __restrict__ inv_freq, int neox, int lane, float* out) {
  float x[E];
#pragma unroll
  for (int e = 0; e < E; e++) x[e] = hb ? hr[lane * E + e] + hb[lane * E + e] : hr[lane * E + e];
  if (neox) {
#pragma unroll
    for (int e = 0; e < E; e++) {
      float o = __shfl_xor_sync(0xffffffffu, x[e], 16), f = inv_freq[(lane & 15) * E + e];
      bool lo = lane < 16;  // the pair's first (j) or its second (j + hd / 2)
      float2 y = rope_rot(lo ? x[e] : o, lo ? o : x[e], p, f);
      out[e] = lo ? y.x : y.y;
    }
  } else if constexpr (E % 2 == 0) {
#pragma unroll
    for (int e = 0; e < E; e += 2) {
      float2 y = rope_rot(x[e], x[e + 1], p, inv_freq[(lane * E + e) / 2]);
      out[e] = y.x;
      out[e + 1] = y.y;
    }
  }
}

template <typename KV, int E>
__device__ __forceinline__ void attend(const float* __restrict__ q, const i64* __restrict__ pos,
    const i64* __restrict__ seq, const i64* __restrict__ base, const i64* __restrict__ cap,
    int nh, int nkv, float scale, int window, float softcap, int layer, float* __restrict__ out,
    signed char* __restrict__ xq, float2* __restrict__ xs, float* __restrict__ part,
    unsigned* __restrict__ count, const float* __restrict__ qkv, const float* __restrict__ bias,
    const float* __restrict__ inv_freq, int neox, const float* __restrict__ sinks) {
  int i = blockIdx.x, h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int hd = 32 * E;
  long long p = pos[i], s = seq[i], c = cap[s];
  int kh = h / (nh / nkv);
  const KV* kc = (const KV*)base[s] + (size_t)layer * 2 * c * nkv * hd + kh * hd + lane * E;
  const KV* vc = kc + (size_t)c * nkv * hd;
  float qv[E], acc[E];
  if (qkv) {  // rope_store's work here (a decode step: one row a sequence): q rotated, and
    // the row's key (rotated) and value stored at p by warp 0 before any warp reads them
    // (every block of the kv head stores the same bits)
    const float* r = qkv + (size_t)i * (nh + 2 * nkv) * hd;
    float kr[E];
    rope_lane<E>(r + h * hd, bias ? bias + h * hd : nullptr, p, inv_freq, neox, lane, qv);
    if (warp == 0) {
      int ko = (nh + kh) * hd, vo = (nh + nkv + kh) * hd;
      rope_lane<E>(r + ko, bias ? bias + ko : nullptr, p, inv_freq, neox, lane, kr);
      KV* kw = (KV*)kc + (size_t)p * nkv * hd;
      KV* vw = (KV*)vc + (size_t)p * nkv * hd;
#pragma unroll
      for (int e = 0; e < E; e++) {
        store_kv<KV>(kw + e, kr[e]);
        store_kv<KV>(vw + e, bias ? r[vo + lane * E + e] + bias[vo + lane * E + e] : r[vo + lane * E + e]);
      }
    }
    __syncthreads();
  } else {
    const float* qr = q + ((size_t)i * nh + h) * hd + lane * E;
#pragma unroll
    for (int e = 0; e < E; e++) qv[e] = qr[e];
  }
#pragma unroll
  for (int e = 0; e < E; e++) { qv[e] *= scale; acc[e] = 0.f; }
  float m = -INFINITY, l = 0.f;
  long long lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0, hi = p;
  int S = gridDim.z;
  if (S > 1) {  // this block's run of the positions
    long long run = (p - lo + S) / S;
    lo += blockIdx.z * run;
    hi = lo + run - 1 < p ? lo + run - 1 : p;
  }
  for (long long t = lo + warp; t <= hi; t += 2 * WARPS) {
    long long t2 = t + WARPS;
    bool two = t2 <= hi;
    const KV* kr = kc + (size_t)t * nkv * hd;
    const KV* kr2 = kc + (size_t)(two ? t2 : t) * nkv * hd;
    const KV* vr = vc + (size_t)t * nkv * hd;
    const KV* vr2 = vc + (size_t)(two ? t2 : t) * nkv * hd;
    float k1[E], k2[E], v1[E], v2[E], d = 0.f, d2 = 0.f;
#pragma unroll
    for (int e = 0; e < E; e++) {  // keys and values in flight together: one wait an iteration
      k1[e] = load_kv<KV>(kr + e); k2[e] = load_kv<KV>(kr2 + e);
      v1[e] = load_kv<KV>(vr + e); v2[e] = load_kv<KV>(vr2 + e);
    }
#pragma unroll
    for (int e = 0; e < E; e++) { d += qv[e] * k1[e]; d2 += qv[e] * k2[e]; }
    d = warp_sum(d);
    d2 = warp_sum(d2);
    if (softcap > 0.f) {  // gemma2: the score capped
      d = tanhf(d / softcap) * softcap;
      d2 = tanhf(d2 / softcap) * softcap;
    }
    float mn = fmaxf(m, two ? fmaxf(d, d2) : d);
    float corr = expf(m - mn), pw = expf(d - mn), pw2 = two ? expf(d2 - mn) : 0.f;
    l = l * corr + pw + pw2;
#pragma unroll
    for (int e = 0; e < E; e++) acc[e] = acc[e] * corr + pw * v1[e] + pw2 * v2[e];
    m = mn;
  }
  __shared__ float sm[WARPS], sl[WARPS], sacc[WARPS][32 * E];
  if (lane == 0) { sm[warp] = m; sl[warp] = l; }
#pragma unroll
  for (int e = 0; e < E; e++) sacc[warp][lane * E + e] = acc[e];
  __syncthreads();
  size_t at = ((size_t)i * nh + h) * hd + lane * E;
  float M, L, o[E];
  if (warp == 0) {
    merge_runs<E>(sm, sl, &sacc[0][0], WARPS, 1, 32 * E, lane, M, L, o);  // the warps'
    if (S > 1) {
      float* pp = part + (((size_t)i * nh + h) * S + blockIdx.z) * (hd + 2);
      if (lane == 0) { pp[0] = M; pp[1] = L; }
#pragma unroll
      for (int e = 0; e < E; e++) pp[2 + lane * E + e] = o[e];
      __threadfence();  // this block's part visible before it is counted
    }
  }
  if (S == 1) {  // the whole block returns together (no barrier after)
    if (warp == 0) attn_out<E>(o, sink_sum(sinks, h, M, L), lane, at, out, xq, xs);
    return;
  }
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(count + (size_t)i * nh + h, 1u) == (unsigned)(S - 1);
  __syncthreads();
  if (!last || warp != 0) return;
  __threadfence();
  const volatile float* pr = part + ((size_t)i * nh + h) * S * (hd + 2);
  merge_runs<E>(pr, pr + 1, pr + 2, S, hd + 2, hd + 2, lane, M, L, o);  // the blocks' runs
  attn_out<E>(o, sink_sum(sinks, h, M, L), lane, at, out, xq, xs);
  if (lane == 0) count[(size_t)i * nh + h] = 0;  // for the next launch
}
"""


def split_args(scratch: Any, n: int, nh: int, hd: int, s: int) -> tuple[Any, Any]:
    """The split decode attention's (flash-decoding, ``MODELC_CUDA_ATTN_SPLIT=S``; 1: one
    block a row and head) ``part`` and ``count`` for n rows of nh heads of hd in s runs:
    the runs' parts (max, sum, unnormalized output) and an atomic count a (row, head), in
    ``scratch``'s buffers; null pointers when s is 1."""
    if s <= 1:
        return np.uint64(0), np.uint64(0)
    units = n * nh
    part = scratch.get("attn_part", units * s * (hd + 2), np.float32, least=1024 * s * (hd + 2))
    return part, scratch.get("attn_count", units, np.uint32, zero=True, least=1024)
