"""Prompt attention of the CUDA backend in tiles (CUDA C, appended to :mod:`.cuda_src`).

``attend`` (in :mod:`.cuda_src`) gives each (query row, head) a block that reads every key
of its sequence from the cache: a prompt of n tokens reads its keys n times over, and a
2,048-token prefill spent most of its time there (an H100: 15k tok/s against llama.cpp's
41k).  Here a block takes a tile of up to :data:`ROWS` consecutive rows of one
sequence's chunk and one head: each 32-key piece of the cache is read once into shared
memory (as f32) and used by every row of the tile, lane ``t`` scoring key ``t`` against
the tile's queries (kept in shared memory, scaled), then an online softmax a row
(FlashAttention's) and each lane accumulating the values of dimensions ``lane + 32 e``.
Causal within the chunk, sliding windows and soft-capped scores as ``attend``.

Tiles come from the host as (first row, rows) pairs (:func:`tiles`), so a step mixing
prompt chunks and decode rows runs in one launch (a decode row is a tile of one).  Head
sizes 32, 64, 96 and 128 (the shared arrays of 256 do not fit in 48 KB: ``attend`` takes
those).
"""

from __future__ import annotations

import numpy as np

ROWS = 16  # query rows a tile (two a warp)
TILE_LANES = (1, 2, 3, 4)  # head_dim / 32 the tiled kernel is built for

SOURCE = r"""
// a tile of rows r0 .. r0 + cnt - 1 (one sequence's chunk, consecutive positions) and head
// h; tiles: (r0, cnt) pairs; 8 warps, rows warp and warp + 8
template <typename KV, int E>
__device__ __forceinline__ void attend_tile(const float* __restrict__ q, const i64* __restrict__ pos,
    const i64* __restrict__ seq, const i64* __restrict__ base, const i64* __restrict__ cap,
    const i64* __restrict__ tiles, int nh, int nkv, float scale, int window, float softcap,
    int layer, float* __restrict__ out) {
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
#pragma unroll
    for (int e = 0; e < E; e++) orow[e * 32 + lane] = o[j][e] / l[j];
  }
}
"""


KV_TYPES = (("f32", "float"), ("f16", "u16"))  # a KV cache's name in kernels, its C type


def kv_instances(name: str, template: str, lanes: tuple[int, ...], params: str, args: str) -> str:
    """``extern "C"`` kernels ``{name}_{f32|f16}_{e}`` calling ``template<KV, e>(args)`` for
    each cache type and each head size / 32 in ``lanes`` (:func:`kv_names`)."""
    return "\n".join(
        f'extern "C" __global__ void {name}_{kv}_{e}({params}) {{ {template}<{ty}, {e}>({args}); }}'
        for kv, ty in KV_TYPES
        for e in lanes
    )


def kv_names(name: str, lanes: tuple[int, ...]) -> list[str]:
    """The kernels :func:`kv_instances` makes."""
    return [f"{name}_{kv}_{e}" for kv, _ in KV_TYPES for e in lanes]


def instances() -> str:
    return kv_instances(
        "attn_tile",
        "attend_tile",
        TILE_LANES,
        "const float* q, const i64* pos, const i64* seq, const i64* base, const i64* cap, "
        "const i64* tiles, int nh, int nkv, float scale, int window, float softcap, int layer, "
        "float* out",
        "q, pos, seq, base, cap, tiles, nh, nkv, scale, window, softcap, layer, out",
    )


def names() -> list[str]:
    return kv_names("attn_tile", TILE_LANES)


def tiles(slices: list[slice]) -> np.ndarray[tuple[int, ...], np.dtype[np.int64]]:
    """(first row, rows) of every tile: each chunk's rows in runs of :data:`ROWS`."""
    out = [(a, min(ROWS, sl.stop - a)) for sl in slices for a in range(sl.start, sl.stop, ROWS)]
    return np.asarray(out, np.int64).reshape(-1, 2)


def runs(hd: int) -> bool:
    """Whether the tiled kernel is built for head size ``hd``."""
    return hd % 32 == 0 and hd // 32 in TILE_LANES
