"""The numpy reference backend: readable twins of every compiled kernel.

Each method is the plain mathematical definition, computed in float32 (sums in
float64 where numpy would otherwise lose precision).  Quantized weights are
dequantized to float32 first, so ``matmul`` here is the exact ``x @ W.T`` that
the compiled kernels approximate (they also quantize the activations).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from modelc.errors import UnsupportedError
from modelc.formats.ir import DType
from modelc.formats.quants import dequantize
from modelc.runtime.backend import Backend, F32Array, KVArray, Weight


def dequantize_rows(dtype: DType, data: np.ndarray[Any, Any], cols: int) -> F32Array:
    """Rows of a weight as stored (any dtype the IR knows) -> float32 (rows, cols)."""
    rows = data.shape[0]
    if dtype is DType.F32:
        return np.asarray(data, dtype=np.float32).reshape(rows, cols)
    if not (dtype.is_quantized or dtype in (DType.F16, DType.BF16)):
        raise UnsupportedError(f"weights of dtype {dtype} cannot be used in a matrix product")
    return np.asarray(dequantize(data, dtype, (rows, cols)), dtype=np.float32)


def dequantize_weight(w: Weight) -> F32Array:
    """The whole weight as float32 (out, in)."""
    return dequantize_rows(w.dtype, w.data, w.shape[1])


def _put(value: np.ndarray[Any, Any], out: F32Array | None) -> F32Array:
    if out is None:
        return np.ascontiguousarray(value, dtype=np.float32)
    out[...] = value
    return out


def erf(x: F32Array) -> F32Array:
    """Error function, |error| < 1.2e-7 (Numerical Recipes erfc, Chebyshev fit)."""
    z = np.abs(x).astype(np.float64)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = (
        -z * z
        - 1.26551223
        + t
        * (
            1.00002368
            + t
            * (
                0.37409196
                + t
                * (
                    0.09678418
                    + t
                    * (
                        -0.18628806
                        + t
                        * (
                            0.27886807
                            + t
                            * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))
                        )
                    )
                )
            )
        )
    )
    r = 1.0 - t * np.exp(poly)
    return np.where(x >= 0, r, -r).astype(np.float32)


class PerSequence:
    """The batched ops as loops over a backend's single ones (``matmul``, ``attention``):
    the reference's definition of them, and what a backend without a batched kernel runs,
    through its own single ops."""

    def matmul_many(
        self: Backend,
        ws: Sequence[Weight],
        x: F32Array,
        outs: Sequence[F32Array | None] | None = None,
    ) -> list[F32Array]:
        """One ``matmul`` per weight."""
        return [self.matmul(w, x, o) for w, o in zip(ws, outs or [None] * len(ws), strict=True)]

    def attention_batch(
        self: Backend,
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
        """One ``attention`` per sequence."""
        kw: dict[str, Any] = {"window": window, "softcap": softcap, "sinks": sinks}
        if outs is None:
            return [
                self.attention(q, k, v, p0, scale, **kw)
                for q, k, v, p0 in zip(qs, ks, vs, q_pos0s, strict=True)
            ]
        return [
            self.attention(q, k, v, p0, scale, out=o, **kw)
            for q, k, v, p0, o in zip(qs, ks, vs, q_pos0s, outs, strict=True)
        ]

    def attention_append(
        self: Backend,
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
        """Each sequence's new rows written into its stores, then one ``attention`` over
        the stores' prefixes."""
        r = 0
        for ks, vs, p0, n in zip(k_stores, v_stores, starts, counts, strict=True):
            ks[p0 : p0 + n] = k_new[r : r + n]  # an f16 store rounds to nearest even
            vs[p0 : p0 + n] = v_new[r : r + n]
            self.attention(
                q[r : r + n],
                ks[: p0 + n],
                vs[: p0 + n],
                p0,
                scale,
                out=out[r : r + n],
                window=window,
                softcap=softcap,
                sinks=sinks,
            )
            r += n
        return out


_CACHE_MAX = 4096  # dequantized weights kept (a model has a few hundred)


