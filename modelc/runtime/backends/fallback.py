"""The one fallback style of the backends: an op a backend lacks runs on numpy.

Every accelerated backend (CPU, CUDA, WebGPU) derives from :class:`NumpyFallback` and
holds the numpy reference as its one declared ``_fallback``.  An op it does not define
is this class's, which hands it to ``_fallback`` (the batched ops: as loops over the
backend's own single ones, so a backend with an attention kernel but no batched one
runs its kernel per sequence); an op it defines calls ``self._fallback.<op>`` itself
for the cases its kernels do not cover (a weight type, a shape).  Like ggml's backends answering ``supports_op``, a backend writes only what it
accelerates; the rest comes out equal to the reference by construction.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from modelc.runtime.backend import F32Array, KVArray, Weight
from modelc.runtime.backends.numpy_ref import NumpyBackend, PerSequence


class NumpyFallback(PerSequence):
    """Every :class:`~modelc.runtime.backend.Backend` op, on ``_fallback``."""

    name: str
    _fallback: NumpyBackend  # the numpy twins, for what the backend does not accelerate

    def __init__(self, *, cache_dequantized: bool = True) -> None:
        """``cache_dequantized``: the reference keeps the float32 copies of the weights it
        dequantizes (see :class:`NumpyBackend`)."""
        self._fallback = NumpyBackend(cache_dequantized)

    def matmul(self, w: Weight, x: F32Array, out: F32Array | None = None) -> F32Array:
        return self._fallback.matmul(w, x, out)

    def get_rows(
        self, w: Weight, ids: np.ndarray[Any, Any], out: F32Array | None = None
    ) -> F32Array:
        return self._fallback.get_rows(w, ids, out)

    def rms_norm(
        self, x: F32Array, weight: F32Array, eps: float, out: F32Array | None = None
    ) -> F32Array:
        return self._fallback.rms_norm(x, weight, eps, out)

    def layer_norm(
        self, x: F32Array, weight: F32Array, bias: F32Array, eps: float, out: F32Array | None = None
    ) -> F32Array:
        return self._fallback.layer_norm(x, weight, bias, eps, out)

    def rope_angles(
        self, positions: np.ndarray[Any, Any], inv_freq: F32Array
    ) -> tuple[F32Array, F32Array]:
        return self._fallback.rope_angles(positions, inv_freq)

    def rope(self, x: F32Array, angles: tuple[F32Array, F32Array], neox: bool) -> F32Array:
        return self._fallback.rope(x, angles, neox)

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
        return self._fallback.attention(q, k, v, q_pos0, scale, out, window, softcap, sinks)

    def softmax(self, x: F32Array) -> F32Array:
        return self._fallback.softmax(x)

    def silu_mul(self, gate: F32Array, up: F32Array, out: F32Array | None = None) -> F32Array:
        return self._fallback.silu_mul(gate, up, out)

    def gelu(self, x: F32Array, out: F32Array | None = None) -> F32Array:
        return self._fallback.gelu(x, out)

    def gelu_erf(self, x: F32Array, out: F32Array | None = None) -> F32Array:
        return self._fallback.gelu_erf(x, out)

    def causal_conv1d(
        self, x: F32Array, kernel: F32Array, bias: F32Array | None = None, silu: bool = False
    ) -> F32Array:
        return self._fallback.causal_conv1d(x, kernel, bias, silu)

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
        return self._fallback.delta_scan(q, k, v, beta, decay, state, out)

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
        return self._fallback.ssm_scan(x, b, c, dt, decay, d_skip, state, out)
