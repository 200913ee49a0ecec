"""The streamed wide GEMV of the CUDA backend (one row of x; CUDA C appended after
:mod:`.cuda_gemvw`, whose ``Wide<T>`` loads and sums it runs): a fixed grid of
:data:`BLOCKS` blocks an SM, each block taking every ``gridDim.x``-th group of ``8 / wpr``
rows, each warp its piece of a row in passes of ``U`` units, and **the next pass's loads
issued before this pass's arithmetic** (two sets of registers), across the block's groups.

Why: ``gemvw`` gives each warp one pass a block (all its loads, then all its sums), so the
warps of an SM wait for their loads together and then compete for the schedulers together:
an 8B gate+up wave is ~9.7 MB of reads and ~14,000 warp instructions an SM (~2 us of issue
at 1.76 GHz) one after the other, and the wide GEMV reached 78 % of a pure read of the same
bytes (session 31).  Here a warp's sums of one pass run while its next pass's bytes are on
their way.

``MODELC_CUDA_GEMV_STREAM=1`` (opt-in until a GPU call shows it faster).  The same sums as
``gemvw``'s one-row path, term for term and in the same order (each warp's piece, the same
units per lane), so the same bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from modelc.runtime.backends.cuda_gemvq import q8_bytes
from modelc.runtime.backends.cuda_gemvw import WIDE_TYPES, WIDE_UNITS

STREAM_UNROLL = {2: 2, 12: 2, 14: 1}  # units a pass (U): two passes' registers in flight
BLOCKS = 4  # blocks of 256 an SM (the launch bound: 64 registers a thread)

SOURCE = r"""
// a warp's pass over units u0 + j step (j < U, those below nu) of the row wr: loads / sums
template <int T, int U>
__device__ __forceinline__ void pass_load(const u8* __restrict__ wr, int cols, int u0, int step, int nu,
                                          int t, typename Wide<T>::Reg* r) {
#pragma unroll
  for (int j = 0; j < U; j++)
    if (u0 + j * step < nu) Wide<T>::template load<false>(wr, cols, u0 + j * step, t, r[j]);
}
template <int T, int U>
__device__ __forceinline__ void pass_dot(const typename Wide<T>::Reg* r, int cols, int u0, int step, int nu,
                                         int t, const signed char* __restrict__ xq,
                                         const float2* __restrict__ xs, float* a) {
#pragma unroll
  for (int j = 0; j < U; j++)
    if (u0 + j * step < nu) Wide<T>::template dot<1, false>(r[j], cols, u0 + j * step, t, xq, xs, 1, a);
}

