"""The batched sampler in one CUDA launch: a block a row (``sample_rows``).

:func:`~modelc.runtime.batch_sampler.sample_batch` over CuPy makes 86-92 device calls a
sampled step at llama-server's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p
0.05; 3 for a greedy one), and in a loaded server each call that gives the GIL up waits
for the event loop to hand it back (0.2-0.3 ms on average on an H100 host at 64 streams):
sampling, not the model, would set a sampled load's speed.  Here one block of 1,024
threads takes a row and does what the batched sampler does, in its order and on its
float64 arithmetic:

1. the row's largest logit and its first index (greedy rows end here);
2. top-k: the k-th largest logit found by radix selection (four passes of 8-bit
   histograms over the logits' order-preserving 32-bit keys), ties with it kept;
3. top-p: the tokens left (at most :data:`CAND`) sorted in shared memory (bitonic; by
   probability, ties by id), their probabilities summed in that order, the smallest
   prefix reaching ``top_p`` kept;
4. min-p against the most likely token, renormalised as the batched sampler does;
5. the temperature over the tokens left, and the draw: the first id whose cumulative
   probability exceeds the row's ``u`` (each thread a contiguous run of ids, the runs'
   sums scanned).

Banned ids, logit bias and penalties are applied before (``batch_sampler.apply_edits``,
a few calls when a row has any); a row asking for log-probabilities, or a step with rows
the host samples, takes the batched sampler.  A row the kernel cannot decide (a NaN or
infinite largest logit, more than :data:`CAND` tokens left before top-p) gets -1 and the
step is sampled again by the batched sampler.  :func:`sample_rows_ref` is the same
algorithm in numpy, checked against the batched sampler on the CPU; the kernel is checked
against both on a GPU (tests/test_cuda_sampler.py).  On by default for steps with a sampled
row (a greedy-only step keeps the batched sampler's argmax: three calls either way, and
its HTTP loads ran ~10 % faster so); ``MODELC_CUDA_SAMPLER=batch`` turns it off.  An H100
at 64 streams over HTTP, sampled as llama-server's defaults: 529-2,473 tok/s through the
batched sampler (bimodal across servers), 3,031-3,713 through this kernel, greedy
3,600-3,750 (bench/RESULTS.md).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from modelc.runtime.batch_sampler import BatchParams, Drawn, apply_edits

CAND = 1024  # tokens top-p can sort (top_k up to this, or top_p 1)

SOURCE = r"""
#define SAMPLE_CAND 1024
__device__ __forceinline__ u32 fkey(float f) {  // larger float, larger key
  u32 b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ double block_sum_d(double v, double* red) {  // every thread gets the sum
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  double r = 0.0;
  for (int i = 0; i < (int)(blockDim.x >> 5); i++) r += red[i];
  return r;
}

// prm: 6 doubles a row: temperature, top_k, top_p, min_p, u, the row of logits it samples
extern "C" __global__ void __launch_bounds__(1024) sample_rows(const float* __restrict__ logits,
    int V, const double* __restrict__ prm, i64* __restrict__ out) {
  ENTER();
  __shared__ float cx[SAMPLE_CAND];
  __shared__ int ci[SAMPLE_CAND];
  __shared__ u32 hist[256];
  __shared__ double red[32];
  __shared__ double pre[1024];
  __shared__ float rv[32];
  __shared__ int ri[32], s_bad, s_count, s_need;
  __shared__ u32 s_prefix;
  const int b = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
  const double* __restrict__ p = prm + 6 * b;
  const float* __restrict__ x = logits + (i64)p[5] * (i64)V;
  const double t = p[0], tp = p[2], mp = p[3], u = p[4];
  const int k = (int)p[1];
  // 1. the largest logit, its first index; any NaN
  float best = -INFINITY; int bi = 0x7fffffff, bad = 0;
  for (int j = tid; j < V; j += nt) {
    float v = x[j];
    bad |= v != v;
    if (v > best || (v == best && j < bi)) { best = v; bi = j; }
  }
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, best, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
  }
  bad = __any_sync(0xffffffffu, bad);
  if (tid == 0) s_bad = 0;
  __syncthreads();
  if ((tid & 31) == 0) { rv[tid >> 5] = best; ri[tid >> 5] = bi; if (bad) s_bad = 1; }
  __syncthreads();
  best = rv[0]; bi = ri[0];
  for (int i = 1; i < nt >> 5; i++)
    if (rv[i] > best || (rv[i] == best && ri[i] < bi)) { best = rv[i]; bi = ri[i]; }
  if (s_bad || !(best > -INFINITY && best < INFINITY)) { if (tid == 0) out[b] = -1; return; }
  if (t <= 0.0) { if (tid == 0) out[b] = bi; return; }
  const double m = best;
  // 2. top-k: the key of the k-th largest logit, by radix selection
  u32 kth = 0u;
  if (k > 0 && k < V) {
    u32 prefix = 0u, pmask = 0u;
    if (tid == 0) s_need = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += nt) hist[i] = 0u;
      __syncthreads();
      for (int j = tid; j < V; j += nt) {
        u32 key = fkey(x[j]);
        if ((key & pmask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (tid == 0) {
        u32 need = (u32)s_need, cum = 0u; int bin = 255;
        for (; bin > 0; bin--) { if (cum + hist[bin] >= need) break; cum += hist[bin]; }
        s_need = (int)(need - cum);
        s_prefix = prefix | ((u32)bin << shift);
      }
      __syncthreads();
      prefix = s_prefix; pmask |= 255u << shift;
    }
    kth = prefix;
  }
  // 3. top-p over the tokens top-k left, sorted by probability (ties by id)
  float xc = -INFINITY; int ic = 0x7fffffff;  // the last token top-p keeps (none: all)
  bool cut = tp < 1.0;
  if (cut) {
    if (tid == 0) s_count = 0;
    __syncthreads();
    for (int j = tid; j < V; j += nt) {
      float v = x[j];
      if (fkey(v) >= kth) {
        int c = atomicAdd(&s_count, 1);
        if (c < SAMPLE_CAND) { cx[c] = v; ci[c] = j; }
      }
    }
    __syncthreads();
    const int C = s_count;
    if (C > SAMPLE_CAND) { if (tid == 0) out[b] = -1; return; }
    int np2 = 1;
    while (np2 < C) np2 <<= 1;
    for (int i = C + tid; i < np2; i += nt) { cx[i] = -INFINITY; ci[i] = 0x7fffffff; }
    __syncthreads();
    for (int size = 2; size <= np2; size <<= 1) {
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        for (int i = tid; i < np2; i += nt) {
          int o = i ^ stride;
          if (o > i) {
            float a = cx[i], c2 = cx[o]; int ia = ci[i], io = ci[o];
            bool first = a > c2 || (a == c2 && ia < io);
            if (first != ((i & size) == 0)) { cx[i] = c2; cx[o] = a; ci[i] = io; ci[o] = ia; }
          }
        }
        __syncthreads();
      }
    }
    double z1 = 0.0;
    for (int i = tid; i < C; i += nt) z1 += exp((double)cx[i] - m);
    z1 = block_sum_d(z1, red);
    if (tid == 0) {
      double cum = 0.0; int n = 0;
      for (; n < C - 1; n++) { cum += exp((double)cx[n] - m) / z1; if (!(cum < tp)) break; }
      s_count = n;  // the last kept position
    }
    __syncthreads();
    xc = cx[s_count]; ic = ci[s_count];
  }
  // 4. min-p against the most likely token (its weight exp(0) = 1)
  double z2 = 0.0;
  for (int j = tid; j < V; j += nt) {
    float v = x[j];
    bool keep = fkey(v) >= kth && (!cut || v > xc || (v == xc && j <= ic));
    if (keep) z2 += exp((double)v - m);
  }
  z2 = block_sum_d(z2, red);
  const double thr = mp > 0.0 ? mp * (1.0 / z2) : 0.0;
  // 5. the temperature's weights, the draw in id order
  const int chunk = (V + nt - 1) / nt, j0 = tid * chunk, j1 = min(V, j0 + chunk);
  double s = 0.0;
  for (int j = j0; j < j1; j++) {
    float v = x[j];
    if (!(fkey(v) >= kth && (!cut || v > xc || (v == xc && j <= ic)))) continue;
    double q = exp((double)v - m) / z2;
    if (q < thr || !(q > 0.0)) continue;
    s += t != 1.0 ? exp(((double)v - m) / t) : q;
  }
  pre[tid] = s;
  __syncthreads();
  if (tid == 0) {
    double c = 0.0;
    for (int i = 0; i < nt; i++) { double w = pre[i]; pre[i] = c; c += w; }
    red[0] = c;
  }
  __syncthreads();
  const double total = red[0], lo = pre[tid];
  if (lo / total <= u && (lo + s) / total > u) {  // the crossing is in this thread's run
    double c = lo; i64 last = -1, tok = -1;
    for (int j = j0; j < j1 && tok < 0; j++) {
      float v = x[j];
      if (!(fkey(v) >= kth && (!cut || v > xc || (v == xc && j <= ic)))) continue;
      double q = exp((double)v - m) / z2;
      if (q < thr || !(q > 0.0)) continue;
      c += t != 1.0 ? exp(((double)v - m) / t) : q;
      last = j;
      if (c / total > u) tok = j;
    }
    out[b] = tok >= 0 ? tok : last;
  }
}
"""

NAMES = ["sample_rows"]


def enabled() -> bool:
    """Whether steps with a sampled row go through :func:`sample_rows` (the default;
    ``MODELC_CUDA_SAMPLER=batch``: the batched sampler)."""
    return os.environ.get("MODELC_CUDA_SAMPLER", "fused") != "batch"


def drawn(tokens: np.ndarray[Any, Any], v: int) -> Drawn:
    """``tokens`` (B,) as a :class:`Drawn` with no log-probabilities and no host rows."""
    b, nothing = len(tokens), np.zeros((len(tokens), 0))
    return Drawn(tokens, np.full(b, np.nan), nothing.astype(np.int64), nothing,
                 np.zeros((0, v), np.float32))  # fmt: skip


def takes(bp: BatchParams) -> bool:
    """Whether the kernel samples this step: it :func:`fits` and a row draws (a greedy-only
    step keeps the batched sampler's argmax)."""
    return bool((bp.temperature > 0).any()) and fits(bp)


def fits(bp: BatchParams) -> bool:
    """Whether the kernel does every row of ``bp``: none returned to the host, none asking
    for log-probabilities, and top-p only over at most :data:`CAND` tokens top-k left."""
    if len(bp.host_rows) or (bp.n_logprobs >= 0).any():
        return False
    cut = (bp.temperature > 0) & (bp.top_p < 1.0)
    return bool(((bp.top_k[cut] > 0) & (bp.top_k[cut] <= CAND)).all())


def params(bp: BatchParams, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.float64]]:
    """(B, 6) float64 a row: temperature, top_k, top_p, min_p, u (0 for greedy rows), and
    the row of the logits it samples (``rows``)."""
    u = np.nan_to_num(bp.uniform, nan=0.0)
    cols = [bp.temperature, bp.top_k.astype(np.float64), bp.top_p, bp.min_p, u, rows]
    return np.stack([np.asarray(c, np.float64) for c in cols], 1)


