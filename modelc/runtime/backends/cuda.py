"""The CUDA backend: kernels compiled at run time by NVRTC through CuPy, weights on the GPU
in their GGUF blocks.

* :class:`Device` compiles :mod:`.cuda_src` (+ :mod:`.cuda_gemv`) once a process and
  launches its kernels: GEMV straight from the quantized blocks (a weight row split over
  1..8 warps, lanes reading 4 weights each so activations load coalesced; up to 16
  activation rows a pass) for decode and small batches (``MODELC_CUDA_GEMV_MAX``, 16);
  for more rows, the weight dequantized into a scratch matrix and one cuBLAS ``gemmEx``
  (:mod:`.cuda_blas`; f16 tensor cores, f32 with ``MODELC_MATMUL=exact``, the CPU
  backend's switch for parity with a float reference).
* :class:`DevWeight` is a weight uploaded once: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K,
  IQ4_NL, IQ4_XS, F16 and F32 as stored; BF16 widened to F32 and the other GGUF types
  dequantized to F16 at upload.
* :class:`CudaBackend` is the :class:`~modelc.runtime.backend.Backend` (numpy in, numpy
  out) whose matmul, rows, norm, SiLU and attention run these kernels, for op-level
  parity tests; the model-level path that keeps a step on the device is
  :class:`~modelc.runtime.backends.cuda_llama.CudaLlama`, with its KV cache in
  :mod:`.cuda_kv`.

CuPy is imported only here; without it (or without a GPU) :func:`cuda_unavailable`
says why in one line and ``get_backend("cuda")`` raises :class:`UsageError`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelc.errors import UnsupportedError, UsageError
from modelc.formats.ir import DType
from modelc.runtime.backend import F32Array, KVArray, Weight
from modelc.runtime.backends.cuda_blas import Blas, open_blas
from modelc.runtime.backends.cuda_src import GEMV_ROWS, HEAD_LANES, kernel_names, source
from modelc.runtime.backends.fallback import NumpyFallback
from modelc.runtime.backends.numpy_ref import dequantize_weight

CODES: dict[DType, int] = {
    DType.F32: 0,
    DType.F16: 1,
    DType.Q4_0: 2,
    DType.Q4_1: 3,
    DType.Q8_0: 8,
    DType.Q4_K: 12,
    DType.Q6_K: 14,
    DType.Q5_0: 6,
    DType.Q5_1: 7,
    DType.Q2_K: 10,
    DType.Q3_K: 11,
    DType.Q5_K: 13,
    DType.IQ4_NL: 20,
    DType.IQ4_XS: 23,
}
GEMV_MAX = max(GEMV_ROWS)


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


def exact_mode() -> bool:
    return os.environ.get("MODELC_MATMUL", "fast") == "exact"


@dataclass(slots=True)
class DevPart:
    """One uploaded block of weight rows of a single type."""

    data: Any  # cupy uint8 (rows, row_bytes)
    code: int  # CODES value
    rows: int
    cols: int
    row_bytes: int


@dataclass(slots=True)
class DevWeight:
    """A weight (or several stacked by rows: Q/K/V, gate/up) held on the device."""

    parts: list[DevPart]
    rows: int
    cols: int

    @property
    def nbytes(self) -> int:
        return sum(int(p.data.nbytes) for p in self.parts)


def _host_part(w: Weight) -> tuple[np.ndarray[Any, Any], DType]:
    """The bytes to upload for ``w`` and the type they are in."""
    if w.dtype in CODES:
        return np.ascontiguousarray(w.data).view(np.uint8).reshape(w.shape[0], -1), w.dtype
    if w.dtype is DType.BF16:
        return dequantize_weight(w).view(np.uint8), DType.F32
    return dequantize_weight(w).astype(np.float16).view(np.uint8), DType.F16


class Device:
    """The compiled kernels and the launches the CUDA paths share."""

    def __init__(self) -> None:
        self.cp = require_cuda()
        mod = self.cp.RawModule(code=source(), options=("-std=c++17",), name_expressions=None)
        self.fn = {n: mod.get_function(n) for n in kernel_names()}
        self.exact = exact_mode()
        self._deq_buf: Any = None
        self._x16: Any = None
        self._retired: list[Any] = []  # outgrown scratch, kept: captured graphs may use it
        # gemv4 (coalesced; default) or gemv (a lane a group); rows up to gemv_max take GEMV
        self.gemv_kind = os.environ.get("MODELC_CUDA_GEMV", "gemv4")
        self.gemv_max = int(os.environ.get("MODELC_CUDA_GEMV_MAX", str(GEMV_MAX)))
        self.split_k = os.environ.get("MODELC_CUDA_SPLIT_K", "1") != "0"
        self.blas: Blas | None = open_blas(self.cp)

    # -- weights -----------------------------------------------------------------------
    def upload(self, ws: Sequence[Weight]) -> DevWeight:
        """Weights of equal width stacked by rows (one part per run of one type)."""
        cols = ws[0].shape[1]
        if any(w.shape[1] != cols for w in ws) or cols % 32:
            raise UnsupportedError(f"CUDA matmul needs widths that are multiples of 32, got {cols}")
        hosts = [_host_part(w) for w in ws]
        parts: list[DevPart] = []
        i = 0
        while i < len(hosts):
            j = i
            while j + 1 < len(hosts) and hosts[j + 1][1] is hosts[i][1]:
                j += 1
            data = np.concatenate([h[0] for h in hosts[i : j + 1]]) if j > i else hosts[i][0]
            dev = self.cp.asarray(np.ascontiguousarray(data))
            parts.append(
                DevPart(dev, CODES[hosts[i][1]], int(data.shape[0]), cols, int(data.shape[1]))
            )
            i = j + 1
        return DevWeight(parts, sum(p.rows for p in parts), cols)

    # -- launches ----------------------------------------------------------------------
    def _deq_scratch(self, n: int, dtype: Any) -> Any:
        size = n * np.dtype(dtype).itemsize
        if self._deq_buf is None or self._deq_buf.nbytes < size:
            self._retired.append(self._deq_buf)  # captured graphs may still point at it
            self._deq_buf = self.cp.empty(size, np.uint8)
        return self._deq_buf[:size].view(dtype)

    def dequant(self, p: DevPart, ids: Any, n: int, out: Any, ldo: int, f16: bool = False) -> None:
        """Rows ``ids`` (device int64, or None for 0..n-1) of ``p`` into ``out`` (n, ldo)."""
        total = n * (p.cols // 32)
        ids_arg = ids if ids is not None else np.uint64(0)
        self.fn[f"deq_{p.code}_{int(f16)}"](
            ((total + 127) // 128,),
            (128,),
            (p.data, np.int64(p.row_bytes), np.int32(p.cols), ids_arg, np.int32(n), out,
             np.int32(ldo)),
        )  # fmt: skip

    def _scratch16(self, n: int) -> Any:
        if self._x16 is None or self._x16.size < n:
            self._retired.append(self._x16)
            self._x16 = self.cp.empty(
                max(n, 2 * (0 if self._x16 is None else self._x16.size)), np.float16
            )
        return self._x16[:n]

    def _gemv(self, p: DevPart, x: Any, ldx: int, n: int, y: Any, ldy: int, acc: bool) -> None:
        nr = next(r for r in GEMV_ROWS if r >= n)
        args = [p.data, np.int64(p.row_bytes), np.int32(p.rows), np.int32(p.cols), x]
        args += [np.int32(ldx), np.int32(n), y, np.int32(ldy), np.int32(int(acc))]
        if self.gemv_kind == "gemv":
            self.fn[f"gemv_{p.code}_{nr}"](((p.rows * 32 + 255) // 256,), (256,), tuple(args))
            return
        # warps a row: enough warps in flight (~32k), each with >= 2 passes of 4 groups
        wpr, want, ng = 1, max(1, 32768 // p.rows), p.cols // 32
        while self.split_k and wpr * 2 <= min(8, want) and 16 * wpr <= ng:
            wpr *= 2
        rpb = 8 // wpr
        grid = ((p.rows + rpb - 1) // rpb,)
        self.fn[f"gemv4_{p.code}_{nr}"](grid, (256,), (*args, np.int32(wpr)))

    def matmul(self, w: DevWeight, x: Any, n: int, y: Any, acc: bool = False) -> None:
        """``y[:n] (+)= x[:n] @ dequant(w).T``; x (>=n, cols) and y (>=n, w.rows) f32 on device.

        Up to ``gemv_max`` rows: GEMV passes of at most 16 rows straight from the blocks;
        more: the weight dequantized into a scratch matrix (f16, f32 when ``exact``) and one
        cuBLAS product (direct ``gemmEx`` when :mod:`.cuda_blas` works, else ``cupy.matmul``)."""
        col0 = 0
        ldx, ldy = int(x.strides[0]) // 4, int(y.strides[0]) // 4
        for p in w.parts:
            yp = y[:, col0:] if col0 else y
            if n <= self.gemv_max:
                for r0 in range(0, n, GEMV_MAX):
                    m = min(GEMV_MAX, n - r0)
                    self._gemv(p, x[r0:] if r0 else x, ldx, m, yp[r0:] if r0 else yp, ldy, acc)
            else:
                dt = np.float32 if self.exact else np.float16
                wd = self._deq_scratch(p.rows * p.cols, dt).reshape(p.rows, p.cols)
                self.dequant(p, None, p.rows, wd, p.cols, f16=not self.exact)
                if self.blas is not None:
                    xs, ldxs = x, ldx
                    if not self.exact:
                        xs, ldxs = self._scratch16(n * p.cols), p.cols
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
                    dst = y[:n, col0 : col0 + p.rows]
                    if acc:
                        dst += prod
                    else:
                        dst[...] = prod
            col0 += p.rows

    def rms_norm(
        self, x: Any, rows: Any, n: int, w: Any, eps: float, out: Any, acc: bool = False
    ) -> None:
        """out[i] (+)= rms_norm(x[rows[i]]) * w for i < n (rows None: x[i])."""
        d = int(w.shape[0])
        self.fn["rms_norm"](
            (n,),
            (256,),
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

    def act_mul(self, gu: Any, n: int, ff: int, out: Any, gelu: bool = False) -> None:
        """silu (or gelu_tanh)(gu[:, :ff]) * gu[:, ff:] -> out (n, ff)."""
        total = n * ff
        self.fn["gelu_mul" if gelu else "silu_mul"](
            ((total + 255) // 256,), (256,), (gu, np.int32(ff), np.int64(total), out)
        )

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
    ) -> None:
        """Query rows (n, nh, hd) over their sequences' caches; meta = pos, seq, base, cap;
        ``window`` > 0 sees the last ``window`` positions, ``softcap`` > 0 caps the scores."""
        e = hd // 32
        if hd % 32 or e not in HEAD_LANES:
            raise UnsupportedError(
                f"CUDA attention supports head sizes 32..256 in steps of 32, got {hd}"
            )
        pos, seq, base, cap = meta
        self.fn[f"attn_{'f16' if f16 else 'f32'}_{e}"](
            (n, nh),
            (128,),
            (
                q,
                pos,
                seq,
                base,
                cap,
                np.int32(nh),
                np.int32(nkv),
                np.float32(scale),
                np.int32(window),
                np.float32(softcap),
                np.int32(layer),
                out,
            ),
        )

    def argmax(self, x: Any, n: int, out: Any) -> None:
        self.fn["argmax_rows"]((n,), (1024,), (x, np.int32(x.shape[-1]), out))


_DEVICE: Device | None = None


def device() -> Device:
    """The process's compiled kernels (compiled on first use; NVRTC's cache keeps them)."""
    global _DEVICE
    if _DEVICE is None:
        _DEVICE = Device()
    return _DEVICE


class CudaBackend(NumpyFallback):
    """The Backend interface on the GPU for the ops with kernels (numpy in, numpy out);
    the rest are the numpy reference's (:class:`NumpyFallback`).  Models of the llama
    family run device-resident through
    :class:`~modelc.runtime.backends.cuda_llama.CudaLlama` instead."""

    name = "cuda"

    def __init__(self) -> None:
        super().__init__(cache_dequantized=False)
        self.dev = device()
        self.cp = self.dev.cp
        self._weights: dict[int, tuple[np.ndarray[Any, Any], DevWeight]] = {}

    def weight(self, w: Weight) -> DevWeight:
        hit = self._weights.get(id(w.data))
        if hit is not None and hit[0] is w.data:
            return hit[1]
        dw = self.dev.upload([w])
        self._weights[id(w.data)] = (w.data, dw)
        return dw

    def matmul(self, w: Weight, x: F32Array, out: F32Array | None = None) -> F32Array:
        cp = self.cp
        xd = cp.asarray(np.ascontiguousarray(x, np.float32))
        n = int(xd.shape[0])
        y = cp.empty((n, w.shape[0]), np.float32)
        self.dev.matmul(self.weight(w), xd, n, y)
        res: F32Array = y.get()
        if out is not None:
            out[...] = res
            return out
        return res

    def get_rows(
        self, w: Weight, ids: np.ndarray[Any, Any], out: F32Array | None = None
    ) -> F32Array:
        cp = self.cp
        dw = self.weight(w)
        ids_d = cp.asarray(np.ascontiguousarray(ids, np.int64))
        y = cp.empty((len(ids), w.shape[1]), np.float32)
        self.dev.dequant(dw.parts[0], ids_d, len(ids), y, w.shape[1])
        res: F32Array = y.get()
        if out is not None:
            out[...] = res
            return out
        return res

    def rms_norm(
        self, x: F32Array, weight: F32Array, eps: float, out: F32Array | None = None
    ) -> F32Array:
        cp = self.cp
        x2 = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1])
        xd, wd = cp.asarray(x2), cp.asarray(np.ascontiguousarray(weight, np.float32))
        y = cp.empty_like(xd)
        self.dev.rms_norm(xd, None, int(xd.shape[0]), wd, eps, y)
        res: F32Array = y.get().reshape(x.shape)
        if out is not None:
            out[...] = res
            return out
        return res

    def silu_mul(self, gate: F32Array, up: F32Array, out: F32Array | None = None) -> F32Array:
        cp = self.cp
        g2 = np.ascontiguousarray(gate, np.float32).reshape(-1, gate.shape[-1])
        gu = cp.asarray(np.concatenate([g2, np.asarray(up, np.float32).reshape(g2.shape)], axis=1))
        y = cp.empty(g2.shape, np.float32)
        self.dev.act_mul(gu, g2.shape[0], g2.shape[1], y)
        res: F32Array = y.get().reshape(gate.shape)
        if out is not None:
            out[...] = res
            return out
        return res

    def attention(
        self,
        q: F32Array,
        k: KVArray,
        v: KVArray,
        q_pos0: int,
        scale: float,
        out: F32Array | None = None,
        window: int = 0,
        softcap: float = 0.0,
        sinks: F32Array | None = None,
    ) -> F32Array:
        if sinks is not None:  # no sink in the device kernel yet: numpy's attention
            return self._fallback.attention(q, k, v, q_pos0, scale, out, window, softcap, sinks)
        cp = self.cp
        nq, nh, hd = q.shape
        n_kv, nkv = k.shape[0], k.shape[1]
        f16 = k.dtype == np.float16
        kv = cp.asarray(np.stack([np.asarray(k), np.asarray(v).astype(k.dtype)]))  # cap = n_kv
        host = np.zeros(2 * nq + 2, np.int64)
        host[:nq] = np.arange(q_pos0, q_pos0 + nq)
        host[2 * nq :] = (kv.data.ptr, n_kv)
        meta = cp.asarray(host)
        parts = (meta[:nq], meta[nq : 2 * nq], meta[2 * nq : 2 * nq + 1], meta[2 * nq + 1 :])
        qd = cp.asarray(np.ascontiguousarray(q, np.float32))
        y = cp.empty_like(qd)
        self.dev.attention(qd, parts, nq, nh, nkv, hd, f16, scale, window, 0, y, softcap)
        res: F32Array = y.get()
        if out is not None:
            out[...] = res
            return out
        return res
