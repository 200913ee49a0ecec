"""The pipelined GEMV of the CUDA backend (CUDA C, appended after :mod:`.cuda_gemvw`): the
wide GEMV's arithmetic (``Wide<T>``, the same quantized activations) fed from shared memory
by Hopper's bulk copy engine, a fixed grid of blocks streaming the weight through a ring of
stages, as a memory-bound kernel near the bandwidth does (Marlin's and FlashInfer's
pipelines; llama.cpp's ``mmvq`` reads straight from global memory, as ``gemvw`` does).

Why: ``gemvw`` gives each warp a row and each block eight, loads then computes, then the
block ends and another starts; an H100 ran its 8B shapes at 1.2-1.7 TB/s of the 3.0 TB/s a
copy reaches (bench/RESULTS.md, session 22), the bytes in flight dipping as blocks come and
go.  Here a block of 8 warps stays for the whole matrix: its tiles (``R`` consecutive rows,
``R * rb`` contiguous bytes) are copied by ``cp.async.bulk`` into ``S`` stage buffers, each
completing an mbarrier; the block computes tile ``i`` while tiles ``i + 1 .. i + S - 1`` are
in flight, and refills a stage as soon as every warp is done with it.  The first ``S`` copies
are issued before ``ENTER()`` (the weights do not depend on the kernel before; x and y do),
so under programmatic dependent launch they overlap the previous kernel's tail.

Tiles go to blocks in turn (block ``b``: tiles ``b, b + grid, ...``); ``8 / R`` warps a row
(their sums added as ``gemvw``'s); ``R`` is the largest of 8, 4, 2, 1 whose tile fits
:data:`TILE_BYTES` and leaves at least :data:`TILES_A_BLOCK` tiles a block, ``S`` fills
:data:`STAGE_BYTES`.  Compute capability 9.0 and up (the bulk copy); opt-in
(``MODELC_CUDA_GEMV=pipe``: the wide types and layouts, the wide GEMV's rules otherwise).

Measured on an H100 (session 31, bench/RESULTS.md): its sums hold to ``gemvw``'s, but it is
slower on every 8B and 1.1B shape but one (batch-1 decode of the 8B 276 tok/s against 290,
230 with the norm in its prologue): a block's 8 warps wait for one another at every tile
before its stage is refilled, and an SM holds 16 warps where ``gemvw``'s 32 never wait.
What would change that: a producer warp and consumers released a stage each by mbarriers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from modelc.runtime.backends.cuda_gemvw import WIDE_ROWS, WIDE_TYPES, WIDE_UNROLL, passes

TILE_BYTES = 24 << 10  # a stage's most bytes
STAGE_BYTES = 64 << 10  # a block's stages together (the bytes in flight a block)
MIN_STAGES, MAX_STAGES = 2, 8
BLOCKS_PER_SM = 2  # blocks of 8 warps resident on a multiprocessor (2 x ~64 KB of stages)
TILES_A_BLOCK = 4  # fewest tiles a block at the widest R (else R shrinks: balance)
HEADER = 128  # the stages' mbarriers, before the buffers (16-byte aligned for the copies)

SOURCE = r"""
#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ u32 smem_at(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(unsigned long long* b, u32 n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_at(b)), "r"(n) : "memory");
}
// bytes of global memory into shared, completing the stage's barrier (its one arrival here)
__device__ __forceinline__ void bulk_in(void* dst, const void* src, u32 bytes, unsigned long long* b) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_at(b)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem_at(dst)), "l"(src), "r"(bytes), "r"(smem_at(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* b, u32 parity) {
  u32 done;
  do {
    asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                 "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(smem_at(b)), "r"(parity) : "memory");
  } while (!done);
}
#endif

// x's nr rows normed (x / rms * wn, as rms_norm_q8) and quantized into shared memory (sq, ss):
// the pipelined GEMV's prologue in place of a norm launch of its own
template <int NR>
__device__ __forceinline__ void stage_norm(const float* __restrict__ x, int ldx, const float* __restrict__ wn,
                                           float eps, int cols, int nr, signed char* sq, float2* ss) {
  __shared__ float scale[NR];
  int lane = threadIdx.x & 31, ng = cols >> 5;
  for (int r = 0; r < nr; r++) {
    float sc = row_rms_scale(x + (size_t)r * ldx, cols, eps);
    if (threadIdx.x == 0) scale[r] = sc;
    __syncthreads();  // block_sum's slots free for the next row
  }
  for (int r = 0; r < nr; r++)
    for (int g = threadIdx.x >> 5; g < ng; g += blockDim.x >> 5) {
      int j = g * 32 + lane;
      float v = x[(size_t)r * ldx + j] * scale[r] * wn[j];
      quant_lanes<1>(&v, lane, sq + r * cols + j, ss + r * ng + g);
    }
  __syncthreads();
}

// y[r, row] (+)= W[row] . x[r] for nr <= NR rows of x: a fixed grid, tiles of R rows through
// S shared-memory stages (the module's docstring); XN false: x quantized by the kernel before
// (xq, xs), true: x's f32 rows (x, ldx), normed by wn and quantized here into shared memory
template <int T, int NR, int U, bool XN>
__device__ __forceinline__ void gemvp(const u8* __restrict__ W, long long rb, int rows, int cols,
                                      const signed char* xq, const float2* xs, const float* __restrict__ x,
                                      int ldx, const float* __restrict__ wn, float eps, int nr,
                                      float* __restrict__ y, int ldy, int acc, int R, int S) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) u8 smem[];
  __shared__ float part[8][NR];
  unsigned long long* bar = (unsigned long long*)smem;
  u8* buf = smem + __HEADER__;
  long long tb = (long long)R * rb;
  int ntiles = (rows + R - 1) / R, tid = threadIdx.x, wib = tid >> 5, lane = tid & 31;
  int wpr = 8 / R, rin = wib / wpr, k = wib % wpr;
  if (tid == 0) {
    for (int s = 0; s < S; s++) mbar_init(bar + s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int s = 0; s < S; s++) {  // the first S tiles, before waiting for the kernel before
      int tile = blockIdx.x + s * gridDim.x;
      if (tile < ntiles) {
        int n = rows - tile * R < R ? rows - tile * R : R;
        bulk_in(buf + s * tb, W + tile * tb, (u32)(n * rb), bar + s);
      }
    }
  }
  __syncthreads();
  ENTER();
  if (XN) {  // x's rows after the stages
    signed char* sq = (signed char*)(buf + S * tb);
    float2* ss = (float2*)(sq + NR * cols);
    stage_norm<NR>(x, ldx, wn, eps, cols, nr, sq, ss);
    xq = sq;
    xs = ss;
  }
  for (int i = 0, tile = blockIdx.x; tile < ntiles; i++, tile += gridDim.x) {
    int s = i % S, row = tile * R + rin;
    bool ok = row < rows;
    mbar_wait(bar + s, (u32)(i / S) & 1);
    float a[NR];
#pragma unroll
    for (int j = 0; j < NR; j++) a[j] = 0.f;
    if (ok) row_units<T, NR, U, true, XN>(buf + s * tb + (long long)rin * rb, cols, k, lane, wpr, xq, xs, nr, a);
    rows_out<NR>(a, part, wib, lane, k, wpr, ok, nr, y + (ok ? row : 0), ldy, acc);
    __syncthreads();  // every warp done with stage s (and with part[])
    int next = tile + S * gridDim.x;
    if (tid == 0 && next < ntiles) {
      int n = rows - next * R < R ? rows - next * R : R;
      bulk_in(buf + s * tb, W + next * tb, (u32)(n * rb), bar + s);
    }
  }
