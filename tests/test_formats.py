"""Format readers: safetensors, PyTorch zip (restricted unpickler), ONNX (+ plan executor), HF dirs."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from safetensors.numpy import save_file

from modelc.errors import FormatError, UnsafePickleError, UnsupportedError
from modelc.formats import load_model
from modelc.formats.hf import load_hf_dir
from modelc.formats.ir import DType, ModelIR
from modelc.formats.onnx import load_onnx, run_plan
from modelc.formats.pytorch import load_pytorch, read_pytorch
from modelc.formats.safetensors import load_safetensors, read_safetensors

FIX = Path(__file__).parent / "fixtures" / "formats"


def _tensors(ir: ModelIR) -> dict[str, tuple[DType, tuple[int, ...], bytes]]:
    return {
        n: (t.dtype, t.shape, np.ascontiguousarray(t.data()).tobytes())
        for n, t in ir.tensors.items()
    }


def _write_st(
    path: Path, entries: list[tuple[str, str, list[int], bytes]], *, offsets: Any = None
) -> None:
    """Write a safetensors file by hand (so tests can also write broken ones)."""
    header: dict[str, Any] = {}
    pos = 0
    for i, (name, dt, shape, data) in enumerate(entries):
        header[name] = {
            "dtype": dt,
            "shape": shape,
            "data_offsets": offsets[i] if offsets else [pos, pos + len(data)],
        }
        pos += len(data)
    h = json.dumps(header).encode()
    path.write_bytes(len(h).to_bytes(8, "little") + h + b"".join(e[3] for e in entries))


# --- one MLP, five files ----------------------------------------------------------------


MLP_FILES = ["mlp.safetensors", "mlp.bin", "mlp.onnx", "mlp_ext.onnx", "mlp_matmul.onnx"]


@pytest.mark.parametrize("name", MLP_FILES)
def test_mlp_identical_across_formats(name: str) -> None:
    ref = load_safetensors(FIX / "mlp.safetensors")
    ir = load_model(FIX / name)
    assert ir.architecture == "mlp"
    assert ir.hparams.layer_sizes == [8, 16, 12, 4]
    assert _tensors(ir) == _tensors(ref)
    assert list(ir.tensors) == [f"layers.{i}.{k}" for i in range(3) for k in ("weight", "bias")]


def test_mlp_weights_reproduce_torch_output() -> None:
    golden = np.load(FIX / "mlp_golden.npz")
    ir = load_pytorch(FIX / "mlp.bin")
    h = golden["x"]
    for i in range(ir.hparams.n_layer):
        h = h @ ir.tensors[f"layers.{i}.weight"].data().T + ir.tensors[f"layers.{i}.bias"].data()
        if i < ir.hparams.n_layer - 1:
            h = np.maximum(h, 0)
    np.testing.assert_allclose(h, golden["y"], rtol=1e-5, atol=1e-6)


# --- safetensors ------------------------------------------------------------------------


def test_safetensors_is_memory_mapped() -> None:
    raw, meta = read_safetensors(FIX / "mlp.safetensors")
    arr = raw["net.0.weight"].data()
    assert meta == {"format": "pt"}
    assert not arr.flags.owndata and not arr.flags.writeable
    base = arr
    while not isinstance(base, np.memmap) and base.base is not None:
        base = base.base
    assert isinstance(base, np.memmap)


def test_safetensors_dtypes_match_reference_library(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays: dict[str, np.ndarray[Any, Any]] = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f16": rng.standard_normal((5,)).astype(np.float16),
        "f64": rng.standard_normal((2, 2)),
        "i8": np.array([-128, 0, 127], np.int8),
        "i16": np.array([[-3, 4]], np.int16),
        "i32": np.arange(6, dtype=np.int32).reshape(2, 3),
        "i64": np.array([2**40, -1], np.int64),
        "u8": np.array([0, 255], np.uint8),
        "bool": np.array([True, False, True]),
        "scalar": np.array(1.5, np.float32),
    }
    save_file(arrays, str(tmp_path / "all.safetensors"))
    raw, _ = read_safetensors(tmp_path / "all.safetensors")
    for name, want in arrays.items():
        got = raw[name].data()
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want)
    bf16_bits = np.array([0x3F80, 0xC000, 0x7F80], np.uint16)  # 1.0, -2.0, inf
    _write_st(tmp_path / "bf16.safetensors", [("b", "BF16", [3], bf16_bits.tobytes())])
    t = read_safetensors(tmp_path / "bf16.safetensors")[0]["b"]
    assert t.dtype is DType.BF16
    np.testing.assert_array_equal(t.data(), bf16_bits)


def test_safetensors_truncated(tmp_path: Path) -> None:
    data = (FIX / "mlp.safetensors").read_bytes()
    bad = tmp_path / "trunc.safetensors"
    bad.write_bytes(data[:-100])
    with pytest.raises(FormatError, match=r"trunc\.safetensors.*'net\.4\.(weight|bias)'.*outside"):
        load_safetensors(bad)
    bad.write_bytes(data[:200])
    with pytest.raises(FormatError, match=r"trunc\.safetensors.*header length"):
        load_safetensors(bad)
    bad.write_bytes(data[:5])
    with pytest.raises(FormatError, match="truncated"):
        load_safetensors(bad)


def test_safetensors_lying_offsets(tmp_path: Path) -> None:
    w = np.ones((2, 2), np.float32).tobytes()
    p = tmp_path / "lie.safetensors"
    _write_st(p, [("a", "F32", [2, 2], w)], offsets=[[0, 8]])
    with pytest.raises(FormatError, match=r"lie\.safetensors: tensor 'a': 8 bytes .* needs 16"):
        load_safetensors(p)
    _write_st(p, [("a", "F32", [2, 2], w)], offsets=[[16, 32]])
    with pytest.raises(FormatError, match=r"tensor 'a'.*outside the 16-byte data section"):
        load_safetensors(p)
    _write_st(p, [("a", "F32", [2, 2], w), ("b", "F32", [2, 2], w)], offsets=[[0, 16], [8, 24]])
    with pytest.raises(FormatError, match="overlap"):
        load_safetensors(p)
    _write_st(p, [("a", "F8_E4M3", [4], b"\0" * 4)])
    with pytest.raises(UnsupportedError, match="'a' has dtype F8_E4M3"):
        load_safetensors(p)


def test_random_bytes_are_format_errors(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    junk = rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
    for name in ("junk.safetensors", "junk.bin", "junk.onnx"):
        p = tmp_path / name
        p.write_bytes(junk)
        with pytest.raises(FormatError, match=name):
            load_model(p)
    p = tmp_path / "junk2.safetensors"
    p.write_bytes((40).to_bytes(8, "little") + b"{not json at all" + junk[:100])
    with pytest.raises(
        FormatError, match=r"junk2\.safetensors: safetensors header is not valid JSON"
    ):
        load_safetensors(p)
    for name, loader in (
        ("r.safetensors", load_safetensors),
        ("r.bin", load_pytorch),
        ("r.onnx", load_onnx),
    ):
        p = tmp_path / name
        p.write_bytes(b"\x08\x07" + junk)
        with pytest.raises(FormatError, match=name):
            loader(p)


# --- PyTorch ----------------------------------------------------------------------------


def test_tied_gpt2_bin_shares_one_storage() -> None:
    raw = read_pytorch(FIX / "gpt2-bin" / "pytorch_model.bin")
    lm, wte = raw["lm_head.weight"].data(), raw["transformer.wte.weight"].data()
    assert np.shares_memory(lm, wte)
    assert isinstance(lm.base if lm.base is not None else lm, np.memmap)
    ir = load_hf_dir(FIX / "gpt2-bin")
    assert ir.hparams.tie_embeddings and "output.weight" not in ir.tensors
    assert _tensors(ir) == _tensors(load_hf_dir(FIX / "gpt2-st"))


def test_malicious_pickle_refused_and_not_executed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The payload is real: a plain pickle.load in a child process does run it.
    armed = tmp_path / "armed"
    armed.mkdir()
    code = "import pickle,sys,zipfile; pickle.loads(zipfile.ZipFile(sys.argv[1]).read('archive/data.pkl'))"
    subprocess.run([sys.executable, "-c", code, str(FIX / "malicious.bin")], cwd=armed, check=False)
    assert (armed / "MODELC_PWNED").exists()
    safe = tmp_path / "safe"
    safe.mkdir()
    monkeypatch.chdir(safe)
    with pytest.raises(UnsafePickleError, match=r"malicious\.bin: refusing to load.*posix\.system"):
        load_model(FIX / "malicious.bin")
    assert not (safe / "MODELC_PWNED").exists()


def _torch_like_zip(path: Path, payload: bytes, members: dict[str, bytes] | None = None) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", payload)
        for name, data in (members or {}).items():
            zf.writestr(name, data)


class _Eval:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (eval, ("__import__('os').getcwd()",))


def test_other_unsafe_globals_refused(tmp_path: Path) -> None:
    p = tmp_path / "eval.bin"
    _torch_like_zip(p, pickle.dumps({"w": _Eval()}, protocol=4))
    with pytest.raises(UnsafePickleError, match=r"builtins\.eval"):
        load_pytorch(p)
    _torch_like_zip(p, pickle.dumps({"w": shutil.rmtree}, protocol=2))
    with pytest.raises(UnsafePickleError, match=r"shutil\.rmtree"):
        load_pytorch(p)


class _Popen:
    def __reduce__(self) -> tuple[Any, tuple[list[str]]]:
        import subprocess as sp

        return (sp.Popen, (["touch", "MODELC_PWNED"],))


# GLOBAL with a dotted attribute chain (protocol 4's STACK_GLOBAL resolves 'path.os.system')
_CHAIN = (
    b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00"
    b"\x8c\x02os\x94\x8c\x0epath.os.system\x94\x93\x94\x8c\x04true\x94\x85\x94R\x94."
)
# a payload nested inside an allowed call: torch._utils._rebuild_tensor_v2(os.system(...))
_NESTED = (
    b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n"
    b"cposix\nsystem\nX\x14\x00\x00\x00touch MODELC_PWNED_2\x85R\x85R."
)


@pytest.mark.parametrize(
    ("payload", "names"),
    [
        (lambda: pickle.dumps({"w": _Popen()}, protocol=2), r"\.Popen, which is not needed"),
        (lambda: _CHAIN, r"os\.path\.os\.system|path\.os\.system"),
        (lambda: _NESTED, r"posix\.system"),
    ],
    ids=["subprocess.Popen", "attribute-chain", "nested-reduce"],
)
def test_exploit_payloads_refused_and_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, payload: Any, names: str
) -> None:
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "x.bin"
    _torch_like_zip(p, payload())
    with pytest.raises(UnsafePickleError, match=names):
        load_pytorch(p)
    assert not list(tmp_path.glob("MODELC_PWNED*"))


def test_legacy_and_broken_checkpoints(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.bin"
    legacy.write_bytes(b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19." + b"\0" * 64)
    with pytest.raises(FormatError, match=r"legacy\.bin.*re-save it with torch>=1\.6"):
        load_pytorch(legacy)
    nopkl = tmp_path / "nopkl.bin"
    with zipfile.ZipFile(nopkl, "w") as zf:
        zf.writestr("archive/version", "3")
    with pytest.raises(FormatError, match=r"nopkl\.bin: zip has no <name>/data\.pkl"):
        load_pytorch(nopkl)
    # a checkpoint whose storage member is gone
    src = zipfile.ZipFile(FIX / "mlp.bin")
    gone = tmp_path / "gone.bin"
    with zipfile.ZipFile(gone, "w", zipfile.ZIP_STORED) as zf:
        for info in src.infolist():
            if not info.filename.endswith("data/3"):
                zf.writestr(info.filename, src.read(info))
    with pytest.raises(FormatError, match=r"gone\.bin: storage member 'mlp/data/3' is missing"):
        load_pytorch(gone)


def _op(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=2)[2:-1]  # one value's opcodes, without PROTO/STOP


def _torch_pickle(
    tensors: dict[str, tuple[int, tuple[int, ...], tuple[int, ...]]], numel: int
) -> bytes:
    """data.pkl as torch writes it: {name: _rebuild_tensor_v2(storage 0, offset, size, stride, ...)}."""
    persid = (
        b"("
        + _op("storage")
        + b"ctorch\nFloatStorage\n"
        + _op("0")
        + _op("cpu")
        + _op(numel)
        + b"tQ"
    )
    body = b""
    for name, (off, size, stride) in tensors.items():
        args = (
            persid
            + _op(off)
            + _op(size)
            + _op(stride)
            + _op(False)
            + b"ccollections\nOrderedDict\n)R"
        )
        body += _op(name) + b"ctorch._utils\n_rebuild_tensor_v2\n(" + args + b"tR"
    return b"\x80\x02}(" + body + b"u."


def test_strided_and_offset_views(tmp_path: Path) -> None:
    """Tensors viewing one storage with an offset and with transposed strides (torch's own encoding)."""
    storage = np.arange(12, dtype=np.float32)
    p = tmp_path / "views.bin"
    payload = _torch_pickle(
        {"t": (2, (2, 3), (1, 2)), "s": (6, (3,), (1,)), "bad": (10, (3,), (1,))}, 12
    )
    _torch_like_zip(p, payload, {"archive/data/0": storage.tobytes()})
    raw = read_pytorch(p)
    np.testing.assert_array_equal(raw["s"].data(), storage[6:9])
    assert np.shares_memory(raw["s"].data(), raw["t"].data()) is False  # strided view was copied
    np.testing.assert_array_equal(raw["t"].data(), np.array([[2, 4, 6], [3, 5, 7]], np.float32))
    with pytest.raises(FormatError, match=r"views\.bin: tensor 'bad' reaches outside its storage"):
        raw["bad"].data()
    _torch_like_zip(
        p, _torch_pickle({"neg": (0, (-1, 3), (3, 1))}, 12), {"archive/data/0": storage.tobytes()}
    )
    with pytest.raises(FormatError, match=r"views\.bin: tensor with size \(-1, 3\)"):
        read_pytorch(p)
    # BUILD (setstate) on a rebuilt tensor cannot rewire it
    payload = (
        _torch_pickle({"t": (0, (3,), (1,))}, 12)[:-2] + b"}" + _op("storage") + _op(5) + b"sbu."
    )
    _torch_like_zip(p, payload, {"archive/data/0": storage.tobytes()})
    with pytest.raises(UnsafePickleError, match=r"views\.bin: .*set the state of a _TensorRef"):
        read_pytorch(p)


# --- Hugging Face directories -------------------------------------------------------------


def test_hf_llama_sharded_safetensors_and_bin_agree() -> None:
    a, b = load_hf_dir(FIX / "llama-st"), load_hf_dir(FIX / "llama-bin")
    assert a.architecture == b.architecture == "llama"
    assert _tensors(a) == _tensors(b)
    assert a.metadata["weights"] == "model.safetensors.index.json"
    assert b.metadata["weights"] == "pytorch_model.bin.index.json"
    assert "output.weight" in a.tensors and not a.hparams.tie_embeddings


def test_hf_tokenizer_and_generation() -> None:
    ir = load_hf_dir(FIX / "llama-st")
    tok = ir.tokenizer
    assert tok is not None and tok.model == "hf" and tok.hf_json is not None
    vocab = json.loads(tok.hf_json)["model"]["vocab"]
    assert tok.bos_id == vocab["<s>"] and tok.eos_id == vocab["<|im_end|>"]
    assert tok.add_bos and not tok.add_eos
    assert ir.chat_template is not None and "<|im_start|>" in ir.chat_template
    assert ir.generation["temperature"] == 0.7 and ir.generation["top_p"] == 0.9
    assert ir.generation["stop_token_ids"] == [vocab["</s>"], vocab["<|im_end|>"]]
    g = load_hf_dir(FIX / "gpt2-st")
    assert (
        g.tokenizer is not None
        and g.tokenizer.eos_id
        == json.loads(g.tokenizer.hf_json or "")["model"]["vocab"]["<|endoftext|>"]
    )
    assert g.chat_template is None


def test_hf_missing_shard(tmp_path: Path) -> None:
    for name, shard in (
        ("llama-st", "model-00002-of-00002.safetensors"),
        ("llama-bin", "pytorch_model-00001-of-00002.bin"),
    ):
        d = tmp_path / name
        shutil.copytree(FIX / name, d)
        (d / shard).unlink()
        with pytest.raises(FormatError, match=rf"{shard}: shard '{shard}' listed in .* is missing"):
            load_model(d)


def test_hf_dir_without_config_or_weights(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match=r"config\.json is missing"):
        load_hf_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(FormatError, match="no weights found"):
        load_hf_dir(tmp_path)


# --- ONNX -------------------------------------------------------------------------------


def _reference(path: Path, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    outs: list[Any] = list(ReferenceEvaluator(str(path)).run(None, {"x": x}))
    return np.asarray(outs[0])


def _weights(ir: ModelIR) -> dict[str, np.ndarray[Any, Any]]:
    return {n: t.data() for n, t in ir.tensors.items()}


@pytest.mark.parametrize("name", ["mlp.onnx", "mlp_ext.onnx", "mlp_matmul.onnx", "ops.onnx"])
def test_run_plan_matches_onnx_reference(name: str) -> None:
    ir = load_onnx(FIX / name)
    assert ir.graph is not None
    json.dumps(ir.graph)  # the plan is JSON-able
    x = (
        np.random.default_rng(3)
        .standard_normal((5, 6 if name == "ops.onnx" else 8))
        .astype(np.float32)
    )
    want = _reference(FIX / name, x)
    got = run_plan(ir.graph, _weights(ir), {"x": x})["y"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if name != "ops.onnx":
        golden = np.load(FIX / "mlp_golden.npz")
        np.testing.assert_allclose(
            run_plan(ir.graph, _weights(ir), {"x": golden["x"]})["y"],
            golden["y"],
            rtol=1e-5,
            atol=1e-6,
        )


def test_ops_graph_plan_shape() -> None:
    ir = load_onnx(FIX / "ops.onnx")
    assert ir.architecture == "mlp" and ir.hparams.layer_sizes == [] and ir.graph is not None
    ops = [n["op"] for n in ir.graph["nodes"]]
    assert ops[:5] == ["Gemm", "Tanh", "Transpose", "MatMul", "LayerNormalization"]
    assert ir.tensors["w_mm"].shape == (8, 8) and ir.graph["nodes"][2]["inputs"] == ["w_mm"]
    assert ir.tensors["w_gemm"].shape == (8, 6)  # stored (out, in); plan uses transB=1
    gemm = next(n for n in ir.graph["nodes"] if n["op"] == "Gemm")
    assert gemm["attrs"]["transB"] == 1 and gemm["attrs"]["alpha"] == 0.5


def test_onnx_external_data_segmented() -> None:
    m = onnx.load(str(FIX / "mlp_ext.onnx"), load_external_data=False)
    offsets = sorted(
        int({e.key: e.value for e in i.external_data}["offset"]) for i in m.graph.initializer
    )
    assert (
        len(offsets) == 6 and offsets[0] == 0 and len(set(offsets)) == 6
    )  # six tensors in one file
    ir = load_onnx(FIX / "mlp_ext.onnx")
    arr = ir.tensors["layers.1.weight"].data()
    assert isinstance(arr, np.memmap)


def test_onnx_missing_or_short_external_file(tmp_path: Path) -> None:
    shutil.copy(FIX / "mlp_ext.onnx", tmp_path / "m.onnx")
    with pytest.raises(
        FormatError, match=r"mlp_ext\.weights: external data file 'mlp_ext\.weights'.* is missing"
    ):
        load_model(tmp_path / "m.onnx")
    (tmp_path / "mlp_ext.weights").write_bytes((FIX / "mlp_ext.weights").read_bytes()[:1000])
    with pytest.raises(FormatError, match=r"mlp_ext\.weights: initializer .*truncated"):
        load_onnx(tmp_path / "m.onnx")


def test_onnx_unsupported_ops_listed(tmp_path: Path) -> None:
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        helper.make_node("Gelu", ["a"], ["b"]),
        helper.make_node("Erf", ["b"], ["c"]),
        helper.make_node("Erf", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [w],
    )
    p = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(p))
    with pytest.raises(
        UnsupportedError, match=r"bad\.onnx: .*Erf \(x2\), Gelu \(x1\); supported: MatMul"
    ):
        load_onnx(p)


def test_onnx_constant_folded_and_reshape(tmp_path: Path) -> None:
    nodes = [
        helper.make_node(
            "Constant", [], ["shape"], value=numpy_helper.from_array(np.array([0, -1], np.int64))
        ),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Softmax", ["r"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12])],
    )
    p = tmp_path / "c.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]), str(p))
    ir = load_onnx(p)
    assert "shape" in ir.tensors and ir.graph is not None and ir.graph["opset"] == 11
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    want = _reference(p, x)
    np.testing.assert_allclose(run_plan(ir.graph, _weights(ir), {"x": x})["y"], want, rtol=1e-6)


def test_hf_tokenizer_built_from_vocab_txt(tmp_path: Path) -> None:
    """A BERT dir without tokenizer.json gets an equivalent one built from vocab.txt."""
    from tokenizers import Tokenizer

    from tests.assets import minilm_dir

    src = minilm_dir()
    d = tmp_path / "minilm"
    d.mkdir()
    for f in src.iterdir():
        if f.name != "tokenizer.json":
            (d / f.name).symlink_to(f)
    ir = load_hf_dir(d)
    assert ir.tokenizer is not None and ir.tokenizer.hf_json is not None
    assert (ir.tokenizer.cls_id, ir.tokenizer.sep_id, ir.tokenizer.unk_id) == (101, 102, 100)
    assert ir.metadata["max_seq_length"] == 256
    built = Tokenizer.from_str(ir.tokenizer.hf_json)
    ref = Tokenizer.from_file(str(src / "tokenizer.json"))
    ref.no_padding()
    text = "Hello, World! Unbelievable tokenization of naive cafe text."
    assert built.encode(text).ids == ref.encode(text).ids
    assert built.encode(text).ids[0] == 101


def test_onnx_with_hf_transformer_names_maps_like_hf(tmp_path: Path) -> None:
    """ONNX initializers named like a HF GPT-2 give the same canonical tensors as the HF dir."""
    raw, _ = read_safetensors(FIX / "gpt2-st" / "model.safetensors")
    inits = [numpy_helper.from_array(np.asarray(t.data()), name) for name, t in raw.items()]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "gpt2",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        inits,
    )
    p = tmp_path / "gpt2.onnx"
    onnx.save(helper.make_model(graph), str(p))
    ir = load_onnx(p)
    assert ir.architecture == "gpt2" and ir.graph is None
    assert _tensors(ir) == _tensors(load_hf_dir(FIX / "gpt2-st"))


@pytest.mark.parametrize("dim", [2**63, 2**62, -(2**63), 2**41])
def test_pytorch_huge_dimension_is_a_format_error(tmp_path: Path, dim: int) -> None:
    """A size of 2**63 used to wrap the element count to 0 in int64, skip the bounds check
    and escape as numpy's ValueError (issue 15): every implausible size is a FormatError,
    from the library and from the CLI (one line, exit 2)."""
    import zipfile

    from tests.gen_gpt2 import write_torch_zip

    good = tmp_path / "good.bin"
    write_torch_zip({"w": np.zeros((4, 7777), np.float32)}, good)
    with zipfile.ZipFile(good) as z:
        members = {n: z.read(n) for n in z.namelist()}
    placeholder = b"J" + (7777).to_bytes(4, "little")  # BININT 7777: size, then stride
    long1 = b"\x8a" + bytes([9]) + dim.to_bytes(9, "little", signed=True)  # LONG1
    assert members["archive/data.pkl"].count(placeholder) == 2
    members["archive/data.pkl"] = members["archive/data.pkl"].replace(placeholder, long1, 1)
    bad = tmp_path / "bad.bin"
    with zipfile.ZipFile(bad, "w", zipfile.ZIP_STORED) as z:
        for n, b in members.items():
            z.writestr(n, b)
    with pytest.raises(FormatError, match=r"bad\.bin"):
        load_pytorch(bad).tensors["w"].data()
    p = subprocess.run(
        [sys.executable, "-m", "modelc.cli", "inspect", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MODELC_CACHE": str(tmp_path / "cache")},
    )
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr
