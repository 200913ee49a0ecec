"""The kernel backend interface: the one protocol every backend implements.

Every architecture computes through a :class:`Backend`, never through kernels
directly, so the CPU (Cython), reference (numpy), CUDA and WebGPU backends are
interchangeable, and a generated model-specialised module can replace the runtime
while keeping the same kernels.  A backend that lacks an op (or a weight type) hands
it to the numpy reference, the same way in each
(:class:`~modelc.runtime.backends.fallback.NumpyFallback`); one is chosen by name in
:mod:`modelc.runtime.backends.factory`, which this module does not import.

Array conventions: float32, C-contiguous; shapes are commented on each method.
Attention's keys and values may also be float16 (an f16 KV cache, read as is).
``out`` arguments, where given, are preallocated buffers written in place and
returned, so the decode loop allocates nothing per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from modelc.formats.ir import DType

F32Array = np.ndarray[Any, np.dtype[np.float32]]
F16Array = np.ndarray[Any, np.dtype[np.float16]]
KVArray = F32Array | F16Array  # keys or values read from a KV cache


@dataclass(frozen=True, slots=True)
class Weight:
    """A weight matrix as held in memory: quantized weights stay quantized.

    ``data`` is float32/float16 of ``shape`` for plain dtypes, and uint8
    ``(rows, row_bytes)`` raw blocks for quantized ones; ``shape`` is the
    logical ``(out_features, in_features)``.
    """

    dtype: DType
    shape: tuple[int, int]
    data: np.ndarray[Any, Any]


class Backend(Protocol):
    name: str

    def matmul(self, w: Weight, x: F32Array, out: F32Array | None = None) -> F32Array:
        """``x @ dequant(w).T``: x (n, in) -> (n, out). Computed from the blocks directly."""
        ...

    def matmul_many(
        self, ws: Sequence[Weight], x: F32Array, outs: Sequence[F32Array | None] | None = None
    ) -> list[F32Array]:
        """``matmul(w, x)`` for each of ``ws`` (one shared x, e.g. Q, K and V): each result
        equal to the single call's, computed together where the backend can."""
        ...

    def get_rows(
        self, w: Weight, ids: np.ndarray[Any, Any], out: F32Array | None = None
    ) -> F32Array:
        """Dequantized rows ``ids`` of ``w`` (an embedding lookup): (len(ids), in)."""
        ...

    def rms_norm(
        self, x: F32Array, weight: F32Array, eps: float, out: F32Array | None = None
    ) -> F32Array:
        """x (n, d) -> x / rms(x) * weight."""
        ...

    def layer_norm(
        self, x: F32Array, weight: F32Array, bias: F32Array, eps: float, out: F32Array | None = None
    ) -> F32Array:
        """x (n, d) -> (x - mean) / std * weight + bias."""
        ...

    def rope_angles(
        self, positions: np.ndarray[Any, Any], inv_freq: F32Array
    ) -> tuple[F32Array, F32Array]:
        """cos and sin (n, rot_dim/2) of ``positions`` (n,) x ``inv_freq`` (rot_dim/2,),
        which already includes any RoPE scaling: made once a step, every layer's Q and K
        rotate by them."""
        ...

    def rope(self, x: F32Array, angles: tuple[F32Array, F32Array], neox: bool) -> F32Array:
        """In place: x (n, n_heads, head_dim) rotated by ``rope_angles`` of its positions.

        ``neox`` rotates halves (GPT-NeoX/HF layout); otherwise adjacent pairs
        (GGUF/llama.cpp NORM); dimensions past rot_dim are left as they are.
        """
        ...

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
        """Causal attention for one sequence over its own cache.

        q (n_q, n_head, hd); k, v (n_kv, n_head_kv, hd) with n_head % n_head_kv == 0
        (grouped-query).  Query i sits at absolute position ``p = q_pos0 + i`` and sees
        cache positions ``0 .. p``, or with ``window`` > 0 (a sliding window: Mistral,
        gemma's local layers) ``max(0, p - window + 1) .. p`` only; positions past the
        cache's last row are not there, so ``q_pos0 = n_kv - 1`` lets every query see the
        whole cache (BERT's bidirectional attention).  With ``softcap`` > 0
        each score ``s = q·k * scale`` becomes ``softcap * tanh(s / softcap)`` before the
        softmax (gemma2).  ``sinks`` (n_head,), where given, is a logit per head that joins
        each softmax's denominator only, a key without a value (gpt-oss): a query's weights
        are ``exp(s_j) / (sum_j exp(s_j) + exp(sinks[h]))``.  Returns (n_q, n_head, hd).  k and v are float32 or float16 (an
        f16 cache); float16 is computed as its exact float32 widening, read without
        converting the whole cache first where the backend can.
        """
        ...

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
        """:meth:`attention` for several sequences at once, each over its own cache.

        Entry i of every list belongs to sequence i; all share n_head, n_head_kv, hd,
        ``window``, ``softcap`` and ``sinks``.  Equal to one ``attention(qs[i], ks[i], vs[i],
        q_pos0s[i], scale, outs[i], window, softcap, sinks)`` per sequence; a backend may run
        them as one job (one decode step's layer).
        """
        ...

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
        """One layer's attention over caches held as plain arrays: sequence i owns
        ``counts[i]`` consecutive rows of q (rows, n_head, hd), k_new and v_new (rows,
        n_head_kv, hd) and out; its new K/V rows are stored at positions ``starts[i]`` ..
        of ``k_stores[i]`` / ``v_stores[i]`` ((capacity, n_head_kv, hd), f32 or f16, all of
        one dtype; f16 rounds to nearest even), then its queries attend over positions
        0 .. starts[i] + counts[i] - 1 (``window``, ``softcap``, ``sinks`` as :meth:`attention`'s).
        Equal to writing the rows and calling :meth:`attention_batch` on the stores'
        prefixes."""
        ...

    def softmax(self, x: F32Array) -> F32Array:
        """In place, over the last axis of x (n, d)."""
        ...

    def silu_mul(self, gate: F32Array, up: F32Array, out: F32Array | None = None) -> F32Array:
        """silu(gate) * up, elementwise (n, d)."""
        ...

    def gelu(self, x: F32Array, out: F32Array | None = None) -> F32Array:
        """GELU, tanh approximation, elementwise."""
        ...

    def gelu_erf(self, x: F32Array, out: F32Array | None = None) -> F32Array:
        """The exact GELU x * Phi(x) = x / 2 * (1 + erf(x / sqrt 2)) (BERT), elementwise, erf
        within 1.2e-7 (:func:`modelc.runtime.backends.numpy_ref.erf`)."""
        ...

    def causal_conv1d(
        self,
        x: F32Array,
        kernel: F32Array,
        bias: F32Array | None = None,
        silu: bool = False,
    ) -> F32Array:
        """A causal depthwise convolution over one sequence (the recurrent layers' short
        convolutions): x (w-1+m, ch), the last w-1 inputs the sequence kept then its m new
        ones; kernel (ch, w).  Returns (m, ch): ``out[t] = sum_j x[t+j] * kernel[:, j]``
        (summed from 0 in j's order), plus ``bias`` (ch,) where given, then through
        ``silu`` (``y / (1 + exp(-y))``) when set."""
        ...

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
        """The gated delta rule (Gated DeltaNet) over one sequence's m tokens, token by
        token and head by head::

            S = decay S;  S += k (beta (v - k^T S))^T;  out = q^T S

        q, k (m, heads, d_k), one row per value head (l2-normed; q also scaled); v (m,
        heads, d_v); beta, decay (m, heads); ``state`` S (heads, d_k, d_v), updated in
        place; ``out`` (m, heads, d_v) written and returned.  Both C-contiguous."""
        ...

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
        """Mamba-2's selective scan over one sequence's m tokens, token by token and head by
        head::

            S = decay S + (dt x) B^T;  out = S C + d_skip x

        x (m, heads, p); b, c (m, heads, n), each head's group's B and C; dt, decay (m,
        heads); d_skip (heads,); ``state`` S (heads, p, n), updated in place; ``out`` (m,
        heads, p) written and returned.  Both C-contiguous."""
        ...
