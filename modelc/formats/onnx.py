"""ONNX reader: initializers (inline or external) as lazy tensors, and the graph as a JSON execution plan.

The plan (``ModelIR.graph``) is a JSON-able dict::

    {"format": "modelc-onnx-plan/1", "opset": 17,
     "inputs":  [{"name": "x", "dtype": "float32", "shape": ["batch", 8]}],
     "outputs": [{"name": "y", "dtype": "float32", "shape": ["batch", 4]}],
     "initializers": ["layers.0.weight", ...],          # names in ModelIR.tensors
     "nodes": [{"op": "Gemm", "name": "...", "inputs": [...], "outputs": [...], "attrs": {...}}]}

in topological order, over :data:`SUPPORTED_OPS` (``Constant`` nodes are folded into
initializers).  :func:`run_plan` (:mod:`modelc.formats.onnx_ops`) executes it with numpy.

External data (``location``/``offset``/``length``, several tensors may share one file) is
memory-mapped.  Linear weights follow modelc's ``(out, in)`` convention: an initializer used only
as ``B`` of ``MatMul`` (or of ``Gemm`` with ``transB=0``) is stored transposed and the plan says so
(a ``Transpose`` node, or ``transB=1``).  A graph whose initializers form a chain of linear layers
is architecture ``mlp`` with the canonical ``layers.{i}.weight|bias`` names; initializers named
like a Hugging Face transformer are mapped like the other formats (no plan then: the runtime runs
its own implementation).  Any other graph of supported ops is also architecture ``mlp`` but with
empty ``layer_sizes`` and its initializers' own names: the runtime runs it through the plan.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from modelc.errors import ArchitectureError, FormatError, UnsupportedError
from modelc.formats.arch import build_model_ir, detect_architecture, infer_architecture, mlp_names
from modelc.formats.ir import (
    NUMPY_DTYPES,
    DType,
    HParams,
    ModelIR,
    SourceInfo,
    Tensor,
    aligned,
)
from modelc.formats.onnx_ops import CAST_TO, PLAN_FORMAT, SUPPORTED_OPS, run_plan

__all__ = ["PLAN_FORMAT", "SUPPORTED_OPS", "build_plan", "load_onnx", "run_plan"]

# onnx.TensorProto.DataType -> modelc dtype
_ONNX_DTYPES: dict[int, DType] = {
    1: DType.F32,
    2: DType.U8,
    3: DType.I8,
    5: DType.I16,
    6: DType.I32,
    7: DType.I64,
    9: DType.BOOL,
    10: DType.F16,
    11: DType.F64,
    16: DType.BF16,
}


def _dtype_of(elem_type: int, what: str, path: Path) -> DType:
    if elem_type not in _ONNX_DTYPES:
        raise UnsupportedError(
            f"{what} has ONNX element type {elem_type}, which modelc does not read", path=path
        )
    return _ONNX_DTYPES[elem_type]


# --- initializers -----------------------------------------------------------------------


def _inline_array(tp: Any, dtype: DType, path: Path) -> np.ndarray[Any, Any]:
    from onnx import numpy_helper

    shape = tuple(int(d) for d in tp.dims)
    np_dtype = NUMPY_DTYPES[dtype]
    if tp.raw_data:
        want = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
        if len(tp.raw_data) != want:
            raise FormatError(
                f"initializer {tp.name!r}: {len(tp.raw_data)} bytes of raw data, shape {list(shape)} needs {want}",
                path=path,
            )
        return aligned(np.frombuffer(tp.raw_data, dtype=np_dtype).reshape(shape))
    arr = np.asarray(numpy_helper.to_array(tp))
    if dtype is DType.BF16:
        return arr.view(np.uint16).reshape(shape)
    return arr.astype(np_dtype, copy=False).reshape(shape)


def _external_loader(tp: Any, dtype: DType, base: Path, model_path: Path) -> tuple[Any, Path]:
    info = {e.key: e.value for e in tp.external_data}
    location = info.get("location", "")
    rel = Path(location)
    if not location or rel.is_absolute() or ".." in rel.parts:
        raise FormatError(
            f"initializer {tp.name!r}: external data location {location!r} must be a file next to the model",
            path=model_path,
        )
    file = base / rel
    if not file.is_file():
        raise FormatError(
            f"external data file {location!r} of initializer {tp.name!r} is missing; copy it next to the .onnx file",
            path=file,
        )
    shape = tuple(int(d) for d in tp.dims)
    np_dtype = NUMPY_DTYPES[dtype]
    want = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
    try:
        offset = int(info.get("offset", "0"))
        length = int(info.get("length", str(want)))
    except ValueError as e:
        raise FormatError(
            f"initializer {tp.name!r}: bad external offset/length ({e})", path=model_path
        ) from e
    size = file.stat().st_size
    if length != want or offset < 0 or offset + length > size:
        raise FormatError(
            f"initializer {tp.name!r}: external span offset={offset} length={length} does not hold "
            f"{want} bytes inside the {size}-byte file (truncated or corrupt)",
            path=file,
        )

    def load() -> np.ndarray[Any, Any]:
        if want == 0:
            return np.zeros(shape, np_dtype)
        return aligned(np.memmap(file, dtype=np_dtype, mode="r", offset=offset, shape=shape))

    return load, file


def _read_initializers(model: Any, path: Path) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for tp in model.graph.initializer:
        if not isinstance(tp.name, str):  # protobuf hands back bytes that are not UTF-8
            raise FormatError(f"initializer name {tp.name!r} is not text", path=path)
        dtype = _dtype_of(int(tp.data_type), f"initializer {tp.name!r}", path)
        shape = tuple(int(d) for d in tp.dims)
        if tp.data_location == 1:  # EXTERNAL
            load, _ = _external_loader(tp, dtype, path.parent, path)
        else:
            arr = _inline_array(tp, dtype, path)
            load = _const(arr)
        out[tp.name] = Tensor(tp.name, dtype, shape, load)
    return out


def _const(arr: np.ndarray[Any, Any]) -> Any:
    def load() -> np.ndarray[Any, Any]:
        return arr

    return load


def _constant_node(node: Any, path: Path) -> Tensor:
    from onnx import helper

    attrs = {a.name: a for a in node.attribute}
    name = node.output[0]
    if "value" in attrs:
        tp = attrs["value"].t
        dtype = _dtype_of(int(tp.data_type), f"Constant {name!r}", path)
        arr = _inline_array(tp, dtype, path)
    elif len(attrs) == 1:
        key, attr = next(iter(attrs.items()))
        value = helper.get_attribute_value(attr)
        kinds = {
            "value_float": np.float32,
            "value_floats": np.float32,
            "value_int": np.int64,
            "value_ints": np.int64,
        }
        if key not in kinds:
            raise UnsupportedError(
                f"Constant {name!r} with attribute {key} is not supported", path=path
            )
        arr = np.asarray(value, dtype=kinds[key])
        dtype = DType.F32 if arr.dtype == np.float32 else DType.I64
    else:
        raise FormatError(f"Constant node {name!r} has no value", path=path)
    return Tensor(name, dtype, tuple(arr.shape), _const(arr))


# --- plan -------------------------------------------------------------------------------


def _value_info(vi: Any) -> dict[str, Any]:
    tt = vi.type.tensor_type
    shape: list[int | str | None] | None = None
    if tt.HasField("shape"):
        shape = [
            int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None)
            for d in tt.shape.dim
        ]
    return {
        "name": vi.name,
        "dtype": CAST_TO.get(int(tt.elem_type), str(tt.elem_type)),
        "shape": shape,
    }


def _attrs(node: Any, path: Path) -> dict[str, Any]:
    from onnx import helper

    out: dict[str, Any] = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, list):
            v = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v]
        if not isinstance(v, (int, float, str, list)):
            raise UnsupportedError(
                f"{node.op_type} node {node.name!r}: attribute {a.name} is not a plain value",
                path=path,
            )
        out[a.name] = v
    return out


def build_plan(model: Any, path: Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """The execution plan of ``model.graph`` and the tensors its Constant nodes define."""
    opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    graph = model.graph
    constants: dict[str, Tensor] = {}
    nodes: list[dict[str, Any]] = []
    bad: Counter[str] = Counter()
    for node in graph.node:
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if op == "Constant":
            constants[node.output[0]] = _constant_node(node, path)
            continue
        if op not in SUPPORTED_OPS:
            bad[op] += 1
            continue
        nodes.append(
            {
                "op": op,
                "name": node.name,
                "inputs": list(node.input),
                "outputs": list(node.output),
                "attrs": _attrs(node, path),
            }
        )
    if bad:
        listed = ", ".join(f"{op} (x{n})" for op, n in sorted(bad.items()))
        raise UnsupportedError(
            f"the ONNX graph uses ops modelc cannot execute: {listed}; supported: {', '.join(SUPPORTED_OPS)}",
            path=path,
        )
    init_names = {t.name for t in graph.initializer} | set(constants)
    plan = {
        "format": PLAN_FORMAT,
        "opset": opset,
        "inputs": [_value_info(v) for v in graph.input if v.name not in init_names],
        "outputs": [_value_info(v) for v in graph.output],
        "initializers": sorted(init_names),
        "nodes": nodes,
    }
    return plan, constants


def _transpose_linear_weights(
    plan: dict[str, Any], tensors: dict[str, Tensor]
) -> dict[str, Tensor]:
    """Store 2-D initializers used only as MatMul/Gemm(transB=0) ``B`` as ``(out, in)``; patch the plan."""
    uses: dict[str, list[tuple[dict[str, Any], int]]] = {}
    for node in plan["nodes"]:
        for i, name in enumerate(node["inputs"]):
            if name in tensors:
                uses.setdefault(name, []).append((node, i))
    flip = {
        name
        for name, used in uses.items()
        if len(tensors[name].shape) == 2
        and tensors[name].dtype in (DType.F32, DType.F16, DType.BF16, DType.F64)
        and all(
            i == 1
            and (n["op"] == "MatMul" or (n["op"] == "Gemm" and not n["attrs"].get("transB", 0)))
            for n, i in used
        )
    }
    out = dict(tensors)
    new_nodes: list[dict[str, Any]] = []
    for node in plan["nodes"]:
        if node["op"] == "Gemm" and len(node["inputs"]) > 1 and node["inputs"][1] in flip:
            node["attrs"]["transB"] = 1
        elif node["op"] == "MatMul" and node["inputs"][1] in flip:
            w = node["inputs"][1]
            t_name = f"{w}::T({node['name'] or len(new_nodes)})"
            new_nodes.append(
                {
                    "op": "Transpose",
                    "name": t_name,
                    "inputs": [w],
                    "outputs": [t_name],
                    "attrs": {"perm": [1, 0]},
                }
            )
            node["inputs"][1] = t_name
        new_nodes.append(node)
    plan["nodes"] = new_nodes
    for name in flip:
        t = tensors[name]
        out[name] = Tensor(name, t.dtype, (t.shape[1], t.shape[0]), _transposed_loader(t))
    return out


def _transposed_loader(t: Tensor) -> Any:
    def load() -> np.ndarray[Any, Any]:
        return np.ascontiguousarray(t.data().T)

    return load


def _rename(plan: dict[str, Any], mapping: dict[str, str]) -> None:
    for node in plan["nodes"]:
        node["inputs"] = [mapping.get(n, n) for n in node["inputs"]]
        node["outputs"] = [mapping.get(n, n) for n in node["outputs"]]
    plan["initializers"] = sorted(mapping.get(n, n) for n in plan["initializers"])


def load_onnx(path: str | Path) -> ModelIR:
    """Read an ``.onnx`` file: tensors from its initializers, and its graph as an execution plan."""
    import onnx
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, OSError, ValueError, RuntimeError) as e:
        raise FormatError(f"not a readable ONNX model ({e})", path=path) from e
    if not model.graph.node and not model.graph.initializer:
        raise FormatError("ONNX file has an empty graph (not an ONNX model?)", path=path)
    source = SourceInfo(path=str(path), format="onnx", size=path.stat().st_size)
    raw = _read_initializers(model, path)
    if detect_architecture(list(raw)) is not None:  # a transformer exported with its HF names
        return build_model_ir(raw, None, source, metadata={"onnx_opset": _opset(model)})
    plan, constants = build_plan(model, path)
    tensors = _transpose_linear_weights(plan, {**raw, **constants})
    shapes = {n: t.shape for n, t in tensors.items()}
    hparams = HParams()
    if _is_chain(list(tensors), shapes):
        hparams = infer_architecture(list(tensors), None, shapes)[1]
        mapping = mlp_names(list(tensors), shapes)
        tensors = {new: _renamed(tensors[old], new) for old, new in mapping.items()}
        _rename(plan, mapping)
        acts = {n["op"] for n in plan["nodes"]} & set(_ACTIVATION_OPS)
        hparams.activation = _ACTIVATION_OPS[acts.pop()] if len(acts) == 1 else ""
    return ModelIR(
        architecture="mlp",
        hparams=hparams,
        tensors=tensors,
        source=source,
        graph=plan,
        metadata={"onnx_opset": plan["opset"], "onnx_producer": model.producer_name},
    )


_ACTIVATION_OPS = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh"}


def _is_chain(names: list[str], shapes: dict[str, tuple[int, ...]]) -> bool:
    try:
        mlp_names(names, shapes)
    except ArchitectureError:
        return False
    return True


def _renamed(t: Tensor, name: str) -> Tensor:
    return Tensor(name, t.dtype, t.shape, t.loader)


def _opset(model: Any) -> int:
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
