"""The ONNX execution plan's op table: :func:`run_plan` runs a plan (see :mod:`modelc.formats.onnx`)
with numpy, one small function per op of :data:`SUPPORTED_OPS`."""

from __future__ import annotations

from typing import Any

import numpy as np

from modelc.errors import FormatError, UnsupportedError, UsageError

__all__ = ["CAST_TO", "PLAN_FORMAT", "SUPPORTED_OPS", "run_plan"]

SUPPORTED_OPS = (
    "MatMul",
    "Gemm",
    "Add",
    "Mul",
    "Div",
    "Sub",
    "Relu",
    "Softmax",
    "LayerNormalization",
    "Transpose",
    "Reshape",
    "Sigmoid",
    "Tanh",
    "Identity",
    "Cast",
)
PLAN_FORMAT = "modelc-onnx-plan/1"

# onnx.TensorProto.DataType -> numpy dtype name
CAST_TO: dict[int, str] = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
}


def _softmax(x: np.ndarray[Any, Any], axis: int, opset: int) -> np.ndarray[Any, Any]:
    if opset < 13:  # coerce to 2-D at axis
        shape = x.shape
        axis = axis % x.ndim
        x2 = x.reshape(int(np.prod(shape[:axis], dtype=np.int64)), -1)
        return _softmax(x2, -1, 13).reshape(shape)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)  # type: ignore[no-any-return]


def _layer_norm(
    x: np.ndarray[Any, Any],
    scale: np.ndarray[Any, Any],
    bias: np.ndarray[Any, Any] | None,
    axis: int,
    eps: float,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
    y = (x - mean) * inv_std * scale
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype, copy=False), mean, inv_std


def _reshape(
    x: np.ndarray[Any, Any], shape: np.ndarray[Any, Any], allowzero: int
) -> np.ndarray[Any, Any]:
    dims = [int(d) for d in shape.reshape(-1)]
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


def _div(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    if np.issubdtype(np.result_type(a, b), np.integer):
        return np.trunc(np.true_divide(a, b)).astype(np.result_type(a, b))  # type: ignore[no-any-return]
    return np.asarray(a / b)


def _gemm(args: list[Any], attrs: dict[str, Any]) -> np.ndarray[Any, Any]:
    a, b = args[0], args[1]
    c = args[2] if len(args) > 2 else None
    a = a.T if attrs.get("transA", 0) else a
    b = b.T if attrs.get("transB", 0) else b
    y = float(attrs.get("alpha", 1.0)) * (a @ b)
    if c is not None:
        y = y + float(attrs.get("beta", 1.0)) * c
    return np.asarray(y, dtype=a.dtype)


def _run_node(node: dict[str, Any], args: list[Any], opset: int) -> list[np.ndarray[Any, Any]]:
    op, at = node["op"], node["attrs"]
    if op == "MatMul":
        return [np.matmul(args[0], args[1])]
    if op == "Gemm":
        return [_gemm(args, at)]
    if op == "Add":
        return [args[0] + args[1]]
    if op == "Sub":
        return [args[0] - args[1]]
    if op == "Mul":
        return [args[0] * args[1]]
    if op == "Div":
        return [_div(args[0], args[1])]
    if op == "Relu":
        return [np.maximum(args[0], np.zeros((), args[0].dtype))]
    if op == "Sigmoid":
        x = args[0]
        return [(0.5 * (1.0 + np.tanh(0.5 * x))).astype(x.dtype, copy=False)]
    if op == "Tanh":
        return [np.tanh(args[0])]
    if op == "Softmax":
        return [_softmax(args[0], int(at.get("axis", -1 if opset >= 13 else 1)), opset)]
    if op == "LayerNormalization":
        bias = args[2] if len(args) > 2 else None
        return list(
            _layer_norm(
                args[0], args[1], bias, int(at.get("axis", -1)), float(at.get("epsilon", 1e-5))
            )
        )
    if op == "Transpose":
        perm = at.get("perm")
        return [np.transpose(args[0], perm)]
    if op == "Reshape":
        return [_reshape(args[0], args[1], int(at.get("allowzero", 0)))]
    if op == "Identity":
        return [args[0]]
    if op == "Cast":
        to = int(at["to"])
        if to not in CAST_TO:
            raise UnsupportedError(f"Cast to ONNX element type {to} is not supported")
        return [args[0].astype(CAST_TO[to])]
    raise UnsupportedError(f"op {op} is not supported by the plan executor")


def run_plan(
    graph: dict[str, Any],
    weights: dict[str, np.ndarray[Any, Any]],
    inputs: dict[str, np.ndarray[Any, Any]],
) -> dict[str, np.ndarray[Any, Any]]:
    """Execute an execution plan (see module docstring) with numpy; returns the graph outputs by name."""
    if graph.get("format") != PLAN_FORMAT:
        raise FormatError(
            f"not a modelc ONNX plan (format {graph.get('format')!r}, expected {PLAN_FORMAT})"
        )
    env: dict[str, np.ndarray[Any, Any]] = {}
    for name in graph["initializers"]:
        if name not in weights:
            raise FormatError(f"plan initializer {name!r} is missing from the weights")
        env[name] = np.asarray(weights[name])
    for spec in graph["inputs"]:
        if spec["name"] not in inputs:
            raise UsageError(
                f"input {spec['name']!r} is required (inputs: {[i['name'] for i in graph['inputs']]})"
            )
        env[spec["name"]] = np.asarray(inputs[spec["name"]])
    opset = int(graph.get("opset", 17))
    for node in graph["nodes"]:
        try:
            args = [env[n] if n else None for n in node["inputs"]]
            while args and args[-1] is None:
                args.pop()
            results = _run_node(node, args, opset)
        except KeyError as e:
            raise FormatError(
                f"{node['op']} node {node['name']!r} reads {e} before it is computed"
            ) from e
        except (ValueError, IndexError, TypeError) as e:
            raise UsageError(f"{node['op']} node {node['name']!r} failed: {e}") from e
        for name, value in zip(node["outputs"], results, strict=False):
            if name:
                env[name] = value
    return {spec["name"]: env[spec["name"]] for spec in graph["outputs"]}
