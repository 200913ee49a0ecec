"""The CUDA backend: kernels compiled at run time by NVRTC through CuPy, weights on the GPU
in their GGUF blocks.

* :class:`Device` compiles :mod:`.cuda_src` (with the modules it gathers) once a process
  and launches its kernels: for decode and small batches (up to ``MODELC_CUDA_GEMV_MAX``
  rows, 8) a GEMV straight from the quantized blocks, the activations quantized to 8 bits
  and ``dp4a`` dot products (as llama.cpp's ``mmvq``; the kernel before a product quantizes
  its output in the same launch): 16-byte loads for Q4_0 / Q4_K / Q6_K (:mod:`.cuda_gemvw`,
  the default; :mod:`.cuda_gemvp` opt-in), :mod:`.cuda_gemvq` for Q8_0 / Q5_K, the float
  ``gemv4`` for the other types and in exact mode (``MODELC_MATMUL=exact``, the CPU
  backend's switch for parity with a float reference); for more rows, the weight
  dequantized into a scratch matrix (``deq8``) and one cuBLAS ``gemmEx`` (:mod:`.cuda_blas`;
  f16 tensor cores, f32 in exact mode), captured in the step's CUDA graph like the rest.
* :class:`~.cuda_weights.DevWeight` is a weight uploaded once: Q4_0, Q4_1, Q5_0, Q5_1,
  Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS, MXFP4, BF16, F16 and F32 as stored; the other GGUF
  types dequantized to F16 at upload.
* :class:`CudaBackend` is the :class:`~modelc.runtime.backend.Backend` for op-level parity
  tests; the model-level path that keeps a step on the device is
  :class:`~modelc.runtime.backends.cuda_llama.CudaLlama`, its KV cache in :mod:`.cuda_kv`.

CuPy is imported only here; without it (or without a GPU) :func:`cuda_unavailable`
says why in one line and ``get_backend("cuda")`` raises :class:`UsageError`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelc.errors import UnsupportedError, UsageError
from modelc.runtime.backend import Weight
from modelc.runtime.backends import cuda_argmax, cuda_gemvp, cuda_gemvw, cuda_repack
from modelc.runtime.backends.cuda_attn import MMA_ROWS
from modelc.runtime.backends.cuda_attn import ROWS as TILE_ROWS
from modelc.runtime.backends.cuda_attn import runs as attn_tiles_run
from modelc.runtime.backends.cuda_blas import Blas, open_blas
from modelc.runtime.backends.cuda_decode import split_args
from modelc.runtime.backends.cuda_deq import can_vec, launch_shape
from modelc.runtime.backends.cuda_gemvq import Q8_TYPES, q8_bytes
from modelc.runtime.backends.cuda_launch import kernels
from modelc.runtime.backends.cuda_norm import aligned
from modelc.runtime.backends.cuda_norm import threads as norm_threads
from modelc.runtime.backends.cuda_scratch import Scratch
from modelc.runtime.backends.cuda_src import (
    ATTN_WARPS,
    GEMV_ROWS,
    HEAD_LANES,
    kernel_names,
    source,
)
from modelc.runtime.backends.cuda_weights import CODES, DevPart, DevWeight, host_part

GEMV_MAX = max(GEMV_ROWS)  # rows a GEMV pass takes
GEMV_ROWS_DEFAULT = 8  # rows up to which a product takes GEMV passes, not cuBLAS
WIDE_KINDS = ("wide", "pipe")  # the GEMV kinds that read the wide layouts (cuda_gemvw)
GEMV_KIND = "wide"  # an H100: 1.1B Q4_K_M one stream 749 -> 929 tok/s, 8B 212 -> 292


def _import_cupy() -> Any:
    return importlib.import_module("cupy")


def cuda_unavailable() -> str | None:
    """Why the CUDA backend cannot run here (one line), or None when it can."""
    try:
        cp = _import_cupy()
    except ImportError:
        return "CuPy is not installed (pip install cupy-cuda13x, or cupy-cuda12x for CUDA 12)"
    try:
        n = int(cp.cuda.runtime.getDeviceCount())
    except Exception as e:  # no driver, no device: CuPy raises its own runtime errors
        return f"no usable CUDA device ({str(e).splitlines()[0]})"
    return None if n > 0 else "no CUDA device found"


def require_cuda() -> Any:
    """CuPy, or a one-line UsageError saying why CUDA cannot be used."""
    why = cuda_unavailable()
    if why is not None:
        raise UsageError(f"--device cuda: {why}; use --device cpu")
    return _import_cupy()


def gpu_memory() -> tuple[int, int] | None:
    """The GPU's (free, total) bytes as the driver reports them, after handing CuPy's
    cached free blocks back (so what unloaded models held counts as free); None without a
    usable GPU."""
    if cuda_unavailable() is not None:
        return None
    cp = _import_cupy()
    cp.get_default_memory_pool().free_all_blocks()
    free, total = cp.cuda.runtime.memGetInfo()
    return int(free), int(total)


def exact_mode() -> bool:
    return os.environ.get("MODELC_MATMUL", "fast") == "exact"


class Device:
    """The compiled kernels and the launches the CUDA paths share."""

    def __init__(self) -> None:
        self.cp = require_cuda()
        mod = self.cp.RawModule(code=source(), options=("-std=c++17",), name_expressions=None)
        self.fn = kernels(self.cp, {n: mod.get_function(n) for n in kernel_names()})
        self.scratch = Scratch(self.cp)
        dev = self.cp.cuda.Device()
        self.sms = int(dev.attributes["MultiProcessorCount"])
        self.pipe_ok = int(dev.compute_capability) >= 90  # gemvp's bulk copies
        self.shared = cuda_gemvp.SharedLimits()
        self.read_env()
        self.blas: Blas | None = open_blas(self.cp)

    def read_env(self) -> None:
        """The kernels' settings as the environment gives them (the defaults where it is
        silent); tests that change them call this to put them back."""
        self.exact = exact_mode()
        # wide (default: q8's arithmetic with cuda_gemvw's 16-byte loads for Q4_0 / Q4_K /
        # Q6_K, Q4_0 and Q6_K repacked at upload; q8 for the other types), q8 (int8
        # activations and dp4a for Q4_0 / Q8_0 / Q4_K / Q5_K / Q6_K; gemv4 for the rest and
        # in exact mode), gemv4 (float, coalesced) or gemv (a lane a group); rows up to
        # gemv_max take GEMV, more cuBLAS (an H100: q8 passes of 8 rows and cuBLAS for 16
        # take about the same time, cuBLAS 2.5x less for 16-32 rows)
        self.gemv_kind = os.environ.get("MODELC_CUDA_GEMV", GEMV_KIND)
        self.deq_kind = os.environ.get("MODELC_CUDA_DEQ", "deq8")  # or deq32 (the first)
        self.f16_cache = os.environ.get("MODELC_CUDA_F16_CACHE", "0") == "1"
        self.gemv_max = int(os.environ.get("MODELC_CUDA_GEMV_MAX", str(GEMV_ROWS_DEFAULT)))
        self.split_k = os.environ.get("MODELC_CUDA_SPLIT_K", "1") != "0"
        self.wpr = 0  # the wide GEMV's warps a row (0: cuda_gemvw.split's; a sweep sets it)
        # decode attention in S runs of positions a row and head, merged (flash-decoding)
        self.attn_split = max(1, int(os.environ.get("MODELC_CUDA_ATTN_SPLIT", "1")))
        # the wide GEMV's grid capped at this many resident waves of blocks (0: no cap)
        self.waves = int(os.environ.get("MODELC_CUDA_GEMV_WAVES", "0"))
        # with the pipelined GEMV: the RMS norm before QKV and gate/up in its prologue
        self.pipe_norm = os.environ.get("MODELC_CUDA_PIPE_NORM", "1") != "0"
        # prompt tiles of an f16 cache on tensor cores (cuda_attn.attend_mma: f16 queries and
        # probabilities), else in floats; never in exact mode
        self.attn_mma = os.environ.get("MODELC_CUDA_ATTN_MMA", "1") != "0" and not self.exact

    # -- weights -----------------------------------------------------------------------
    def upload(self, ws: Sequence[Weight]) -> DevWeight:
        """Weights of equal width stacked by rows (one part per run of one type)."""
        cols = ws[0].shape[1]
        if any(w.shape[1] != cols for w in ws) or cols % 32:
            raise UnsupportedError(f"CUDA matmul needs widths that are multiples of 32, got {cols}")
        hosts = [host_part(w) for w in ws]
        parts: list[DevPart] = []
        i = 0
        while i < len(hosts):
            j = i
            while j + 1 < len(hosts) and hosts[j + 1][1] is hosts[i][1]:
                j += 1
            data = np.concatenate([h[0] for h in hosts[i : j + 1]]) if j > i else hosts[i][0]
            code = CODES[hosts[i][1]]
            wide = self.gemv_kind in WIDE_KINDS and not self.exact
            data, layout = cuda_repack.host_layout(code, data, cols, wide)
            dev = self.cp.asarray(np.ascontiguousarray(data))
            rows, rb = int(data.shape[0]), int(data.shape[1])
            parts.append(DevPart(dev, code, rows, cols, rb, layout=layout))
            i = j + 1
        return DevWeight(parts, sum(p.rows for p in parts), cols)

    # -- launches ----------------------------------------------------------------------
    def dequant(self, p: DevPart, ids: Any, n: int, out: Any, ldo: int, f16: bool = False) -> None:
        """Rows ``ids`` (device int64, or None for 0..n-1) of ``p`` into ``out`` (n, ldo)."""
        ids_arg = ids if ids is not None else np.uint64(0)
        if self.deq_kind == "deq8" or p.layout:  # a repacked part: deq8w (cuda_gemvw's deq4w)
            blocks, bpr = launch_shape(n, p.cols)
            vec = can_vec(int(out.data.ptr), ldo, 2 if f16 else 4)
            self.fn[f"deq8{'w' if p.layout else ''}_{p.code}_{int(f16)}"](
                (blocks,),
                (256,),
                (p.data, np.int64(p.row_bytes), np.int32(p.cols), ids_arg, np.int32(bpr), out,
                 np.int32(ldo), np.int32(vec)),
            )  # fmt: skip
            return
        total = n * (p.cols // 32)
        self.fn[f"deq_{p.code}_{int(f16)}"](
            ((total + 127) // 128,),
            (128,),
            (p.data, np.int64(p.row_bytes), np.int32(p.cols), ids_arg, np.int32(n), out,
             np.int32(ldo)),
        )  # fmt: skip

    def reserve_q8(self, n: int, cols: int) -> Any:
        """Scratch for n rows of ``cols`` quantized activations (its bytes:
        :func:`~.cuda_gemvq.q8_bytes`), made now where it is not yet (not inside a graph
        capture)."""
        return self.scratch.get("xq", sum(q8_bytes(n, cols)), np.uint8)

    def _q8_views(self, n: int, cols: int) -> tuple[Any, Any]:
        qb, sb = q8_bytes(n, cols)
        xq = self.reserve_q8(n, cols)
        return xq[:qb], xq[qb : qb + sb]

    def _quant_q8(self, x: Any, ldx: int, n: int, cols: int) -> tuple[Any, Any]:
        """x[:n] (f32, row stride ldx) to 8 bits in groups of 32: (xq (n, cols) int8,
        xs (n, cols / 32, 2) f32 scale and sum), in scratch reused by every product."""
        xq, xs = self._q8_views(n, cols)
        warps = n * (cols // 32)
        self.fn["quant_q8"](
            ((warps + 7) // 8,), (256,), (x, np.int32(ldx), np.int32(cols), np.int32(n), xq, xs)
        )
        return xq, xs

    def _dense(self, p: DevPart) -> Any:
        """p dequantized for cuBLAS (f16; f32 when exact): into the scratch matrix each
        product, or once into a copy kept on the part (``MODELC_CUDA_F16_CACHE=1``, f16
        only: 2 bytes a weight more on the GPU, no dequantizing in the steps)."""
        if self.f16_cache and not self.exact:
            if p.dense16 is None:  # made eagerly: the cuBLAS path runs once before a capture
                p.dense16 = self.cp.empty((p.rows, p.cols), np.float16)
                self.dequant(p, None, p.rows, p.dense16, p.cols, f16=True)
            return p.dense16
        dt = np.float32 if self.exact else np.float16
        size = p.rows * p.cols * np.dtype(dt).itemsize
        wd = self.scratch.get("deq", size, np.uint8, double=False)[:size].view(dt)
        wd = wd.reshape(p.rows, p.cols)
        self.dequant(p, None, p.rows, wd, p.cols, f16=not self.exact)
        return wd

    def _use_q8(self, w: DevWeight, n: int) -> bool:
        on = n <= self.gemv_max and self.gemv_kind in ("q8", *WIDE_KINDS) and not self.exact
        return on and any(p.code in Q8_TYPES for p in w.parts)

    def _wpr(self, p: DevPart, per_pass: int) -> int:
        """Warps a row: up to ~16k warps in all, each with >= 4 passes of ``per_pass``
        groups (bench/cuda_gemv_sweep.py on an H100: within ~10 % of the fastest split
        for each 1.1B and 8B shape; more warps than that wait for a second wave)."""
        wpr, want, ng = 1, max(1, 16384 // p.rows), p.cols // 32
        while self.split_k and wpr * 2 <= min(8, want) and 4 * per_pass * wpr * 2 <= ng:
            wpr *= 2
        return wpr

    def _gemv(
        self, p: DevPart, x: Any, ldx: int, n: int, y: Any, ldy: int, acc: bool, q8: Any = None
    ) -> None:
        nr = next(r for r in GEMV_ROWS if r >= n)
        wide = p.layout or (self.gemv_kind in WIDE_KINDS and p.code in cuda_gemvw.WIDE_TYPES)
        if q8 is not None and wide and cuda_gemvp.pipe_takes(self, None, n):
            cuda_gemvp.launch(self.fn, self.sms, p, q8, n, y, ldy, acc, self.shared)  # bulk copies
            return
        if q8 is not None and wide:
            cuda_gemvw.launch(
                self.fn, p, q8, n, y, ldy, acc, self.sms, self.waves, self.wpr, self.split_k
            )  # 16-byte loads, cuda_gemvw.split's warps a row
            return
        if q8 is not None:  # x quantized by _quant_q8
            wpr = self._wpr(p, 8)
            qa = (p.data, np.int64(p.row_bytes), np.int32(p.rows), np.int32(p.cols), *q8)
            qa += (np.int32(n), y, np.int32(ldy), np.int32(int(acc)), np.int32(wpr))
            grid = ((p.rows + 8 // wpr - 1) // (8 // wpr),)
            self.fn[f"gemvq_{p.code}_{nr}"](grid, (256,), qa)
            return
        args = [p.data, np.int64(p.row_bytes), np.int32(p.rows), np.int32(p.cols), x]
        args += [np.int32(ldx), np.int32(n), y, np.int32(ldy), np.int32(int(acc))]
        if self.gemv_kind == "gemv":
            self.fn[f"gemv_{p.code}_{nr}"](((p.rows * 32 + 255) // 256,), (256,), tuple(args))
            return
        wpr = self._wpr(p, 4)
        rpb = 8 // wpr
        grid = ((p.rows + rpb - 1) // rpb,)
        self.fn[f"gemv4_{p.code}_{nr}"](grid, (256,), (*args, np.int32(wpr)))

    def norm_matmul(
        self, x: Any, n: int, wn: Any, eps: float, h: Any, w: DevWeight, y: Any
    ) -> None:
        """``h[:n] = rms_norm(x[:n]) * wn``, then ``y[:n] = h[:n] @ dequant(w).T``; on the q8
        path the norm also quantizes its output for the GEMV (one launch, not two); on the
        pipelined GEMV (up to 8 rows) each GEMV block norms and quantizes x itself, and h is
        left unwritten (a scratch its callers do not read after)."""
        if cuda_gemvp.normed(self, x, n, wn, eps, w, y):  # the GEMVs norm x themselves
            return
        if not self._use_q8(w, n) or int(wn.shape[0]) != w.cols:
            self.rms_norm(x, None, n, wn, eps, h)
            self.matmul(w, h, n, y)
            return
        self.matmul(w, h, n, y, q8=self.norm_q8(x, n, wn, eps, h, w.cols))

    def norm_q8(self, x: Any, n: int, wn: Any, eps: float, h: Any, d: int) -> tuple[Any, Any]:
        """``h[:n] = rms_norm(x[:n]) * wn`` and its values quantized for the int8 GEMV."""
        (xq, xs), nt = self._q8_views(n, d), self._v4(x, h, wn)
        self.fn["rms_norm_q8" if nt is None else "rms_norm_v4_q8"](
            (n,),
            (nt or 256,),
            (x, np.int32(x.strides[0] // 4), wn, np.float32(eps), np.int32(d), h,
             np.int32(h.strides[0] // 4), xq, xs),
        )  # fmt: skip
        return xq, xs

    @staticmethod
    def _v4(x: Any, out: Any, w: Any) -> int | None:
        """Threads a block for the register norms (:mod:`.cuda_norm`) of rows of x into
        out, or None where they do not take them (sizes, alignment)."""
        nt = norm_threads(int(w.shape[0]))
        ptrs = (x.data.ptr, x.strides[0], out.data.ptr, out.strides[0], w.data.ptr)
        return nt if nt is not None and aligned(*(int(v) for v in ptrs)) else None

    def matmul(
        self, w: DevWeight, x: Any, n: int, y: Any, acc: bool = False, q8: Any = None
    ) -> None:
        """``y[:n] (+)= x[:n] @ dequant(w).T``; x (>=n, cols) and y (>=n, w.rows) f32 on device.

        Up to ``gemv_max`` rows: GEMV passes of at most 16 rows straight from the blocks;
        more: the weight dequantized into a scratch matrix (f16, f32 when ``exact``) and one
        cuBLAS product (direct ``gemmEx`` when :mod:`.cuda_blas` works, else ``cupy.matmul``).
        ``q8``: x already quantized (:meth:`norm_matmul`)."""
        ldx, ldy = int(x.strides[0]) // 4, int(y.strides[0]) // 4
        if q8 is None and self._use_q8(w, n):  # x quantized once for every part
            q8 = self._quant_q8(x, ldx, n, w.cols)
        for p, yp in w.columns(y):
            if n <= self.gemv_max and (q8 is not None or not p.layout):  # repacked: int8 only
                for r0 in range(0, n, GEMV_MAX):
                    m, xr, yr = min(GEMV_MAX, n - r0), x[r0:] if r0 else x, yp[r0:] if r0 else yp
                    qr = None
                    if q8 is not None and p.code in Q8_TYPES:  # pass r0's rows of xq and xs
                        qb, sb = q8_bytes(r0, w.cols)
                        qr = (q8[0][qb:], q8[1][sb:])
                    self._gemv(p, xr, ldx, m, yr, ldy, acc, qr)
            else:
                wd = self._dense(p)
                if self.blas is not None:
                    xs, ldxs = x, ldx
                    if not self.exact:
                        xs, ldxs = self.scratch.get("x16", n * p.cols, np.float16), p.cols
                        total = n * p.cols
                        self.fn["to_f16"](
                            ((total + 255) // 256,),
                            (256,),
                            (x, np.int32(ldx), np.int32(p.cols), np.int64(total), xs),
                        )
                    self.blas.gemm(wd, not self.exact, xs, ldxs, n, yp, ldy, acc)
                else:
                    xh = x[:n] if self.exact else x[:n].astype(np.float16)
                    prod = self.cp.matmul(xh, wd.T)
                    dst = yp[:n, : p.rows]
                    if acc:
                        dst += prod
                    else:
                        dst[...] = prod

    def rms_norm(
        self, x: Any, rows: Any, n: int, w: Any, eps: float, out: Any, acc: bool = False
    ) -> None:
        """out[i] (+)= rms_norm(x[rows[i]]) * w for i < n (rows None: x[i])."""
        d = int(w.shape[0])
        nt = self._v4(x, out, w)
        self.fn["rms_norm" if nt is None else "rms_norm_v4"](
            (n,),
            (nt or 256,),
            (x, np.int32(x.strides[0] // 4), rows if rows is not None else np.uint64(0), w,
             np.float32(eps), np.int32(d), out, np.int32(out.strides[0] // 4), np.int32(acc)),
        )  # fmt: skip

    def head_norm(
        self, qkv: Any, n: int, nh: int, nkv: int, hd: int, qn: Any, kn: Any, eps: float
    ) -> None:
        """Each Q and K head of the first n rows of qkv RMS-normed in place (qn, kn: (hd,))."""
        width = np.int32(qkv.strides[0] // 4)
        args = (qkv, width, np.int32(nh), np.int32(hd), qn, kn, np.float32(eps))
        self.fn["head_norm"]((n, nh + nkv), (32,), args)

    def _elementwise(self, name: str, x: Any, total: int, c: float) -> None:
        self.fn[name](((total + 255) // 256,), (256,), (x, np.int64(total), np.float32(c)))

    def scale(self, x: Any, total: int, s: float) -> None:
        """The first ``total`` values of contiguous x times s."""
        self._elementwise("scale_f32", x, total, s)

    def softcap(self, x: Any, total: int, c: float) -> None:
        """The first ``total`` values of contiguous x to c * tanh(x / c)."""
        self._elementwise("softcap_f32", x, total, c)

    def act_mul(
        self, gu: Any, n: int, ff: int, out: Any, gelu: bool = False, then: DevWeight | None = None
    ) -> Any:
        """silu (or gelu_tanh)(gu[:, :ff]) * gu[:, ff:] -> out (n, ff); where ``then`` (the
        next product, of out) takes the q8 path, out quantized in the same launch: returns
        what :meth:`matmul`'s ``q8`` takes, else None."""
        act = "gelu_mul" if gelu else "silu_mul"
        if then is not None and self._use_q8(then, n) and then.cols == ff:
            xq, xs = self._q8_views(n, ff)
            warps = n * (ff // 32)
            args = (gu, np.int32(ff), np.int32(n), out, xq, xs)
            self.fn[f"{act}_q8"](((warps + 7) // 8,), (256,), args)
            return xq, xs
        total = n * ff
        self.fn[act](((total + 255) // 256,), (256,), (gu, np.int32(ff), np.int64(total), out))
        return None

    def attention(
        self,
        q: Any,
        meta: tuple[Any, Any, Any, Any],
        n: int,
        nh: int,
        nkv: int,
        hd: int,
        f16: bool,
        scale: float,
        window: int,
        layer: int,
        out: Any,
        softcap: float = 0.0,
        then: DevWeight | None = None,
        tiles: tuple[Any, int] | None = None,
        rope: tuple[Any, Any, Any, bool] | None = None,
        sinks: Any = None,
    ) -> Any:
        """Query rows (n, nh, hd) over their sequences' caches; meta = pos, seq, base, cap;
        ``window`` > 0 sees the last ``window`` positions, ``softcap`` > 0 caps the scores.
        ``tiles`` (device (first row, rows) pairs of each chunk's runs, and their count:
        :func:`.cuda_attn.tiles`): the rows a tile at a time (:mod:`.cuda_attn`; head sizes
        32..128), for steps with prompt chunks.  Where ``then`` (the next product, of out)
        takes the q8 path, out is quantized in the same launch (head sizes 32, 64, 128,
        256): returns :meth:`matmul`'s ``q8``, else None.  ``rope`` (qkv, bias, inv_freq,
        neox; a decode step): rope_store's work done here (:mod:`.cuda_decode`).  ``sinks``
        (nh,) on the device: each head's sink logit in its softmax's denominator (gpt-oss)."""
        e = hd // 32
        if hd % 32 or e not in HEAD_LANES:
            raise UnsupportedError(f"CUDA attention takes head sizes 32..256 by 32s, got {hd}")
        pos, seq, base, cap = meta
        sk = sinks if sinks is not None else np.uint64(0)
        if tiles is not None and attn_tiles_run(hd):  # tensor cores (4 warps) or floats (8)
            mma = self.tile_rows(f16) == MMA_ROWS
            name = f"attn_mma_{e}" if mma else f"attn_tile_{'f16' if f16 else 'f32'}_{e}"
            self.fn[name](
                (tiles[1], nh),
                (128 if mma else 256,),
                (q, pos, seq, base, cap, tiles[0], np.int32(nh), np.int32(nkv),
                 np.float32(scale), np.int32(window), np.float32(softcap), np.int32(layer), out, sk),
            )  # fmt: skip
            return None
        q8: Any = None
        if then is not None and 32 % e == 0 and then.cols == nh * hd and self._use_q8(then, n):
            q8 = self._q8_views(n, nh * hd)
        self.fn[f"attn_{'f16' if f16 else 'f32'}_{e}"](
            (n, nh, self.attn_split),
            (32 * ATTN_WARPS,),
            (q, pos, seq, base, cap, np.int32(nh), np.int32(nkv), np.float32(scale),
             np.int32(window), np.float32(softcap), np.int32(layer), out,
             *(q8 if q8 is not None else (np.uint64(0), np.uint64(0))),
             *split_args(self.scratch, n, nh, hd, self.attn_split),
             *(rope[:3] if rope else (np.uint64(0),) * 3), np.int32(bool(rope and rope[3])), sk),
        )  # fmt: skip
        return q8

    def tile_rows(self, f16: bool) -> int:
        """Rows a tile of :meth:`attention`'s ``tiles`` (:func:`.cuda_attn.tiles`) holds:
        :data:`~.cuda_attn.MMA_ROWS` on tensor cores (an f16 cache), else
        :data:`~.cuda_attn.ROWS`."""
        return MMA_ROWS if f16 and self.attn_mma else TILE_ROWS

    def argmax(self, x: Any, n: int, out: Any) -> None:
        """out[i] = the first index of row i's largest value, i < n (rows of x contiguous)."""
        cuda_argmax.launch(self.fn, self.scratch, x, n, out)


_DEVICE: Device | None = None


def device() -> Device:
    """The process's compiled kernels (compiled on first use; NVRTC's cache keeps them)."""
    global _DEVICE
    if _DEVICE is None:
        _DEVICE = Device()
    return _DEVICE


def head_runs(hd: int) -> bool:
    """Whether the attention kernels are built for head size ``hd`` (32..256 by 32s)."""
    return hd % 32 == 0 and hd // 32 in HEAD_LANES