def _key(x: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.uint32]]:
    b = x.astype(np.float32).view(np.uint32)
    return np.where(b & 0x80000000, ~b, b | 0x80000000).astype(np.uint32)


def kth_key(x: np.ndarray[Any, Any], k: int) -> int:
    """The key of the ``k``-th largest of ``x`` as the kernel finds it: four passes of
    8-bit histograms over the order-preserving keys."""
    keys, prefix, mask, need = _key(x), 0, 0, k
    for shift in (24, 16, 8, 0):
        sel = keys[(keys & mask) == prefix]
        hist = np.bincount((sel >> shift) & 255, minlength=256)
        cum, b = 0, 255
        while b > 0 and cum + hist[b] < need:
            cum += int(hist[b])
            b -= 1
        need -= cum
        prefix |= b << shift
        mask |= 255 << shift
    return prefix


def sample_rows_ref(
    logits: np.ndarray[Any, Any], prm: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    """The kernel's algorithm in numpy: a token for each row of ``prm`` (:func:`params`)
    from ``logits`` (rows, V) f32, -1 where the kernel hands the step back."""
    out = np.empty(len(prm), np.int64)
    for r, (t, kf, tp, mp, u, row) in enumerate(prm):
        x = logits[int(row)]
        v = len(x)
        if np.isnan(x).any() or not np.isfinite(x.max()):
            out[r] = -1
            continue
        if t <= 0:
            out[r] = int(np.argmax(x))
            continue
        m, k, keys = float(x.max()), int(kf), _key(x)
        keep = keys >= (kth_key(x, k) if 0 < k < v else 0)
        if tp < 1.0:
            ids = np.flatnonzero(keep)
            if len(ids) > CAND:
                out[r] = -1
                continue
            ids = ids[np.lexsort((ids, -x[ids]))]  # by logit, ties by id
            e = np.exp(x[ids].astype(np.float64) - m)
            z1 = e.sum()
            cum, n = 0.0, 0
            while n < len(ids) - 1:
                cum += e[n] / z1
                if not cum < tp:
                    break
                n += 1
            xc, ic = x[ids[n]], ids[n]
            keep &= (x > xc) | ((x == xc) & (np.arange(v) <= ic))
        e = np.where(keep, np.exp(x.astype(np.float64) - m), 0.0)
        z2 = e.sum()
        q = e / z2
        keep &= (q >= (mp * (1.0 / z2) if mp > 0 else 0.0)) & (q > 0)
        w = np.where(keep, np.exp((x.astype(np.float64) - m) / t) if t != 1.0 else q, 0.0)
        cdf = np.cumsum(w) / w.sum()
        out[r] = int(np.count_nonzero(cdf <= u))
    return out


def launch(dev: Any, logits: Any, prm: Any, out: Any, b: int) -> None:
    """Queue :func:`sample_rows` on the current stream: row i of ``out`` picked from the
    device ``logits`` (rows, V) as row i of the device ``prm`` (:func:`params`) says, for
    i < ``b`` (a block of 1,024 threads a row)."""
    dev.fn["sample_rows"]((b,), (1024,), (logits, np.int32(logits.shape[1]), prm, out))


def sample(dev: Any, logits: Any, bp: BatchParams, out: Any) -> Drawn | None:
    """The rows of ``bp`` sampled from the device ``logits`` (rows, V) by one launch into
    ``out`` (a device int64 array of at least B), on the current stream; None where the
    kernel handed the step back (the caller samples it with ``sample_batch``)."""
    cp, b, v = dev.cp, len(bp.rows), logits.shape[1]
    rows = bp.rows
    if bp.edited:
        logits = apply_edits(cp, logits[cp.asarray(rows)], bp)  # a copy, rows in bp's order
        rows = np.arange(b)
    launch(dev, logits, cp.asarray(params(bp, rows)), out, b)
    tokens = out[:b].get()
    return None if (tokens < 0).any() else drawn(tokens, v)
