"""The CPU backend: compiled C kernels (``cyx/``) behind Cython wrappers that release the GIL.

Matrix products run straight from the quantized blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, INT8) or from F32/F16/BF16 rows: every
GGUF weight type the reader keeps (``C_MATMUL_DTYPES``; ``kernel_for`` says which path
serves a type); other weight dtypes fall back to the numpy reference (dequantize, then
BLAS).

Threads, SIMD level and matmul mode: :mod:`modelc.runtime.backends.cpu_config`; weight
row views and the repack cache's bookkeeping: :mod:`modelc.runtime.backends.cpu_weights`.

Kernels (``cyx/mc_quant*.h``): every 32-element-block kernel computes each block's exact
integer dot and then one FMA ``acc = fma(dw * dx, s, acc)`` in block order, so a row's
result is the same whether it runs alone, in a 4-weight-row kernel (single x rows) or in
the 8-row batched kernel (x rows paired in vector halves) -- batched equals alone, bit
for bit.  The kernels of Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL and IQ4_XS (``cyx/mc_dot_scalar.h``,
``cyx/mc_dot_avx2_more.h``) take one or four x rows through the same code (a weight block
unpacked once for all of them), with the same integer sums and float steps on the AVX2
and scalar paths.  Row tiles are handed to the threads in ascending order so weights
stream forward from memory.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelc.errors import ConfigError
from modelc.formats.ir import DType
from modelc.runtime.backend import F32Array, KVArray, Weight
from modelc.runtime.backends.cpu_config import (
    BALANCED_TOL,
    C_MATMUL_DTYPES,
    MATMUL_TOLS,
    SIMD_LEVELS,
    TYPE_CODES,
    available_simd,
    default_threads,
    matmul_tol,
    simd_level,
)
from modelc.runtime.backends.cpu_weights import file_mapped, memo, memo_hit, raw_rows
from modelc.runtime.backends.fallback import NumpyFallback
from modelc.runtime.backends.hugemem import HugeArena

__all__ = [
    "BALANCED_TOL", "C_MATMUL_DTYPES", "MATMUL_TOLS", "SIMD_LEVELS", "TYPE_CODES", "CpuBackend",
    "available_simd", "default_threads", "matmul_tol", "simd_level",
]  # fmt: skip

_k: Any = importlib.import_module("modelc._kernels.kernels")
DELTA_MAX_DV = 1024  # the widest value head the delta rule's kernel takes (mc_recur.h)


def _f32(a: np.ndarray[Any, Any]) -> F32Array:
    return np.ascontiguousarray(a, dtype=np.float32)


def _opt_f32(a: np.ndarray[Any, Any] | None) -> F32Array | None:
    """``_f32`` of an optional array (the attention's sinks)."""
    return None if a is None else _f32(a)


def _is_f16(a: np.ndarray[Any, Any]) -> bool:
    return bool(a.dtype == np.float16)


def _f16(a: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.float16]]:
    """A float16 array, C-contiguous (what the f16 kernels take)."""
    return np.ascontiguousarray(a, dtype=np.float16)


def _inplace(a: F32Array) -> F32Array:
    """A caller's array a kernel updates in place: it must be C-contiguous float32."""
    if a.dtype != np.float32 or not a.flags.c_contiguous:
        raise ValueError("an array updated in place must be C-contiguous float32")
    return a


def _flat(out: F32Array) -> F32Array:
    """A 1-D view of a caller's ``out`` (which must be C-contiguous to be written in place)."""
    if not out.flags.c_contiguous:
        raise ValueError("out must be a C-contiguous float32 array")
    return out.reshape(-1)


# weights whose row views and repacked copies are kept: a large mixture holds tens of
# thousands of expert matrices (gpt-oss-120b 13,824, DeepSeek-V3 44,544), and a cache
# emptied when full would repack every one of them again each pass
MEMO_LIMIT = 1 << 16


