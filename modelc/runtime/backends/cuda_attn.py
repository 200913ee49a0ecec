"""Prompt attention of the CUDA backend in tiles (CUDA C, appended to :mod:`.cuda_src`).

``attend`` (in :mod:`.cuda_src`) gives each (query row, head) a block that reads every key
of its sequence from the cache: a prompt of n tokens reads its keys n times over, and a
2,048-token prefill spent most of its time there (an H100: 15k tok/s against llama.cpp's
41k).  Here a block takes a tile of up to :data:`ROWS` consecutive rows of one
sequence's chunk and one head: each 32-key piece of the cache is read once into shared
memory (as f32) and used by every row of the tile, lane ``t`` scoring key ``t`` against
the tile's queries (kept in shared memory, scaled), then an online softmax a row
(FlashAttention's) and each lane accumulating the values of dimensions ``lane + 32 e``.
Causal within the chunk, sliding windows, soft-capped scores and sinks as ``attend``.

Tiles come from the host as (first row, rows) pairs (:func:`tiles`), so a step mixing
prompt chunks and decode rows runs in one launch (a decode row is a tile of one).  Head
sizes 32, 64, 96 and 128 (the shared arrays of 256 do not fit in 48 KB: ``attend`` takes
those).

``attend_mma`` is the same walk on tensor cores, for f16 caches (the default): tiles of
:data:`MMA_ROWS` rows, four warps of 16 rows, ``mma.sync`` m16n8k16 (f16 in, f32 sums) for
the scores ``Q K^T`` and for ``P V``; each 32-key piece of the cache copied once into
shared memory (keys as they are, values transposed, rows padded against bank clashes),
the online softmax on the score fragments in registers (FlashAttention-2's: the score
fragment of a 16 x 16 piece is the A fragment of the next product, so P never leaves
registers).  The queries (scaled) and P are rounded to f16 as llama.cpp's and
FlashAttention's kernels round them; ``MODELC_CUDA_ATTN_MMA=0`` takes the float tiles.
"""

from __future__ import annotations

import numpy as np

ROWS = 16  # query rows a tile (two a warp)
MMA_ROWS = 64  # query rows a tile of attend_mma (16 a warp, four warps)
MMA_KEYS = 32  # keys a piece of attend_mma's walk
TILE_LANES = (1, 2, 3, 4)  # head_dim / 32 the tiled kernel is built for