class NumpyBackend(PerSequence):
    """Reference kernels in numpy.

    ``cache_dequantized`` keeps each weight's float32 copy after its first use
    (keyed by the identity of its data array), trading memory for speed.
    """

    name = "numpy"

    def __init__(self, cache_dequantized: bool = True) -> None:
        self._cache: dict[int, tuple[np.ndarray[Any, Any], F32Array]] | None = (
            {} if cache_dequantized else None
        )

    def _dense(self, w: Weight) -> F32Array:
        if self._cache is None:
            return dequantize_weight(w)
        hit = self._cache.get(id(w.data))
        if hit is not None and hit[0] is w.data:
            return hit[1]
        dense = dequantize_weight(w)
        if len(self._cache) >= _CACHE_MAX:  # weights made afresh per call: do not grow forever
            self._cache.clear()
        self._cache[id(w.data)] = (w.data, dense)
        return dense

    def matmul(self, w: Weight, x: F32Array, out: F32Array | None = None) -> F32Array:
        # x (n, in) @ W.T (in, out) -> (n, out)
        return _put(np.asarray(x, dtype=np.float32) @ self._dense(w).T, out)

    def get_rows(
        self, w: Weight, ids: np.ndarray[Any, Any], out: F32Array | None = None
    ) -> F32Array:
        rows = np.asarray(w.data)[np.asarray(ids, dtype=np.int64)]  # (len(ids), row as stored)
        return _put(dequantize_rows(w.dtype, rows, w.shape[1]), out)

    def rms_norm(
        self, x: F32Array, weight: F32Array, eps: float, out: F32Array | None = None
    ) -> F32Array:
        ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)  # (n, 1)
        scale = (1.0 / np.sqrt(ms + eps)).astype(np.float32)
        return _put(x * scale * weight, out)

    def layer_norm(
        self,
        x: F32Array,
        weight: F32Array,
        bias: F32Array,
        eps: float,
        out: F32Array | None = None,
    ) -> F32Array:
        x64 = x.astype(np.float64)
        mean = x64.mean(axis=-1, keepdims=True)
        var = np.square(x64 - mean).mean(axis=-1, keepdims=True)
        rstd = (1.0 / np.sqrt(var + eps)).astype(np.float32)
        return _put((x - mean.astype(np.float32)) * rstd * weight + bias, out)

    def rope_angles(
        self, positions: np.ndarray[Any, Any], inv_freq: F32Array
    ) -> tuple[F32Array, F32Array]:
        theta = np.asarray(positions).astype(np.float32)[:, None] * inv_freq[None, :]  # (n, half)
        th = theta.astype(np.float64)
        return np.cos(th).astype(np.float32), np.sin(th).astype(np.float32)

    def rope(self, x: F32Array, angles: tuple[F32Array, F32Array], neox: bool) -> F32Array:
        half = angles[0].shape[1]
        cos, sin = angles[0][:, None, :], angles[1][:, None, :]  # (n, 1, half)
        if neox:
            a, b = x[..., :half].copy(), x[..., half : 2 * half].copy()
            x[..., :half] = a * cos - b * sin
            x[..., half : 2 * half] = a * sin + b * cos
        else:
            a, b = x[..., 0 : 2 * half : 2].copy(), x[..., 1 : 2 * half : 2].copy()
            x[..., 0 : 2 * half : 2] = a * cos - b * sin
            x[..., 1 : 2 * half : 2] = a * sin + b * cos
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
        n_q, n_head, hd = q.shape
        n_kv, n_head_kv, _ = k.shape
        k, v = k.astype(np.float32, copy=False), v.astype(np.float32, copy=False)  # f16 cache
        group = n_head // n_head_kv
        # query i (at position p = q_pos0 + i) sees cache rows t <= p, and with a window
        # only t > p - window
        qpos, kpos = q_pos0 + np.arange(n_q)[:, None], np.arange(n_kv)[None, :]
        visible = kpos <= qpos  # (n_q, n_kv)
        if window > 0:
            visible &= kpos > qpos - window
        cap = np.float32(softcap)
        res = np.empty((n_q, n_head, hd), dtype=np.float32)
        for h in range(n_head):
            kh = h // group
            scores = (q[:, h, :] @ k[:, kh, :].T) * np.float32(scale)  # (n_q, n_kv)
            if softcap > 0:  # gemma2: cap * tanh(s / cap)
                scores = np.tanh(scores / cap) * cap
            scores = np.where(visible, scores, -np.inf)
            if sinks is None:
                probs = self.softmax(scores.astype(np.float32))
            else:  # a key without a value: a last column, in the denominator only
                sink = np.full((n_q, 1), sinks[h], np.float32)
                probs = self.softmax(np.concatenate([scores, sink], axis=1, dtype=np.float32))
                probs = probs[:, :-1]
            res[:, h, :] = probs @ v[:, kh, :]
        return _put(res, out)

    def softmax(self, x: F32Array) -> F32Array:
        x -= x.max(axis=-1, keepdims=True)
        np.exp(x, out=x)
        x /= x.sum(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
        return x

    def silu_mul(self, gate: F32Array, up: F32Array, out: F32Array | None = None) -> F32Array:
        with np.errstate(over="ignore"):
            return _put(gate / (np.float32(1.0) + np.exp(-gate)) * up, out)

    def gelu(self, x: F32Array, out: F32Array | None = None) -> F32Array:
        c = np.float32(np.sqrt(2.0 / np.pi))
        return _put(0.5 * x * (1.0 + np.tanh(c * (x + np.float32(0.044715) * x**3))), out)

    def gelu_erf(self, x: F32Array, out: F32Array | None = None) -> F32Array:
        return _put(
            x * (np.float32(0.5) * (np.float32(1.0) + erf(x * np.float32(1 / np.sqrt(2))))), out
        )

    def causal_conv1d(
        self, x: F32Array, kernel: F32Array, bias: F32Array | None = None, silu: bool = False
    ) -> F32Array:
        w = kernel.shape[1]
        m = x.shape[0] - w + 1
        y = np.zeros((m, x.shape[1]), np.float32)  # (m, ch)
        for j in range(w):  # y[t] = sum_j x[t+j] * kernel[:, j]
            y += x[j : j + m] * kernel[:, j]
        if bias is not None:
            y += bias
        if silu:
            with np.errstate(over="ignore"):
                y /= np.float32(1.0) + np.exp(-y)
        return y

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
        s = state  # (heads, d_k, d_v)
        for t in range(len(q)):
            s *= decay[t][:, None, None]
            mem = (k[t][:, None, :] @ s)[:, 0]  # (heads, d_v): what S recalls for k
            delta = (v[t] - mem) * beta[t][:, None]
            s += k[t][:, :, None] * delta[:, None, :]
            out[t] = (q[t][:, None, :] @ s)[:, 0]
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
        s = state  # (heads, p, n)
        for t in range(len(x)):
            s *= decay[t][:, None, None]
            s += (dt[t][:, None] * x[t])[:, :, None] * b[t][:, None, :]
            out[t] = (s @ c[t][:, :, None])[:, :, 0] + d_skip[:, None] * x[t]
        return out
