"""MLP: a chain of linear layers with an activation between them; or an ONNX execution plan.

Tensors: ``layers.{i}.weight`` (out, in) and optional ``layers.{i}.bias``;
``hparams.layer_sizes`` is ``[in_0, out_0, out_1, ...]``; ``hparams.activation`` is
``relu`` (default), ``sigmoid`` or ``tanh``.  A model whose IR carries an ONNX plan
(``ir.graph``) is run by ``modelc.formats.onnx_ops.run_plan`` instead, with quantized
weights dequantized once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from modelc.errors import UnsupportedError, UsageError
from modelc.formats.ir import HParams, ModelIR, Tensor
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.model import TensorSource


class MLP:
    architecture = "mlp"

    def __init__(self, ir: ModelIR, backend: Backend) -> None:
        self.hparams: HParams = ir.hparams
        self.be = backend
        self.ir = ir
        self.graph = ir.graph
        src = TensorSource(ir)
        self.layers: list[tuple[Weight, F32Array | None]] = []
        if self.graph is None:
            n = ir.hparams.n_layer or max(0, len(ir.hparams.layer_sizes) - 1)
            for i in range(n):
                w = src.weight(f"layers.{i}.weight")
                b = src.vec(f"layers.{i}.bias") if src.has(f"layers.{i}.bias") else None
                self.layers.append((w, b))
        self.n_in = self.layers[0][0].shape[1] if self.layers else 0
        act = ir.hparams.activation or "relu"
        if act not in _ACTIVATIONS:
            raise UnsupportedError(
                f"MLP activation {act!r} is not supported ({', '.join(_ACTIVATIONS)})"
            )
        self.activation = _ACTIVATIONS[act]
        self._plan_weights: dict[str, np.ndarray[Any, Any]] | None = None

    def forward(self, x: np.ndarray[Any, Any]) -> F32Array:
        """x (n, in) or (in,) -> (n, out) or (out,): GEMV/GEMM chain, ReLU between layers."""
        if self.graph is not None:
            raise UsageError("this model is an ONNX plan: call run() with named inputs")
        a = np.ascontiguousarray(x, dtype=np.float32)
        squeeze = a.ndim == 1
        a = a.reshape(1, -1) if squeeze else a
        if a.ndim != 2 or a.shape[1] != self.n_in:
            raise UsageError(f"MLP input must have {self.n_in} features, got shape {np.shape(x)}")
        for i, (w, b) in enumerate(self.layers):
            a = self.be.matmul(w, a)  # (n, out_i)
            if b is not None:
                a += b
            if i < len(self.layers) - 1:
                self.activation(a)
        return a[0] if squeeze else a

    def run(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        """Named inputs -> named outputs (``input`` -> ``output`` for a plain chain)."""
        if self.graph is None:
            if len(inputs) != 1:
                raise UsageError(f"an MLP takes one input array, got {sorted(inputs)}")
            return {"output": self.forward(next(iter(inputs.values())))}
        from modelc.formats.onnx_ops import run_plan

        if self._plan_weights is None:
            self._plan_weights = {name: _dense(t) for name, t in self.ir.tensors.items()}
        out: dict[str, np.ndarray[Any, Any]] = run_plan(self.graph, self._plan_weights, inputs)
        return out


def _dense(t: Tensor) -> np.ndarray[Any, Any]:
    if not t.dtype.is_quantized:
        return t.data()
    from modelc.formats.quants import dequantize

    return np.asarray(dequantize(t.data(), t.dtype, t.shape), np.float32)


def _relu(a: F32Array) -> None:
    np.maximum(a, 0.0, out=a)


def _sigmoid(a: F32Array) -> None:
    np.negative(a, out=a)
    np.exp(a, out=a)
    a += 1.0
    np.reciprocal(a, out=a)


def _tanh(a: F32Array) -> None:
    np.tanh(a, out=a)


_ACTIVATIONS: dict[str, Callable[[F32Array], None]] = {
    "relu": _relu,
    "sigmoid": _sigmoid,
    "tanh": _tanh,
}