// y[row] (+)= W[row] . x (one row of the quantized x) on a fixed grid: block b takes groups
// b, b + gridDim.x, ... of 8 / wpr rows (wpr a power of two), warp k of a row its piece in
// np passes; item i (a group's pass) loads into one set of registers while item i - 1's
// sums run on the other
template <int T, int U>
__device__ __forceinline__ void gemvs(const u8* __restrict__ W, long long rb, int rows, int cols,
                                      const signed char* __restrict__ xq, const float2* __restrict__ xs,
                                      float* __restrict__ y, int acc, int wpr) {
  typedef Wide<T> P;
  typedef typename P::Reg R;
  constexpr int UPW = 32 / P::LANES;  // units a warp reads a step
  __shared__ float part[2][8];
  int lw = __ffs(wpr) - 1, wib = threadIdx.x >> 5, lane = threadIdx.x & 31, k = wib & (wpr - 1);
  int per = 8 >> lw, groups = (rows + per - 1) >> (3 - lw);
  int t = lane % P::LANES, nu = cols / P::WEIGHTS, step = UPW * wpr, ub = k * UPW + lane / P::LANES;
  int np = (nu + U * step - 1) / (U * step);  // passes a piece (the last may be part of one)
  int mine = groups > (int)blockIdx.x ? (groups - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
  int total = mine * np;
  if (total == 0) return;  // the whole block: no barrier waits on it
  R ra[U], rb2[U];
  float a = 0.f;
  // the item being summed (g: the block's g-th group, p: its pass) and the one being loaded
  int g = 0, p = 0, gn = np > 1 ? 0 : 1, pn = np > 1 ? 1 : 0;
  auto row_of = [&](int gi) { return ((int)blockIdx.x + gi * (int)gridDim.x) * per + (wib >> lw); };
  auto load = [&](R* r, int gi, int pi) {
    int row = row_of(gi);
    if (row < rows) pass_load<T, U>(W + (size_t)row * rb, cols, ub + pi * U * step, step, nu, t, r);
  };
  auto sum = [&](const R* r) {
    int row = row_of(g);
    if (row < rows) pass_dot<T, U>(r, cols, ub + p * U * step, step, nu, t, xq, xs, &a);
    if (p == np - 1) {  // the group's last pass: the row's sum out
      float s = warp_sum(a);
      a = 0.f;
      if (wpr > 1) {
        if (lane == 0) part[g & 1][wib] = s;
        __syncthreads();  // two buffers: group g + 2 writes this one after the next barrier
        if (k == 0 && lane == 0 && row < rows) {
          s = 0.f;
          for (int j = 0; j < wpr; j++) s += part[g & 1][wib + j];
        }
      }
      if (k == 0 && lane == 0 && row < rows) y[row] = acc ? y[row] + s : s;
    }
  };
  auto advance = [&]() {
    g = gn;
    p = pn;
    if (++pn == np) {
      pn = 0;
      gn++;
    }
  };
  load(ra, 0, 0);
  for (int i = 0;;) {
    if (i + 1 < total) load(rb2, gn, pn);
    __syncwarp();  // the loads before the sums (ptxas would interleave them)
    sum(ra);
    if (++i == total) break;
    advance();
    if (i + 1 < total) load(ra, gn, pn);
    __syncwarp();
    sum(rb2);
    if (++i == total) break;
    advance();
  }
}
"""


def instances(unroll: dict[int, int] | None = None, blocks: int = BLOCKS) -> str:
    us = {**STREAM_UNROLL, **(unroll or {})}
    return "\n".join(
        f'extern "C" __global__ void __launch_bounds__(256, {blocks}) '
        f"gemvs_{t}(const u8* W, long long rb, int rows, int cols, const signed char* xq, "
        "const float2* xs, float* y, int acc, int wpr) { enter_gemv(W, rb, rows, wpr); "
        f"gemvs<{t}, {us[t]}>(W, rb, rows, cols, xq, xs, y, acc, wpr); }}"
        for t in WIDE_TYPES
    )


def source(unroll: dict[int, int] | None = None, blocks: int = BLOCKS) -> str:
    return SOURCE + instances(unroll, blocks)


def names() -> list[str]:
    return [f"gemvs_{t}" for t in WIDE_TYPES]


def split(code: int, cols: int) -> int:
    """Warps a row (1, 2, 4 or 8): the fewest that give each warp at most two passes."""
    units = cols // WIDE_UNITS[code][0]
    per = STREAM_UNROLL[code] * (32 // WIDE_UNITS[code][1])  # units a warp's pass reads
    w = 1
    while w < 8 and units > 2 * w * per:
        w *= 2
    return w


def launch(
    fn: dict[str, Any], p: Any, q8: tuple[Any, Any], y: Any, acc: bool, sms: int, wpr: int = 0
) -> None:
    """``y (+)= xq[0] . p`` by ``gemvs`` on ``sms * BLOCKS`` blocks at most."""
    w = wpr or split(p.code, p.cols)
    groups = -(-p.rows // (8 // w))
    qb, sb = q8_bytes(0, p.cols)
    args = (
        p.data,
        np.int64(p.row_bytes),
        np.int32(p.rows),
        np.int32(p.cols),
        q8[0][qb:],
        q8[1][sb:],
    )
    fn[f"gemvs_{p.code}"](
        (min(groups, sms * BLOCKS),), (256,), (*args, y, np.int32(int(acc)), np.int32(w))
    )