SOURCE = r"""
// a tile of rows r0 .. r0 + cnt - 1 (one sequence's chunk, consecutive positions) and head
// h; tiles: (r0, cnt) pairs; 8 warps, rows warp and warp + 8
template <typename KV, int E>
__device__ __forceinline__ void attend_tile(const float* __restrict__ q, const i64* __restrict__ pos,
    const i64* __restrict__ seq, const i64* __restrict__ base, const i64* __restrict__ cap,
    const i64* __restrict__ tiles, int nh, int nkv, float scale, int window, float softcap,
    int layer, float* __restrict__ out, const float* __restrict__ sinks) {
  const int hd = 32 * E;
  __shared__ float ks[32][32 * E + 1];  // +1: lane t reads row t, column d, no bank clashes
  __shared__ float vs[32][32 * E];
  __shared__ float qs[16][32 * E];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, h = blockIdx.y;
  long long r0 = tiles[2 * blockIdx.x], cnt = tiles[2 * blockIdx.x + 1];
  long long s = seq[r0], c = cap[s];
  int kh = h / (nh / nkv);
  const KV* kc = (const KV*)base[s] + (size_t)layer * 2 * c * nkv * hd + kh * hd;
  const KV* vc = kc + (size_t)c * nkv * hd;
  for (int i = threadIdx.x; i < 16 * hd; i += blockDim.x) {
    int r = i / hd, d = i % hd;
    qs[r][d] = r < cnt ? q[((size_t)(r0 + r) * nh + h) * hd + d] * scale : 0.f;
  }
  long long first = pos[r0], last = pos[r0 + cnt - 1];
  long long lo = window > 0 && first - window + 1 > 0 ? first - window + 1 : 0;
  float m[2], l[2], o[2][E];
  long long p[2];
#pragma unroll
  for (int j = 0; j < 2; j++) {
    m[j] = -INFINITY; l[j] = 0.f;
    p[j] = warp + 8 * j < cnt ? pos[r0 + warp + 8 * j] : -1;
#pragma unroll
    for (int e = 0; e < E; e++) o[j][e] = 0.f;
  }
  for (long long t0 = lo - lo % 32; t0 <= last; t0 += 32) {
    __syncthreads();  // the last piece's readers are done (and qs written, the first time)
    for (int i = threadIdx.x; i < 32 * hd; i += blockDim.x) {
      int t = i / hd, d = i % hd;
      bool in = t0 + t <= last;
      size_t at = (size_t)(t0 + t) * nkv * hd + d;
      ks[t][d] = in ? load_kv<KV>(kc + at) : 0.f;
      vs[t][d] = in ? load_kv<KV>(vc + at) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 2; j++) {
      long long pj = p[j], t = t0 + lane;
      if (pj < t0 || (window > 0 && t0 + 31 <= pj - window)) continue;  // whole warp alike
      bool ok = t <= pj && (window <= 0 || t > pj - window);
      const float* qr = qs[warp + 8 * j];
      float sc = 0.f;
#pragma unroll 8
      for (int d = 0; d < hd; d++) sc += qr[d] * ks[lane][d];
      if (softcap > 0.f) sc = tanhf(sc / softcap) * softcap;  // gemma2: the score capped
      sc = ok ? sc : -INFINITY;
      float mt = warp_max(sc);
      if (mt == -INFINITY) continue;
      float mn = fmaxf(m[j], mt);
      float corr = expf(m[j] - mn), pw = ok ? expf(sc - mn) : 0.f;
      l[j] = l[j] * corr + warp_sum(pw);
#pragma unroll
      for (int e = 0; e < E; e++) o[j][e] *= corr;
      for (int u = 0; u < 32; u++) {
        float pu = __shfl_sync(0xffffffffu, pw, u);
#pragma unroll
        for (int e = 0; e < E; e++) o[j][e] += pu * vs[u][e * 32 + lane];
      }
      m[j] = mn;
    }
  }
#pragma unroll
  for (int j = 0; j < 2; j++) {
    if (p[j] < 0) continue;
    float* orow = out + ((size_t)(r0 + warp + 8 * j) * nh + h) * hd;
    float lj = sinks ? l[j] + expf(sinks[h] - m[j]) : l[j];  // gpt-oss: the head's sink
#pragma unroll
    for (int e = 0; e < E; e++) orow[e * 32 + lane] = o[j][e] / lj;
  }
}
// tensor cores: D = A (16 x 16, f16, rows) . B (16 x 8, f16, columns) + D, in f32
__device__ __forceinline__ void mma16816(float* d, const u32* a, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// a tile of rows r0 .. r0 + cnt - 1 (cnt <= 64; one sequence's chunk, consecutive
// positions) and head h on tensor cores, f16 cache; 4 warps, warp w rows 16w .. 16w + 15.
// Fragments (PTX's m16n8k16): g = lane / 4, t = lane % 4; A: rows g, g + 8, columns 2t,
// 2t + 1, 2t + 8, 2t + 9; B: rows (k) 2t, 2t + 1, 2t + 8, 2t + 9 of column g; C: rows g,
// g + 8, columns 2t, 2t + 1.
template <int E>
__device__ __forceinline__ void attend_mma(const float* __restrict__ q, const i64* __restrict__ pos,
    const i64* __restrict__ seq, const i64* __restrict__ base, const i64* __restrict__ cap,
    const i64* __restrict__ tiles, int nh, int nkv, float scale, int window, float softcap,
    int layer, float* __restrict__ out, const float* __restrict__ sinks) {
  constexpr int HD = 32 * E, KS = HD / 16, ND = HD / 8, NK = __MMA_KEYS__, NT = NK / 8;
  constexpr int KST = HD + 8, VST = NK + 8;  // padded rows: a fragment's 8 rows in 8 bank sets
  __shared__ __align__(16) u16 ks[NK * KST];  // keys (key, dim)
  __shared__ __align__(16) u16 vt[HD * VST];  // values transposed (dim, key)
  const float LOG2E = 1.4426950408889634f;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  int h = blockIdx.y;
  long long r0 = tiles[2 * blockIdx.x], cnt = tiles[2 * blockIdx.x + 1];
  long long s = seq[r0], c = cap[s];
  int kh = h / (nh / nkv);
  const u16* kc = (const u16*)base[s] + (size_t)layer * 2 * c * nkv * HD + kh * HD;
  const u16* vc = kc + (size_t)c * nkv * HD;
  long long first = pos[r0], last = pos[r0 + cnt - 1];
  long long lo = window > 0 && first - window + 1 > 0 ? first - window + 1 : 0;
  int w0 = 16 * warp;
  bool live = w0 < cnt;
  bool va = w0 + g < cnt, vb = w0 + g + 8 < cnt;
  long long pa = va ? pos[r0 + w0 + g] : -1, pb = vb ? pos[r0 + w0 + g + 8] : -1;
  long long wfirst = live ? pos[r0 + w0] : 0;
  long long wlast = live ? pos[r0 + (w0 + 15 < cnt ? w0 + 15 : cnt - 1)] : -1;
  u32 qa[KS][4];  // the warp's queries, scaled, as A fragments
  {
    const float* qra = q + ((size_t)(r0 + w0 + g) * nh + h) * HD;
    const float* qrb = q + ((size_t)(r0 + w0 + g + 8) * nh + h) * HD;
    const float2 z = make_float2(0.f, 0.f);
#pragma unroll
    for (int k = 0; k < KS; k++) {
      int d = 16 * k + 2 * t;
      float2 a0 = va ? *(const float2*)(qra + d) : z, a2 = va ? *(const float2*)(qra + d + 8) : z;
      float2 b0 = vb ? *(const float2*)(qrb + d) : z, b2 = vb ? *(const float2*)(qrb + d + 8) : z;
      qa[k][0] = pack_h2(a0.x * scale, a0.y * scale);
      qa[k][1] = pack_h2(b0.x * scale, b0.y * scale);
      qa[k][2] = pack_h2(a2.x * scale, a2.y * scale);
      qa[k][3] = pack_h2(b2.x * scale, b2.y * scale);
    }
  }
  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  for (long long t0 = lo - lo % NK; t0 <= last; t0 += NK) {
    __syncthreads();  // the last piece's readers are done
    for (int i = threadIdx.x; i < NK * HD / 8; i += blockDim.x) {
      int kk = i % NK, d8 = (i / NK) * 8;  // key fastest: both stores free of bank clashes
      uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
      if (t0 + kk <= last) {
        size_t at = (size_t)(t0 + kk) * nkv * HD + d8;
        kv = *(const uint4*)(kc + at);
        vv = *(const uint4*)(vc + at);
      }
      *(uint4*)(ks + kk * KST + d8) = kv;
      const u32 vw[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
      for (int j = 0; j < 4; j++) {
        vt[(d8 + 2 * j) * VST + kk] = (u16)(vw[j] & 0xffffu);
        vt[(d8 + 2 * j + 1) * VST + kk] = (u16)(vw[j] >> 16);
      }
    }
    __syncthreads();
    if (!live || t0 > wlast || (window > 0 && t0 + NK - 1 <= wfirst - window)) continue;
    float sc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) {
      sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
      const u16* kr = ks + (8 * n + g) * KST + 2 * t;
#pragma unroll
      for (int k = 0; k < KS; k++)
        mma16816(sc[n], qa[k], *(const u32*)(kr + 16 * k), *(const u32*)(kr + 16 * k + 8));
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < NT; n++) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        long long key = t0 + 8 * n + 2 * t + (i & 1), p = i < 2 ? pa : pb;
        float v = sc[n][i];
        if (softcap > 0.f) v = tanhf(v / softcap) * softcap;  // gemma2: the score capped
        bool ok = key <= p && (window <= 0 || key > p - window);
        v = ok ? v * LOG2E : -INFINITY;
        sc[n][i] = v;
        mx[i >> 1] = fmaxf(mx[i >> 1], v);
      }
    }
    float mu[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {  // the four lanes of a row: its max, then the rescaling
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      float mn = fmaxf(m[r], mx[r]);
      mu[r] = mn == -INFINITY ? 0.f : mn;
      float corr = exp2f(m[r] - mu[r]);
      l[r] *= corr;
#pragma unroll
      for (int n = 0; n < ND; n++) { o[n][2 * r] *= corr; o[n][2 * r + 1] *= corr; }
      m[r] = mn;
    }
#pragma unroll
    for (int n = 0; n < NT; n++) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        float pv = exp2f(sc[n][i] - mu[i >> 1]);
        sc[n][i] = pv;
        l[i >> 1] += pv;
      }
    }
#pragma unroll
    for (int k = 0; k < NT / 2; k++) {  // keys 16k .. 16k + 15: P's A fragment from S's C
      u32 pa4[4] = {pack_h2(sc[2 * k][0], sc[2 * k][1]), pack_h2(sc[2 * k][2], sc[2 * k][3]),
                    pack_h2(sc[2 * k + 1][0], sc[2 * k + 1][1]),
                    pack_h2(sc[2 * k + 1][2], sc[2 * k + 1][3])};
#pragma unroll
      for (int n = 0; n < ND; n++) {
        const u16* vr = vt + (8 * n + g) * VST + 16 * k + 2 * t;
        mma16816(o[n], pa4, *(const u32*)vr, *(const u32*)(vr + 8));
      }
    }
  }
  if (!live) return;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    if (sinks) l[r] += exp2f(sinks[h] * LOG2E - m[r]);  // gpt-oss: the head's sink (m in log2 units)
  }
#pragma unroll
  for (int n = 0; n < ND; n++) {
    int d = 8 * n + 2 * t;
    if (va)
      *(float2*)(out + ((size_t)(r0 + w0 + g) * nh + h) * HD + d) =
          make_float2(o[n][0] / l[0], o[n][1] / l[0]);
    if (vb)
      *(float2*)(out + ((size_t)(r0 + w0 + g + 8) * nh + h) * HD + d) =
          make_float2(o[n][2] / l[1], o[n][3] / l[1]);
  }
}
"""


