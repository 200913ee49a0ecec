"""The RMS norms and the gated activation fused into the wide GEMV's edges at batch 1
(CUDA C appended after :mod:`.cuda_gemvw`), so a decode layer of a llama-shaped model
launches 6 kernels, not 8.

A decode step's layer was: norm + quantize, QKV, RoPE + KV store, attention (+ quantize),
O (+= x), norm + quantize, gate+up, SiLU * up + quantize, down (+= x).  Each small kernel
costs its own few microseconds and a boundary (its predecessor's drain, its own ramp).
``gemvf`` is ``gemvw`` for one row of x with two optional edges:

* **out** (``mode`` 1, a norm): once a group of 32 of y's rows is final (y is the residual
  stream x: O's and down's ``+= x``), the last block to finish one of them (an atomic count
  a group, reset by that block) quantizes the group of ``x * wn`` (the next norm's weights,
  not yet divided by the rms: the int8 values of ``x * wn / rms`` are the same, their scale
  differs by the factor 1 / rms, which the consumer applies) and writes the group's sum of
  ``x * x`` (in double, as the norm kernel's) to ``gss``.
* **out** (``mode`` 2 / 3, SiLU / GELU): y is gate+up (gate rows ``0 .. half``, up rows
  ``half .. 2 half``, as uploaded); a group of 32 gate rows and the 32 up rows beside them
  final, the last of their blocks quantizes ``act(gate) * up`` for the down product.
* **in** (``gss`` not null): x was quantized by a ``mode`` 1 edge: each row's sum is scaled
  by ``1 / sqrt(sum(gss) / d + eps)`` (the groups' sums added in one fixed order, so every
  warp of the grid scales by the same bits).

The float outputs the fused kernels replaced (the normed h, the activation's float out) are
not written: the wide GEMV reads only the quantized x.  Where it applies: one row of x, the
wide GEMV, every part of the weight on its int8 path, an out edge's rows in whole groups
(of 32 for a norm, 64 for gate+up: :func:`takes`, :meth:`Act.takes`).

Opt-in (``MODELC_CUDA_FUSE=1``): on an H100 (session 32) the norm and activation edges made
the 8B's batch-1 decode slower, 333 -> 274 tok/s (the 1.1B 1,040 -> 990): every block of
a producer waits for a fence and an atomic before it exits, and every warp of a consumer for
the groups' sums, once a wave of blocks (the 8B's gate+up has 6.8), ~28 us a layer against
the ~8 us of the three kernels they replace.  (A RoPE + KV store edge on QKV, written the
same way, was dropped unmeasured: its blocks would wait the same.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from modelc.runtime.backends import cuda_gemvw
from modelc.runtime.backends.cuda_gemvw import WIDE_BLOCKS, WIDE_TYPES, WIDE_UNROLL

NORM, SILU, GELU = 1, 2, 3  # gemvf's edge modes

SOURCE = r"""
// 1 / rms of a row of d = 32 ngs values whose groups' sums of squares are gss[0..ngs): the
// same bits in every lane and every warp (one order of terms, lane 0's total)
__device__ __forceinline__ float gss_scale(const double* __restrict__ gss, int ngs, float eps, int lane) {
  double s = 0.0;
  for (int i = lane; i < ngs; i += 32) s += gss[i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  s = __shfl_sync(0xffffffffu, s, 0);
  return (float)(1.0 / sqrt(s / (32.0 * ngs) + (double)eps));
}

// the out edge of y's group j0 .. j0 + 31 (a warp, lane its value), its values final:
// mode 1: x * wn quantized, sum of x * x to ogs; 2 / 3: act(gate) * up (up at + half)
__device__ __forceinline__ void group_out(int mode, const float* y, int half, int j0, const float* __restrict__ wn,
                                          signed char* __restrict__ oq, float2* __restrict__ os,
                                          double* __restrict__ ogs, int lane) {
  int j = j0 + lane;
  float v;
  if (mode == 1) {
    float x = __ldcg(y + j);
    v = x * wn[j];
    double q = (double)x * x;
    for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
    if (lane == 0) ogs[j0 >> 5] = q;
  } else {
    float g = __ldcg(y + j), u = __ldcg(y + half + j);
    v = mode == 2 ? silu_of(g, u) : gelu_of(g, u);
  }
  quant_lanes<1>(&v, lane, oq + j, os + (j0 >> 5));
}

// y[row] (+)= W[row] . x (one row of the quantized x, gemvw's NR 1, wpr warps a row) with
// the edges above: in (gss not null), out (mode > 0; cnt: a count a group, zero between
// launches; half: mode 2 / 3's gate rows)
template <int T, int U>
__device__ __forceinline__ void gemvf(const u8* __restrict__ W, long long rb, int rows, int cols,
    const signed char* __restrict__ xq, const float2* __restrict__ xs, float* __restrict__ y,
    int acc, int wpr, const double* __restrict__ gss, int ngs, float eps, int mode, int half,
    const float* __restrict__ wn, signed char* __restrict__ oq, float2* __restrict__ os,
    double* __restrict__ ogs, unsigned* __restrict__ cnt) {
  __shared__ float part[8][1];
  __shared__ int last;
  int wib = threadIdx.x >> 5, lane = threadIdx.x & 31, k = wib % wpr;
  int per = 8 / wpr, groups = (rows + per - 1) / per;
  for (int rg = blockIdx.x; rg < groups; rg += gridDim.x) {
    int row = rg * per + wib / wpr;
    bool ok = row < rows;
    float a[1] = {0.f};
    if (ok) row_units<T, 1, U, false, false>(W + (size_t)row * rb, cols, k, lane, wpr, xq, xs, 1, a);
    if (gss) a[0] *= gss_scale(gss, ngs, eps, lane);
    rows_out<1>(a, part, wib, lane, k, wpr, ok, 1, y + row, 0, acc);
    if (mode) {  // the block's rows (all in one group: per divides 32) counted in
      __syncthreads();
      if (threadIdx.x == 0) {
        int r0 = rg * per, key = (mode == 1 ? r0 : r0 % half) >> 5;
        unsigned need = mode == 1 ? 32u : 64u;
        __threadfence();  // the block's rows seen before its count
        bool done = atomicAdd(cnt + key, (unsigned)per) + per == need;
        if (done) { cnt[key] = 0u; __threadfence(); }
        last = done ? key : -1;
      }
      __syncthreads();
      if (last >= 0 && wib == 0) group_out(mode, y, half, last << 5, wn, oq, os, ogs, lane);
    }
    if ((wpr > 1 || mode) && rg + gridDim.x < groups) __syncthreads();  // part[], last reused
  }
}
"""


def instances() -> str:
    return "\n".join(
        f'extern "C" __global__ void __launch_bounds__(256, {WIDE_BLOCKS[1]}) '
        f"gemvf_{t}(const u8* W, long long rb, int rows, int cols, const signed char* xq, "
        "const float2* xs, float* y, int acc, int wpr, const double* gss, int ngs, float eps, "
        "int mode, int half, const float* wn, signed char* oq, float2* os, double* ogs, "
        f"unsigned* cnt) {{ enter_gemv(W, rb, rows, wpr); gemvf<{t}, {WIDE_UNROLL[t]}>(W, rb, "
        "rows, cols, xq, xs, y, acc, wpr, gss, ngs, eps, mode, half, wn, oq, os, ogs, cnt); }"
        for t in WIDE_TYPES
    )


def source() -> str:
    return SOURCE + instances()


def names() -> list[str]:
    return [f"gemvf_{t}" for t in WIDE_TYPES]


def takes(w: Any, rows_group: int) -> bool:
    """Whether a weight's product can carry an edge: one part (its launch covers every row)
    of a wide type, its rows in whole groups (``rows_group``: 32 for a norm, 64 for
    gate+up's halves)."""
    return len(w.parts) == 1 and w.parts[0].code in WIDE_TYPES and w.rows % rows_group == 0


class Edges:
    """The fused edges' scratch in a :class:`~.cuda_scratch.Scratch` (the quantized x they
    write, one buffer a kind so that a product never writes the x it reads; the groups' sums
    of squares; the counts, zero between launches) and what the last out edge left for the
    next product: ``pending`` (kind, the array it made it from, its weights or size) until
    a product takes it or another launch passes."""

    def __init__(self, scratch: Any) -> None:
        self.scratch = scratch
        self.pending: tuple[str, int, int] | None = None

    def q8(self, kind: str, cols: int) -> tuple[Any, Any]:
        """The (xq, xs) an out edge of ``kind`` ("norm", "act") writes for ``cols`` values."""
        get = self.scratch.get
        return get(f"{kind}_q", cols, np.int8), get(f"{kind}_s", cols // 16, np.float32)

    def gss(self, cols: int) -> Any:
        return self.scratch.get("gss", cols // 32, np.float64)

    def counts(self, n: int) -> Any:
        return self.scratch.get("edge_cnt", n, np.uint32, zero=True, least=1024)

    def out_args(self, mode: int, half: int, wn: Any, cols: int) -> tuple[Any, ...]:
        """gemvf's norm or activation out-edge arguments (mode .. rt) for ``cols`` values."""
        xq, xs = self.q8("norm" if mode == NORM else "act", cols)
        null = np.uint64(0)
        gss = self.gss(cols) if mode == NORM else null
        wn = null if wn is None else wn
        return (np.int32(mode), np.int32(half), wn, xq, xs, gss, self.counts(cols // 32))


NO_IN = (np.uint64(0), np.int32(0), np.float32(0.0))
NO_OUT = (np.int32(0), np.int32(0), *(np.uint64(0),) * 5)


def ptr(a: Any) -> int:
    return int(a.data.ptr)


def fusing(dev: Any, n: int) -> bool:
    """Whether a product of n rows of x may carry edges on ``dev`` (a cuda.Device)."""
    return dev.fuse and n == 1 and dev.gemv_kind == "wide" and not dev.exact


def wide(w: Any) -> bool:
    return all(p.code in WIDE_TYPES for p in w.parts)


def launch(
    dev: Any,
    w: Any,
    q8: tuple[Any, Any],
    y: Any,
    acc: bool,
    ins: tuple[Any, ...],
    out: tuple[Any, ...],
) -> None:
    """``y (+)= W . x`` for one row of the quantized x, each part of w by ``gemvf`` with the
    edges ``ins`` (gss, ngs, eps) and ``out`` (:meth:`Edges.out_args`; one part only); warps
    a row and grid as :func:`.cuda_gemvw.launch`."""
    col0 = 0
    for p in w.parts:
        s = cuda_gemvw.split(p.code, p.rows, p.cols, 1, dev.sms) if dev.split_k else 1
        s = dev.wpr or s
        groups = (p.rows + 8 // s - 1) // (8 // s)
        cap = dev.sms * WIDE_BLOCKS[1] * dev.waves if dev.waves else groups
        yp = y[:, col0:] if col0 else y
        args: tuple[Any, ...] = (p.data, np.int64(p.row_bytes), np.int32(p.rows), np.int32(p.cols))
        args += (*q8, yp, np.int32(int(acc)), np.int32(s), *ins, *out)
        dev.fn[f"gemvf_{p.code}"]((min(groups, cap),), (256,), args)
        col0 += p.rows


def out_norm(dev: Any, w: Any, n: int, y: Any, acc: bool, q8: Any, wn: Any) -> bool:
    """``y (+)= x . w`` with a norm's out edge (``wn``: the next norm's weights; y the
    residual stream), where it applies: True when launched so (the edge left pending)."""
    dev.edges.pending = None
    if q8 is None or not fusing(dev, n) or not takes(w, 32) or int(wn.shape[0]) != w.rows:
        return False
    launch(dev, w, q8, y, acc, NO_IN, dev.edges.out_args(NORM, 0, wn, w.rows))
    dev.edges.pending = ("norm", ptr(y), ptr(wn))
    return True


def norm_matmul(
    dev: Any, x: Any, n: int, wn: Any, eps: float, h: Any, w: Any, y: Any, then: Act | None
) -> bool | None:
    """``y = rms_norm(x) * wn . w`` with the in edge (where the last out edge left x's
    groups) and, for gate+up, the activation's out edge (``then``); None when not launched
    so, else whether the out edge was taken."""
    pend, dev.edges.pending = dev.edges.pending, None
    if not fusing(dev, n) or not wide(w) or int(wn.shape[0]) != w.cols:
        return None
    ins = pend == ("norm", ptr(x), ptr(wn))
    out = then is not None and then.takes(w)
    if not ins and not out:
        return None
    if ins:
        q8 = dev.edges.q8("norm", w.cols)
        gss = (dev.edges.gss(w.cols), np.int32(w.cols // 32), np.float32(eps))
    else:
        q8, gss = dev.norm_q8(x, n, wn, eps, h, w.cols), NO_IN
    if then is not None and out:
        outs = dev.edges.out_args(GELU if then.gelu else SILU, then.ff, None, then.ff)
        launch(dev, w, q8, y, False, gss, outs)
        dev.edges.pending = ("act", ptr(y), then.ff)
    else:
        launch(dev, w, q8, y, False, gss, NO_OUT)
    return out


class Act:
    """gate+up's out edge: the activation (SiLU, or GELU where ``gelu``) of its ``ff``
    pairs quantized for ``down`` (:meth:`takes`: gate+up one wide part, down wide)."""

    def __init__(self, ff: int, gelu: bool, down: Any) -> None:
        self.ff, self.gelu, self.down = ff, gelu, down

    def takes(self, w: Any) -> bool:
        ok = takes(w, 64) and w.rows == 2 * self.ff
        return ok and wide(self.down) and self.down.cols == self.ff


def act_taken(dev: Any, gu: Any, ff: int) -> Any:
    """gate+up's activation as its out edge left it quantized ((xq, xs)), or None."""
    pend, dev.edges.pending = dev.edges.pending, None
    return dev.edges.q8("act", ff) if pend == ("act", ptr(gu), ff) else None