#else
  __trap();
#endif
}
"""


def instances() -> str:
    out = []
    for t in WIDE_TYPES:
        for nr in WIDE_ROWS:
            head = f'extern "C" __global__ void __launch_bounds__(256, {BLOCKS_PER_SM}) '
            tail = "int nr, float* y, int ldy, int acc, int R, int S)"
            call = f"gemvp<{t}, {nr}, {WIDE_UNROLL[t]}, "
            out.append(
                f"{head}gemvp_{t}_{nr}(const u8* W, long long rb, int rows, int cols, "
                f"const signed char* xq, const float2* xs, {tail} {{ {call}false>(W, rb, rows, "
                "cols, xq, xs, nullptr, 0, nullptr, 0.f, nr, y, ldy, acc, R, S); }"
            )
            out.append(
                f"{head}gemvpn_{t}_{nr}(const u8* W, long long rb, int rows, int cols, "
                f"const float* x, int ldx, const float* wn, float eps, {tail} {{ {call}true>(W, "
                "rb, rows, cols, nullptr, nullptr, x, ldx, wn, eps, nr, y, ldy, acc, R, S); }"
            )
    return "\n".join(out)


def source() -> str:
    return SOURCE.replace("__HEADER__", str(HEADER)) + instances()


def names() -> list[str]:
    return [f"gemvp{k}_{t}_{nr}" for k in ("", "n") for t in WIDE_TYPES for nr in WIDE_ROWS]


def plan(rows: int, rb: int, sms: int, extra: int = 0) -> tuple[int, int, int, int]:
    """(R rows a tile, S stages, the grid, dynamic shared bytes) for a matrix of ``rows``
    rows of ``rb`` bytes on ``sms`` multiprocessors; ``extra``: shared bytes beyond the
    stages (x staged by the norm's prologue)."""
    blocks = sms * BLOCKS_PER_SM
    fits = [r for r in (8, 4, 2, 1) if r * rb <= TILE_BYTES] or [1]
    tile_r = next((r for r in fits if -(-rows // r) >= TILES_A_BLOCK * blocks), fits[-1])
    tb = tile_r * rb
    stages = max(MIN_STAGES, min(MAX_STAGES, STAGE_BYTES // tb))
    grid = min(blocks, -(-rows // tile_r))
    return tile_r, stages, grid, HEADER + stages * tb + extra


def x_bytes(nr: int, cols: int) -> int:
    """Shared bytes of nr rows of x staged by the norm's prologue (int8 values, then their
    groups' float2 scales)."""
    return nr * cols + nr * (cols // 32) * 8


Grow = Callable[[Any, int], None]


class SharedLimits:
    """Kernels' dynamic shared memory limits, raised as plans need them (past 48 KB a kernel
    must ask): called with the kernel (CuPy's, or a cuda_launch.Kernel around one)."""

    def __init__(self) -> None:
        self.limits: dict[int, int] = {}

    def __call__(self, kern: Any, nbytes: int) -> None:
        raw = getattr(kern, "fn", kern)
        if nbytes > self.limits.get(id(raw), 48 << 10):
            raw.max_dynamic_shared_size_bytes = nbytes
            self.limits[id(raw)] = nbytes


def pipe_takes(dev: Any, w: Any, n: int) -> bool:
    """Whether the device's pipelined GEMV takes n rows (of every part of ``w``, where given):
    ``MODELC_CUDA_GEMV=pipe``, compute capability 9.0+, the int8 path's rows, not exact."""
    on = dev.gemv_kind == "pipe" and dev.pipe_ok and n <= dev.gemv_max and not dev.exact
    return on and (w is None or all(p.layout or p.code in WIDE_TYPES for p in w.parts))


def normed(dev: Any, x: Any, n: int, wn: Any, eps: float, w: Any, y: Any) -> bool:
    """``y[:n] = (x[:n] / rms * wn) . w`` with each part's GEMV norming x in its prologue
    (:func:`launch_normed`), where the pipelined GEMV takes it (``dev.pipe_norm``, up to 8 rows,
    a norm as wide as w): whether it did."""
    if not (dev.pipe_norm and n <= max(WIDE_ROWS) and int(wn.shape[0]) == w.cols):
        return False
    if not pipe_takes(dev, w, n):
        return False
    for p, yp in w.columns(y):
        launch_normed(dev.fn, dev.sms, p, x, n, wn, eps, yp, dev.shared)
    return True


def launch(
    fn: dict[str, Any], sms: int, p: Any, q8: tuple[Any, Any], n: int, y: Any, ldy: int,
    acc: bool, grow: Grow,
) -> None:  # fmt: skip
    """``y[:n] (+)= xq[:n] . p`` by ``gemvp`` (launches of at most 8 rows of x); ``grow(fn,
    bytes)``: raises a kernel's dynamic shared memory limit when a plan needs more."""
    tile_r, stages, grid, smem = plan(p.rows, p.row_bytes, sms)
    for nr, args in passes(p, q8, n, y, ldy, acc):
        kern = fn[f"gemvp_{p.code}_{nr}"]
        grow(kern, smem)
        kern((grid,), (256,), (*args, np.int32(tile_r), np.int32(stages)), shared_mem=smem)


def launch_normed(
    fn: dict[str, Any], sms: int, p: Any, x: Any, n: int, wn: Any, eps: float, y: Any,
    grow: Grow,
) -> None:  # fmt: skip
    """``y[:n] = (x[:n] / rms * wn) . p`` by ``gemvpn``: the norm and the activations'
    quantizing in each block's prologue (no launch of their own); n <= 8."""
    nr = next(r for r in WIDE_ROWS if r >= n)
    tile_r, stages, grid, smem = plan(p.rows, p.row_bytes, sms, x_bytes(nr, p.cols))
    kern = fn[f"gemvpn_{p.code}_{nr}"]
    grow(kern, smem)
    args: tuple[Any, ...] = (p.data, np.int64(p.row_bytes), np.int32(p.rows), np.int32(p.cols), x)
    args += (np.int32(x.strides[0] // 4), wn, np.float32(eps), np.int32(n), y)
    args += (np.int32(y.strides[0] // 4), np.int32(0), np.int32(tile_r), np.int32(stages))
    kern((grid,), (256,), args, shared_mem=smem)