KV_TYPES = (("f32", "float"), ("f16", "u16"))  # a KV cache's name in kernels, its C type


def kv_instances(name: str, template: str, lanes: tuple[int, ...], params: str, args: str) -> str:
    """``extern "C"`` kernels ``{name}_{f32|f16}_{e}`` calling ``template<KV, e>(args)`` for
    each cache type and each head size / 32 in ``lanes`` (:func:`kv_names`)."""
    return "\n".join(
        f'extern "C" __global__ void {name}_{kv}_{e}({params}) {{ ENTER(); {template}<{ty}, {e}>({args}); }}'
        for kv, ty in KV_TYPES
        for e in lanes
    )


def kv_names(name: str, lanes: tuple[int, ...]) -> list[str]:
    """The kernels :func:`kv_instances` makes."""
    return [f"{name}_{kv}_{e}" for kv, _ in KV_TYPES for e in lanes]


MMA_PARAMS = (
    "const float* q, const i64* pos, const i64* seq, const i64* base, const i64* cap, "
    "const i64* tiles, int nh, int nkv, float scale, int window, float softcap, int layer, "
    "float* out, const float* sinks"
)
MMA_ARGS = "q, pos, seq, base, cap, tiles, nh, nkv, scale, window, softcap, layer, out, sinks"


