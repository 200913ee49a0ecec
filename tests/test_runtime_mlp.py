"""MLP runtime: a safetensors linear chain through the backend, and an ONNX plan end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelc.errors import UsageError
from modelc.formats import load_model
from modelc.runtime.arch import MLP, build
from tests.runtime_support import make_backend

RNG = np.random.default_rng(42)
W = [RNG.normal(0, 0.5, s).astype(np.float32) for s in [(16, 8), (12, 16), (4, 12)]]
B = [RNG.normal(0, 0.1, s[0]).astype(np.float32) for s in [(16, 8), (12, 16), (4, 12)]]


def reference(x: np.ndarray) -> np.ndarray:
    h = x.astype(np.float64)
    for i, (w, b) in enumerate(zip(W, B, strict=True)):
        h = h @ w.T.astype(np.float64) + b
        if i < 2:
            h = np.maximum(h, 0)
    return h


@pytest.fixture(scope="module")
def chain_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.numpy import save_file

    p = tmp_path_factory.mktemp("mlp") / "mlp.safetensors"
    # nn.Sequential(Linear, ReLU, Linear, ReLU, Linear) names
    save_file(
        {f"{j}.weight": W[i] for i, j in enumerate((0, 2, 4))}
        | {f"{j}.bias": B[i] for i, j in enumerate((0, 2, 4))},
        str(p),
    )
    return p


@pytest.mark.parametrize("backend", ["numpy", "cpu-exact"])
def test_linear_chain_matches_numpy(chain_file: Path, backend: str) -> None:
    m = build(load_model(chain_file), make_backend(backend))
    assert isinstance(m, MLP) and m.hparams.layer_sizes == [8, 16, 12, 4]
    x = RNG.normal(0, 1, (5, 8)).astype(np.float32)
    np.testing.assert_allclose(m.forward(x), reference(x), atol=1e-5)
    np.testing.assert_allclose(m.forward(x[0]), reference(x[:1])[0], atol=1e-5)  # a GEMV
    np.testing.assert_allclose(m.run({"x": x})["output"], reference(x), atol=1e-5)
    with pytest.raises(UsageError, match="8 features"):
        m.forward(np.zeros((2, 7), np.float32))


def test_onnx_plan_runs_end_to_end(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    # x -> Gemm(W0, b0, transB=1) -> Relu -> MatMul(W1.T) + b1 -> Relu -> MatMul(W2.T) + b2 -> Softmax
    inits = [
        numpy_helper.from_array(W[0], "w0"),
        numpy_helper.from_array(B[0], "b0"),
        numpy_helper.from_array(np.ascontiguousarray(W[1].T), "w1t"),
        numpy_helper.from_array(B[1], "b1"),
        numpy_helper.from_array(np.ascontiguousarray(W[2].T), "w2t"),
        numpy_helper.from_array(B[2], "b2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w0", "b0"], ["h0"], transB=1),
        helper.make_node("Relu", ["h0"], ["a0"]),
        helper.make_node("MatMul", ["a0", "w1t"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("MatMul", ["a1", "w2t"], ["m2"]),
        helper.make_node("Add", ["m2", "b2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        inits,
    )
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    m = build(load_model(path), make_backend("numpy"))
    assert isinstance(m, MLP) and m.graph is not None
    x = RNG.normal(0, 1, (3, 8)).astype(np.float32)
    logits = reference(x)
    want = np.exp(logits - logits.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    np.testing.assert_allclose(m.run({"x": x})["y"], want, atol=1e-5)
    with pytest.raises(UsageError):
        m.forward(x)