class CpuBackend(NumpyFallback):
    """Compiled kernels.

    ``threads``, ``simd`` and ``matmul`` default to ``MODELC_THREADS``, ``MODELC_SIMD``
    and ``MODELC_MATMUL`` (see :mod:`modelc.runtime.backends.cpu_config`).  ``repack``:
    whether Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS, MXFP4 and Q2_K to Q6_K weights are
    repacked for the VNNI / AVX2 kernels (fast mode); by default only weights read from a
    file mapping, whose pages are then handed back, so memory does not double (weights held
    in memory, such as a compressed artifact's, keep the other kernels).
    """

    name = "cpu"

    def __init__(
        self,
        threads: int | None = None,
        simd: str | None = None,
        matmul: str | None = None,
        repack: bool | None = None,
    ) -> None:
        self.threads = threads if threads is not None else default_threads()
        if self.threads < 1:
            raise ConfigError(f"threads={self.threads} must be at least 1")
        self.simd = simd_level(simd)
        self.tol = matmul_tol(matmul)
        self.exact = self.tol == 0.0
        self.repack = repack
        super().__init__()  # the numpy reference: weight types without a kernel
        # id(weight data) -> (that data, its uint8 row view): the view costs ~1.5 us a call
        self._raw: dict[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}
        # id(weight data) -> (that data, its repacked copy, or None: see _gemm_aux)
        self._aux: dict[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None]] = {}
        self._arena = HugeArena()  # the repacked copies, in huge pages

    def kernel_for(self, dtype: DType) -> str:
        """Which path serves a matmul of a ``dtype`` weight on this backend: ``"c"`` (the
        compiled kernels, asked of the C dispatch itself) or ``"numpy"`` (the fallback)."""
        code = TYPE_CODES.get(dtype)
        return "c" if code is not None and _k.has_kernel(code, self.simd) else "numpy"

    def operands(self, w: Weight) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None]:
        """What the C matmul reads for ``w``, as :meth:`matmul` passes it: the uint8 rows
        and the repacked copy (or None).  For a generated model-specialised forward that
        calls the kernels itself (``modelc compile``)."""
        raw = self._rows(w)
        return raw, self._gemm_aux(w, raw)

    def _rows(self, w: Weight) -> np.ndarray[Any, Any]:
        def make() -> tuple[np.ndarray[Any, Any], bool]:
            raw = raw_rows(w)
            return raw, np.shares_memory(raw, w.data)  # a copy would go stale if w.data changes

        return memo(self._raw, w.data, MEMO_LIMIT, make)

    def matmul(self, w: Weight, x: F32Array, out: F32Array | None = None) -> F32Array:
        code = TYPE_CODES.get(w.dtype)
        if code is None:
            return self._fallback.matmul(w, x, out)
        x = _f32(x)  # (n, in)
        rows, cols = w.shape
        if out is None:
            out = np.empty((x.shape[0], rows), dtype=np.float32)  # (n, out)
        raw = self._rows(w)
        _k.matmul(
            code, raw, cols, x, out, self.simd, self.threads, self.tol, self._gemm_aux(w, raw)
        )
        return out

    def _gemm_aux(self, w: Weight, raw: np.ndarray[Any, Any]) -> np.ndarray[Any, Any] | None:
        """A weight repacked 8 rows to a group for the kernels that read it (Q4_0, Q4_1, Q5_*,
        Q8_0, IQ4_*, MXFP4, Q2_K to Q6_K, VNNI or AVX2), made on first use (as large as the weight; Q3_K's,
        Q5_K's 4 and 2 % larger).  Fast mode then reads
        only the copy, so the pages of a file mapping are handed back to the OS (read again
        only for what else touches the rows, such as a tied embedding's lookups).  None
        where those kernels are not used (other types and SIMD levels, exact/balanced
        mode), the weight is not held as is, or (``repack`` unset) it is not file-mapped."""
        code = TYPE_CODES.get(w.dtype)
        if (
            code is None
            or not _k.repack_simd(code, self.simd)
            or self.tol < 1e30
            or w.shape[1] % 32
            or self.repack is False
        ):
            return None

        def make() -> tuple[np.ndarray[Any, Any] | None, bool]:
            if not np.shares_memory(raw, w.data):  # made per call: not worth it
                return None, False
            mapped = file_mapped(raw)
            if not mapped and self.repack is None:  # a copy would double its memory
                return None, True
            copy = _k.repack(code, raw, w.shape[1], self._arena.empty)
            if mapped:
                _k.release_pages(raw)
            return copy, True

        return memo(self._aux, w.data, MEMO_LIMIT, make)

    def matmul_many(
        self, ws: Sequence[Weight], x: F32Array, outs: Sequence[F32Array | None] | None = None
    ) -> list[F32Array]:
        """One C call when the weights share a quantized type and the input width (fast
        mode: x quantized once, one pool job); else one ``matmul`` each."""
        outs = list(outs) if outs is not None else [None] * len(ws)
        if len(outs) != len(ws):
            raise ValueError(f"matmul_many: {len(ws)} weights but {len(outs)} outputs")
        code = TYPE_CODES.get(ws[0].dtype) if ws else None
        if (
            code is None
            or len(ws) > 16
            or any(w.dtype is not ws[0].dtype or w.shape[1] != ws[0].shape[1] for w in ws)
        ):
            return [self.matmul(w, x, o) for w, o in zip(ws, outs, strict=True)]
        x = _f32(x)  # (n, in)
        res = [
            np.empty((x.shape[0], w.shape[0]), dtype=np.float32) if o is None else o
            for w, o in zip(ws, outs, strict=True)
        ]  # each (n, out)
        _k.matmul_multi(
            code,
            [self._rows(w) for w in ws],
            ws[0].shape[1],
            x,
            res,
            self.simd,
            self.threads,
            self.tol,
            [self._gemm_aux(w, self._rows(w)) for w in ws],
        )
        return res

    def get_rows(
        self, w: Weight, ids: np.ndarray[Any, Any], out: F32Array | None = None
    ) -> F32Array:
        code = TYPE_CODES.get(w.dtype)
        if code is None:
            return self._fallback.get_rows(w, ids, out)
        idx = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if out is None:
            out = np.empty((idx.shape[0], w.shape[1]), dtype=np.float32)  # (len(ids), in)
        # a tied embedding whose matmuls made a repacked copy: its file pages went back to the
        # OS, so the rows come from the copy (the same values) rather than from the disk
        made = memo_hit(self._aux, w.data)
        aux = made[1] if made is not None else None
        _k.get_rows(code, self._rows(w), w.shape[1], idx, out, self.simd, aux)
        return out

    def rms_norm(
        self, x: F32Array, weight: F32Array, eps: float, out: F32Array | None = None
    ) -> F32Array:
        x = _f32(x)
        if out is None:
            out = np.empty_like(x)
        _k.rms_norm(x, _f32(weight), eps, out, self.threads)
        return out

    def layer_norm(
        self,
        x: F32Array,
        weight: F32Array,
        bias: F32Array,
        eps: float,
        out: F32Array | None = None,
    ) -> F32Array:
        x = _f32(x)
        if out is None:
            out = np.empty_like(x)
        _k.layer_norm(x, _f32(weight), _f32(bias), eps, out, self.threads)
        return out

    def rope_angles(
        self, positions: np.ndarray[Any, Any], inv_freq: F32Array
    ) -> tuple[F32Array, F32Array]:
        cs, sn = _k.rope_table(np.ascontiguousarray(positions, dtype=np.int64), _f32(inv_freq))
        return cs, sn

    def rope(self, x: F32Array, angles: tuple[F32Array, F32Array], neox: bool) -> F32Array:
        buf = _f32(x)  # (n, n_heads, head_dim); a copy only if x is not contiguous
        _k.rope(buf, angles[0], angles[1], neox)
        if buf is not x:
            x[...] = buf
        return x

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
        q = _f32(q)
        if out is None:
            out = np.empty_like(q)  # (n_q, n_head, hd)
        f16 = _is_f16(k) and _is_f16(v)
        conv = _f16 if f16 else _f32
        _k.attention(
            q, conv(k), conv(v), q_pos0, scale, out, self.threads, self.simd, f16, window,
            softcap, _opt_f32(sinks),
        )  # fmt: skip
        return out

    def attention_batch(
        self,
        qs: Sequence[F32Array],
        ks: Sequence[KVArray],
        vs: Sequence[KVArray],
        q_pos0s: Sequence[int],
        scale: float,
        outs: Sequence[F32Array] | None = None,
        window: int = 0,
        softcap: float = 0.0,
        sinks: F32Array | None = None,
    ) -> list[F32Array]:
        q_list = [_f32(q) for q in qs]
        out_list = (
            [np.empty_like(q) for q in q_list]  # each (n_q, n_head, hd)
            if outs is None
            else list(outs)
        )
        # f16 caches are read as is; any f32 one in the batch makes it all f32
        f16 = all(_is_f16(a) for a in (*ks, *vs))
        conv = _f16 if f16 else _f32
        _k.attention_batch(
            q_list,
            [conv(k) for k in ks],
            [conv(v) for v in vs],
            [int(p) for p in q_pos0s],
            scale,
            out_list,
            self.threads,
            self.simd,
            f16,
            window,
            softcap,
            _opt_f32(sinks),
        )
        return out_list

    def attention_append(
        self,
        q: F32Array,
        k_new: F32Array,
        v_new: F32Array,
        k_stores: Sequence[KVArray],
        v_stores: Sequence[KVArray],
        starts: Sequence[int],
        counts: Sequence[int],
        scale: float,
        out: F32Array,
        window: int = 0,
        softcap: float = 0.0,
        sinks: F32Array | None = None,
    ) -> F32Array:
        if not out.flags.c_contiguous:
            raise ValueError("out must be a C-contiguous float32 array")
        f16 = bool(k_stores) and _is_f16(k_stores[0])  # the kernel checks every store's type
        _k.attention_append(
            _f32(q),
            _f32(k_new),
            _f32(v_new),
            list(k_stores),
            list(v_stores),
            list(starts),
            list(counts),
            scale,
            out,
            self.threads,
            self.simd,
            f16,
            window,
            softcap,
            _opt_f32(sinks),
        )
        return out

    def softmax(self, x: F32Array) -> F32Array:
        buf = _f32(x)
        _k.softmax(buf.reshape(-1, buf.shape[-1]), self.simd)
        if buf is not x:
            x[...] = buf
        return x

    def silu_mul(self, gate: F32Array, up: F32Array, out: F32Array | None = None) -> F32Array:
        gate, up = _f32(gate), _f32(up)
        if out is None:
            out = np.empty_like(gate)
        _k.silu_mul(gate.reshape(-1), up.reshape(-1), _flat(out), self.simd, self.threads)
        return out

    def gelu(self, x: F32Array, out: F32Array | None = None) -> F32Array:
        x = _f32(x)
        if out is None:
            out = np.empty_like(x)
        _k.gelu(x.reshape(-1), _flat(out), self.simd, self.threads)
        return out

    def gelu_erf(self, x: F32Array, out: F32Array | None = None) -> F32Array:
        x = _f32(x)
        if out is None:
            out = np.empty_like(x)
        _k.gelu_erf(x.reshape(-1), _flat(out), self.simd, self.threads)
        return out

    def causal_conv1d(
        self, x: F32Array, kernel: F32Array, bias: F32Array | None = None, silu: bool = False
    ) -> F32Array:
        x, kernel = _f32(x), _f32(kernel)
        out = np.empty((x.shape[0] - kernel.shape[1] + 1, x.shape[1]), np.float32)  # (m, ch)
        b = None if bias is None else _f32(bias)
        _k.causal_conv1d(x, kernel, b, out, silu, self.simd, self.threads)
        return out

    def delta_scan(
        self,
        q: F32Array,
        k: F32Array,
        v: F32Array,
        beta: F32Array,
        decay: F32Array,
        state: F32Array,
        out: F32Array,
    ) -> F32Array:
        if v.shape[2] > DELTA_MAX_DV:  # wider than the kernel's buffers
            return self._fallback.delta_scan(q, k, v, beta, decay, state, out)
        _k.delta_scan(
            _f32(q), _f32(k), _f32(v), _f32(beta), _f32(decay), _inplace(state), _inplace(out),
            self.simd, self.threads,
        )  # fmt: skip
        return out

    def ssm_scan(
        self,
        x: F32Array,
        b: F32Array,
        c: F32Array,
        dt: F32Array,
        decay: F32Array,
        d_skip: F32Array,
        state: F32Array,
        out: F32Array,
    ) -> F32Array:
        _k.ssm_scan(
            _f32(x), _f32(b), _f32(c), _f32(dt), _f32(decay), _f32(d_skip), _inplace(state),
            _inplace(out), self.simd, self.threads,
        )  # fmt: skip
        return out