def instances() -> str:
    tiled = kv_instances("attn_tile", "attend_tile", TILE_LANES, MMA_PARAMS, MMA_ARGS)
    mma = (
        f'extern "C" __global__ void attn_mma_{e}({MMA_PARAMS}) {{ ENTER(); attend_mma<{e}>({MMA_ARGS}); }}'
        for e in TILE_LANES
    )
    return "\n".join([tiled, *mma])


def names() -> list[str]:
    return kv_names("attn_tile", TILE_LANES) + [f"attn_mma_{e}" for e in TILE_LANES]


def source() -> str:
    """This module's kernels: the templates and their instances."""
    return SOURCE.replace("__MMA_KEYS__", str(MMA_KEYS)) + instances()


def tiles(slices: list[slice], rows: int = ROWS) -> np.ndarray[tuple[int, ...], np.dtype[np.int64]]:
    """(first row, rows) of every tile: each chunk's rows in runs of ``rows``
    (:data:`ROWS`, or :data:`MMA_ROWS` for ``attend_mma``)."""
    out = [(a, min(rows, sl.stop - a)) for sl in slices for a in range(sl.start, sl.stop, rows)]
    return np.asarray(out, np.int64).reshape(-1, 2)


def runs(hd: int) -> bool:
    """Whether the tiled kernel is built for head size ``hd``."""
    return hd % 32 == 0 and hd // 32 in TILE_LANES
