"""Greedy picks on the CUDA backend: the argmax of each logit row over many blocks (CUDA C,
appended to :mod:`.cuda_src`).

A row of a 128k vocabulary scanned by one block of 1,024 threads took ~52 us of an 8B's
3.3 ms decode step on an H100 (``bench/cuda_profile.py``, session 31); here each row is cut
into parts of ~2,048 logits, a block a part (``argmax_parts``), and the row's last block to
finish (an atomic count a row, reset by that block) takes the parts' best: the first index
of the largest value, as numpy's ``argmax`` (NaNs never chosen; the one-block kernel
before it, ``argmax_rows``, is gone).
"""

from __future__ import annotations

from typing import Any

import numpy as np

PART = 2048  # logits a block scans
MAX_PARTS = 64

SOURCE = r"""
// (v, j) and the lanes' (v2, j2): the larger value, the first index of equals
__device__ __forceinline__ void keep_best(float& v, int& j, float v2, int j2) {
  if (v2 > v || (v2 == v && j2 < j)) { v = v2; j = j2; }
}
// the block's best (v, j) to every thread (blockDim.x a multiple of 32, at most 1,024)
__device__ __forceinline__ void block_best(float& v, int& j) {
  __shared__ float sv[32];
  __shared__ int sj[32];
  for (int o = 16; o > 0; o >>= 1)
    keep_best(v, j, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, j, o));
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) { sv[w] = v; sj[w] = j; }
  __syncthreads();
  v = lane < (blockDim.x >> 5) ? sv[lane] : -INFINITY;
  j = lane < (blockDim.x >> 5) ? sj[lane] : 0x7fffffff;
  for (int o = 16; o > 0; o >>= 1)
    keep_best(v, j, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, j, o));
  __syncthreads();  // sv / sj free again
}

// argmax of each row of x (n, d): grid (n, parts), block b of row i scans [b chunk, (b + 1)
// chunk); the row's last block to finish takes the parts' best into out[i]
extern "C" __global__ void argmax_parts(const float* __restrict__ x, int d, int chunk,
                                        float* __restrict__ pv, int* __restrict__ pj,
                                        unsigned* __restrict__ done, i64* __restrict__ out) {
  ENTER();
  int i = blockIdx.x, b = blockIdx.y, nb = gridDim.y;
  const float* r = x + (size_t)i * d;
  int lo = b * chunk, hi = lo + chunk < d ? lo + chunk : d;
  float v = -INFINITY;
  int j = 0x7fffffff;
  for (int k = lo + threadIdx.x; k < hi; k += blockDim.x) keep_best(v, j, r[k], k);
  block_best(v, j);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    pv[(size_t)i * nb + b] = v;
    pj[(size_t)i * nb + b] = j;
    __threadfence();  // the part's best visible before it is counted
    last = atomicAdd(done + i, 1u) == (unsigned)(nb - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  v = -INFINITY;
  j = 0x7fffffff;
  for (int k = threadIdx.x; k < nb; k += blockDim.x)
    keep_best(v, j, ((volatile float*)pv)[(size_t)i * nb + k], ((volatile int*)pj)[(size_t)i * nb + k]);
  block_best(v, j);
  if (threadIdx.x == 0) {
    out[i] = j;
    done[i] = 0;  // for the next launch
  }
}
"""

NAMES = ["argmax_parts"]


def parts(d: int) -> tuple[int, int]:
    """(blocks a row, logits a block) for rows of ``d`` logits."""
    nb = max(1, min(MAX_PARTS, -(-d // PART)))
    return nb, -(-d // nb)


def launch(fn: dict[str, Any], scratch: Any, x: Any, n: int, out: Any) -> None:
    """out[i] = row i's argmax (i < n) by ``argmax_parts``, its parts in ``scratch``'s
    (a :class:`~.cuda_scratch.Scratch`) buffers."""
    d = int(x.shape[-1])
    nb, chunk = parts(d)
    m = n * MAX_PARTS
    pv = scratch.get("argmax_v", m, np.float32, least=64 * MAX_PARTS)
    pj = scratch.get("argmax_j", m, np.int32, least=64 * MAX_PARTS)
    done = scratch.get("argmax_done", n, np.uint32, zero=True, least=64)
    fn["argmax_parts"]((n, nb), (256,), (x, np.int32(d), np.int32(chunk), pv, pj, done, out))
