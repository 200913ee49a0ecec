"""The CUDA backend as a :class:`~modelc.runtime.backend.Backend` (numpy in, numpy out):
matmul, rows, norms, SiLU and attention on :mod:`.cuda`'s kernels, the rest through
:class:`~modelc.runtime.backends.fallback.NumpyFallback` — the op-level path op-by-op
models run on and the parity tests use; the model-level path that keeps a step on the
device is :class:`~modelc.runtime.backends.cuda_llama.CudaLlama`."""

from __future__ import annotations

from typing import Any

import numpy as np

from modelc.runtime.backend import F32Array, KVArray, Weight
from modelc.runtime.backends.cuda import device, head_runs
from modelc.runtime.backends.cuda_weights import CODES, DevWeight
from modelc.runtime.backends.fallback import NumpyFallback


class CudaBackend(NumpyFallback):
    """The Backend interface on the GPU for the ops with kernels (numpy in, numpy out):
    matmul and rows of weights of the types it reads exactly and widths of 32s, RMS norms, SiLU and
    attention at the head sizes of :func:`head_runs`; the rest, and those cases, are the
    numpy reference's (:class:`NumpyFallback`).  A decoder whose every part the fused
    forward runs goes device-resident through
    :class:`~modelc.runtime.backends.cuda_llama.CudaLlama` instead; any other model runs
    op by op on this backend (:mod:`~modelc.runtime.backends.cuda_offload`)."""

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

    @staticmethod
    def _on_device(w: Weight) -> bool:
        """Whether the kernels take ``w`` exactly: a width of 32s, some rows, a type they
        read as stored."""
        exact = w.dtype in CODES
        return exact and w.shape[0] > 0 and w.shape[1] > 0 and w.shape[1] % 32 == 0

    def matmul(self, w: Weight, x: F32Array, out: F32Array | None = None) -> F32Array:
        if not self._on_device(w) or len(x) == 0:
            return self._fallback.matmul(w, x, out)
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
        if not self._on_device(w) or len(ids) == 0:
            return self._fallback.get_rows(w, ids, out)
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
        if x.size == 0:
            return self._fallback.rms_norm(x, weight, eps, out)
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
        if gate.size == 0:
            return self._fallback.silu_mul(gate, up, out)
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
        nq, nh, hd = q.shape
        n_kv, nkv = k.shape[0], k.shape[1]
        if (
            not head_runs(hd) or k.shape != v.shape or k.shape[2] != hd or q_pos0 + nq > n_kv
        ):  # other head sizes, values unlike keys (MLA), queries past the cache (BERT):
            # numpy's attention
            return self._fallback.attention(q, k, v, q_pos0, scale, out, window, softcap, sinks)
        cp = self.cp
        f16 = k.dtype == np.float16
        kv = cp.asarray(np.stack([np.asarray(k), np.asarray(v).astype(k.dtype)]))  # cap = n_kv
        host = np.zeros(2 * nq + 2, np.int64)
        host[:nq] = np.arange(q_pos0, q_pos0 + nq)
        host[2 * nq :] = (kv.data.ptr, n_kv)
        meta = cp.asarray(host)
        parts = (meta[:nq], meta[nq : 2 * nq], meta[2 * nq : 2 * nq + 1], meta[2 * nq + 1 :])
        qd = cp.asarray(np.ascontiguousarray(q, np.float32))
        y = cp.empty_like(qd)
        sk = None if sinks is None else cp.asarray(np.ascontiguousarray(sinks, np.float32))
        self.dev.attention(qd, parts, nq, nh, nkv, hd, f16, scale, window, 0, y, softcap, sinks=sk)
        res: F32Array = y.get()
        if out is not None:
            out[...] = res
            return out
        return res
