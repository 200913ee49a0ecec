"""The .modelc artifact: round trips, compression, quantization, prune, verify, export, bad files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from modelc.artifact import (
    PackOptions,
    export_safetensors,
    load_artifact,
    open_artifact,
    verify_artifact,
    write_artifact,
)
from modelc.artifact.format import HEADER_SIZE, Header, encode_manifest
from modelc.errors import FormatError, IntegrityError, UnsupportedError, UsageError
from modelc.formats import load_model, quants
from modelc.formats.ir import DType, HParams, ModelIR, SourceInfo, Tensor
from tests import assets

GGML = {DType.Q4_1: gguf.GGMLQuantizationType.Q4_1, DType.Q8_0: gguf.GGMLQuantizationType.Q8_0}


@pytest.fixture(scope="module")
def smol_gguf() -> Path:
    return assets.smollm2_gguf()


@pytest.fixture(scope="module")
def smol_artifact(smol_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smol") / "smol.modelc"
    write_artifact(load_model(smol_gguf), out)
    return out


def _mlp_weights(rng: np.random.Generator) -> dict[str, np.ndarray[Any, Any]]:
    return {
        "fc1.weight": rng.standard_normal((64, 96), dtype=np.float32),
        "fc1.bias": rng.standard_normal(64, dtype=np.float32),
        "fc2.weight": rng.standard_normal((40, 64), dtype=np.float32),
        "fc2.bias": rng.standard_normal(40, dtype=np.float32),
        "fc3.weight": rng.standard_normal((8, 40), dtype=np.float32),  # 40 cols: no 32-block fit
    }


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray[Any, Any]]]:
    """A tiny MLP safetensors file and its arrays under canonical names."""
    w = _mlp_weights(np.random.default_rng(0))
    path = tmp_path / "tiny.safetensors"
    save_file(w, str(path))
    canon = {
        "layers.0.weight": w["fc1.weight"],
        "layers.0.bias": w["fc1.bias"],
        "layers.1.weight": w["fc2.weight"],
        "layers.1.bias": w["fc2.bias"],
        "layers.2.weight": w["fc3.weight"],
    }
    return path, canon


def test_smollm2_round_trip_is_bit_exact_and_zero_copy(
    smol_gguf: Path, smol_artifact: Path
) -> None:
    src = load_model(smol_gguf)
    art = open_artifact(smol_artifact)
    ir = art.to_ir()
    assert ir.architecture == "llama"
    assert ir.hparams == src.hparams
    assert ir.tokenizer == src.tokenizer
    assert ir.chat_template and ir.chat_template == src.chat_template
    assert list(ir.tensors) == list(src.tensors)
    assert 134_000_000 < ir.n_params < 135_000_000
    for name, t in src.tensors.items():
        got = ir.tensors[name]
        assert (got.dtype, got.shape) == (t.dtype, t.shape), name
        a, b = got.data(), t.data()
        assert a.shape == b.shape and np.array_equal(a, b), name
    for e in art.manifest.tensors:
        assert (art.header.data_offset + e.offset) % 64 == 0, e.name
    # uncompressed tensors are read-only views of the mapping, not copies
    emb = ir.tensors["token_embd.weight"].data()
    assert not emb.flags.owndata and not emb.flags.writeable
    assert emb.dtype == np.uint8 and emb.shape == (49152, 576 // 32 * 34)


def test_verify_ok_and_export_matches_gguf_dequantize(smol_artifact: Path, tmp_path: Path) -> None:
    rep = verify_artifact(smol_artifact)
    assert rep.tensors == 272
    out = tmp_path / "smol.safetensors"
    full = load_artifact(smol_artifact)
    names = (
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.29.ffn_down.weight",
        "output_norm.weight",
    )
    ir = ModelIR("llama", full.hparams, {k: full.tensors[k] for k in names}, full.source)
    export_safetensors(ir, out)
    back = load_file(str(out))
    assert set(back) == set(names)
    for name in (
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.29.ffn_down.weight",
        "output_norm.weight",
    ):
        t = ir.tensors[name]
        if t.dtype in GGML:
            want = gguf.quants.dequantize(np.asarray(t.data()), GGML[t.dtype]).reshape(t.shape)
        else:
            want = t.data()
        assert back[name].dtype == np.float32 and back[name].shape == t.shape
        np.testing.assert_array_equal(back[name], want)


def test_plain_round_trip_compressed(tiny: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, canon = tiny
    ir = load_model(path)
    plain, packed = tmp_path / "p.modelc", tmp_path / "c.modelc"
    write_artifact(ir, plain)
    m = write_artifact(load_model(path), packed, PackOptions(compress=True, compression_level=19))
    assert m.pack.compression == "zstd" and m.pack.compression_level == 19
    assert all(e.compression == "zstd" for e in m.tensors)
    art = open_artifact(packed)
    assert art.header.compressed
    for name, arr in canon.items():
        got = art.to_ir().tensors[name].data()
        np.testing.assert_array_equal(got, arr)
    verify_artifact(packed)
    exported = tmp_path / "e.safetensors"
    export_safetensors(art.to_ir(), exported)
    back = load_file(str(exported))
    for name, arr in canon.items():
        np.testing.assert_array_equal(back[name], arr)


def test_compression_shrinks_redundant_data(tmp_path: Path) -> None:
    zeros = np.zeros((256, 256), np.float32)
    ir = _ir({"layers.0.weight": zeros})
    m = write_artifact(ir, tmp_path / "z.modelc", PackOptions(compress=True))
    assert m.tensors[0].stored_nbytes < zeros.nbytes // 50
    np.testing.assert_array_equal(
        load_artifact(tmp_path / "z.modelc").tensors["layers.0.weight"].data(), zeros
    )


@pytest.mark.parametrize(
    ("method", "dtype", "tol"),
    [
        ("fp16", DType.F16, 2e-3),
        ("q8_0", DType.Q8_0, 0.02),
        ("int8", DType.INT8, 0.03),
        ("q4_0", DType.Q4_0, 0.35),
        ("int4", DType.Q4_1, 0.35),
    ],
)
def test_quantize_round_trip(
    tiny: tuple[Path, dict[str, Any]], tmp_path: Path, method: str, dtype: DType, tol: float
) -> None:
    from modelc.artifact.transform import to_f32

    path, canon = tiny
    out = tmp_path / f"{method}.modelc"
    m = write_artifact(load_model(path), out, PackOptions(quantize=method, compress=True))
    verify_artifact(out)
    assert m.pack.quantize == method
    table = {e.name: e for e in m.tensors}
    ir = load_artifact(out)
    assert table["layers.0.weight"].dtype == dtype.value
    assert table["layers.1.weight"].dtype == dtype.value
    assert table["layers.0.bias"].dtype == "f32"  # 1-D: untouched
    fits_blocks = dtype in (DType.F16, DType.INT8)
    # 40 columns: no 32-weight block fits; llama-quantize's mixes (q8_0, q4_0) store the
    # matrix in f16 (tensor_type_fallback), int4 keeps it as it is
    mix = method in ("q8_0", "q4_0")
    want = dtype.value if fits_blocks else "f16" if mix else "f32"
    assert table["layers.2.weight"].dtype == want
    assert m.pack.quantized_tensors == (3 if fits_blocks or mix else 2)
    for name, arr in canon.items():
        t = ir.tensors[name]
        got = to_f32(t.data(), t.dtype, t.shape)
        err = np.abs(got - arr).max() / np.abs(arr).max()
        assert err < tol, (name, err)
    np.testing.assert_array_equal(ir.tensors["layers.0.bias"].data(), canon["layers.0.bias"])
    # export writes the dequantized weights as f32
    exp = tmp_path / f"{method}.safetensors"
    export_safetensors(ir, exp)
    back = load_file(str(exp))
    t = ir.tensors["layers.0.weight"]
    np.testing.assert_array_equal(back["layers.0.weight"], to_f32(t.data(), t.dtype, t.shape))


def test_quantized_tensors_are_requantized_through_f32(smol_gguf: Path, tmp_path: Path) -> None:
    """--quantize keeps a matrix already of its type and requantizes the others (as
    llama-quantize --allow-requantize); --prune requantizes them to their own type."""
    src = load_model(smol_gguf)
    keep = {
        k: src.tensors[k]
        for k in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_norm.weight")
    }
    ir = ModelIR("llama", src.hparams, keep, src.source)
    m = write_artifact(ir, tmp_path / "q.modelc", PackOptions(quantize="q8_0"))
    assert [e.dtype for e in m.tensors] == ["q8_0", "q8_0", "f32"]
    assert m.pack.quantized_tensors == m.pack.requantized_tensors == 1
    assert m.pack.requantized_from == ["q4_1"]
    out = load_artifact(tmp_path / "q.modelc")
    emb, q = src.tensors["token_embd.weight"], src.tensors["blk.0.attn_q.weight"]
    assert np.array_equal(out.tensors["token_embd.weight"].data(), emb.data())  # kept as is
    want = quants.quantize(quants.dequantize(q.data(), q.dtype, q.shape), DType.Q8_0)
    assert np.array_equal(out.tensors["blk.0.attn_q.weight"].data(), want)
    m = write_artifact(ir, tmp_path / "p.modelc", PackOptions(prune=0.02))
    assert [e.dtype for e in m.tensors] == ["q8_0", "q4_1", "f32"]
    assert m.pack.quantized_tensors == 0 and m.pack.requantized_tensors == 2
    assert m.pack.pruned_weights > 0


def test_prune_zeroes_small_weights_only(tiny: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, canon = tiny
    m = write_artifact(load_model(path), tmp_path / "p.modelc", PackOptions(prune=0.5))
    ir = load_artifact(tmp_path / "p.modelc")
    w = canon["layers.0.weight"]
    got = ir.tensors["layers.0.weight"].data()
    np.testing.assert_array_equal(got, np.where(np.abs(w) < 0.5, 0, w))
    np.testing.assert_array_equal(ir.tensors["layers.0.bias"].data(), canon["layers.0.bias"])
    expected = sum(int((np.abs(canon[k]) < 0.5).sum()) for k in canon if k.endswith("weight"))
    assert m.pack.pruned_weights == expected and m.pack.prune_threshold == 0.5


def test_bad_pack_options(tmp_path: Path) -> None:
    ir = _ir({"layers.0.weight": np.ones((4, 4), np.float32)})
    with pytest.raises(UsageError, match="quantization"):
        write_artifact(ir, tmp_path / "x.modelc", PackOptions(quantize="q3"))
    with pytest.raises(UsageError, match="prune"):
        write_artifact(ir, tmp_path / "x.modelc", PackOptions(prune=-1.0))
    assert not list(tmp_path.iterdir())


def _ir(arrays: dict[str, np.ndarray[Any, Any]]) -> ModelIR:
    tensors = {
        k: Tensor(k, DType(_dt(v)), tuple(v.shape), (lambda v=v: v)) for k, v in arrays.items()
    }
    return ModelIR("mlp", HParams(), tensors, SourceInfo(path="memory", format="safetensors"))


def _dt(v: np.ndarray[Any, Any]) -> str:
    return {"float32": "f32", "float16": "f16", "int64": "i64"}[str(v.dtype)]


def test_failed_write_leaves_no_file(tmp_path: Path) -> None:
    def boom() -> np.ndarray[Any, Any]:
        raise FormatError("tensor data is unreadable", path="memory")

    ir = _ir({"layers.0.weight": np.ones((4, 4), np.float32)})
    ir.tensors["layers.1.weight"] = Tensor("layers.1.weight", DType.F32, (4, 4), boom)
    with pytest.raises(FormatError, match="unreadable"):
        write_artifact(ir, tmp_path / "x.modelc")
    assert list(tmp_path.iterdir()) == []


def test_loader_with_wrong_size_is_refused(tmp_path: Path) -> None:
    ir = _ir({"layers.0.weight": np.ones((4, 4), np.float32)})
    ir.tensors["layers.0.weight"].shape = (4, 5)
    with pytest.raises(FormatError, match=r"layers\.0\.weight.*expected 80"):
        write_artifact(ir, tmp_path / "x.modelc")
    assert list(tmp_path.iterdir()) == []


def _copy(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


def test_corrupt_tensor_byte_named_by_verify(tiny: tuple[Path, Any], tmp_path: Path) -> None:
    path, _ = tiny
    good = tmp_path / "g.modelc"
    write_artifact(load_model(path), good)
    art = open_artifact(good)
    e = next(x for x in art.manifest.tensors if x.name == "layers.1.weight")
    pos = art.header.data_offset + e.offset + 17
    art.close()
    bad = _copy(good, tmp_path / "b.modelc")
    raw = bytearray(bad.read_bytes())
    raw[pos] ^= 0x40
    bad.write_bytes(bytes(raw))
    open_artifact(bad).close()  # structure is fine
    with pytest.raises(IntegrityError, match=r"checksum mismatch in tensor layers\.1\.weight"):
        verify_artifact(bad)


def test_corrupt_compressed_tensor_fails_on_load(tiny: tuple[Path, Any], tmp_path: Path) -> None:
    path, _ = tiny
    f = tmp_path / "c.modelc"
    write_artifact(load_model(path), f, PackOptions(compress=True))
    art = open_artifact(f)
    e = art.manifest.tensors[0]
    pos = art.header.data_offset + e.offset + e.stored_nbytes // 2
    art.close()
    raw = bytearray(f.read_bytes())
    raw[pos] ^= 0xFF
    f.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match=e.name):
        verify_artifact(f)
    with pytest.raises(IntegrityError, match=e.name):
        load_artifact(f).tensors[e.name].data()


def test_truncated_and_header_damage(tiny: tuple[Path, Any], tmp_path: Path) -> None:
    path, _ = tiny
    good = tmp_path / "g.modelc"
    write_artifact(load_model(path), good)
    data = good.read_bytes()
    for n in (0, 10, HEADER_SIZE, len(data) // 2, len(data) - 1):
        cut = tmp_path / f"cut{n}.modelc"
        cut.write_bytes(data[:n])
        with pytest.raises(FormatError, match="truncated"):
            open_artifact(cut)
    hdr = bytearray(data)
    hdr[20] ^= 1  # inside the manifest offset
    (tmp_path / "h.modelc").write_bytes(bytes(hdr))
    with pytest.raises(FormatError, match="header checksum"):
        open_artifact(tmp_path / "h.modelc")
    magic = b"NOTMODEL" + data[8:]
    (tmp_path / "m.modelc").write_bytes(magic)
    with pytest.raises(FormatError, match="magic"):
        open_artifact(tmp_path / "m.modelc")
    future = bytearray(data)
    future[8] = 99  # format version
    (tmp_path / "v.modelc").write_bytes(bytes(future))
    with pytest.raises(UnsupportedError, match="version 99"):
        open_artifact(tmp_path / "v.modelc")
    with pytest.raises(FormatError, match="no such file"):
        open_artifact(tmp_path / "missing.modelc")


def _rewrite_manifest(src: Path, dst: Path, edit: Any) -> None:
    """Write ``dst`` as ``src`` with its manifest edited and the header re-checksummed."""
    import zlib

    art = open_artifact(src)
    m = art.manifest
    edit(m)
    h = art.header
    art.close()
    blob = encode_manifest(m)
    data = src.read_bytes()[: h.manifest_offset]
    nh = Header(
        h.format_version,
        h.flags,
        h.manifest_offset,
        len(blob),
        h.data_offset,
        h.data_length,
        zlib.crc32(blob),
    )
    dst.write_bytes(nh.pack() + data[HEADER_SIZE:] + blob)


def test_lying_tensor_offset_and_size(tiny: tuple[Path, Any], tmp_path: Path) -> None:
    path, _ = tiny
    good = tmp_path / "g.modelc"
    write_artifact(load_model(path), good)

    def far(m: Any) -> None:
        m.tensors[1].offset = 10**9

    _rewrite_manifest(good, tmp_path / "o.modelc", far)
    with pytest.raises(FormatError, match=r"layers\.0\.bias.*outside the data area"):
        open_artifact(tmp_path / "o.modelc")

    def shape(m: Any) -> None:
        m.tensors[0].shape = [64, 97]

    _rewrite_manifest(good, tmp_path / "s.modelc", shape)
    with pytest.raises(FormatError, match=r"layers\.0\.weight"):
        open_artifact(tmp_path / "s.modelc")

    def dtype(m: Any) -> None:
        m.tensors[0].dtype = "q9_9"

    def negative(m: Any) -> None:
        m.tensors[0].stored_nbytes = -5

    _rewrite_manifest(good, tmp_path / "n.modelc", negative)
    with pytest.raises(FormatError, match=r"corrupt \.modelc manifest"):
        open_artifact(tmp_path / "n.modelc")

    def huge(m: Any) -> None:
        m.tensors[0].shape = [2**31, 2**31]

    _rewrite_manifest(good, tmp_path / "x.modelc", huge)
    with pytest.raises(FormatError, match="implausible shape"):
        open_artifact(tmp_path / "x.modelc")

    _rewrite_manifest(good, tmp_path / "d.modelc", dtype)
    with pytest.raises(UnsupportedError, match="q9_9"):
        open_artifact(tmp_path / "d.modelc")


def test_manifest_damage(tiny: tuple[Path, Any], tmp_path: Path) -> None:
    path, _ = tiny
    good = tmp_path / "g.modelc"
    write_artifact(load_model(path), good)
    art = open_artifact(good)
    pos = art.header.manifest_offset + 5
    art.close()
    raw = bytearray(good.read_bytes())
    raw[pos] ^= 0x55
    (tmp_path / "m.modelc").write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match="manifest"):
        open_artifact(tmp_path / "m.modelc")


def test_write_replaces_atomically(tiny: tuple[Path, Any], tmp_path: Path) -> None:
    path, _ = tiny
    out = tmp_path / "x.modelc"
    write_artifact(load_model(path), out)
    before = out.stat().st_ino
    write_artifact(load_model(path), out, PackOptions(compress=True))
    assert out.stat().st_ino != before  # a new file renamed over the old one
    assert sorted(os.listdir(tmp_path)) == ["tiny.safetensors", "x.modelc"]
    verify_artifact(out)


def test_overlapping_tensors_refused(tiny: tuple[Path, Any], tmp_path: Path) -> None:
    """Two tensors sharing bytes (issue 15: loaded and packed silently; only verify saw
    it): open_artifact refuses the file, and the CLI says so in one line."""
    import subprocess
    import sys

    path, _ = tiny
    good = tmp_path / "g.modelc"
    write_artifact(load_model(path), good)
    m0 = open_artifact(good).manifest
    sizes = {e.name: e.stored_nbytes for e in m0.tensors}
    a, b = sorted(m0.tensors, key=lambda e: -e.stored_nbytes)[:2]

    def overlap(m: Any) -> None:
        second = next(e for e in m.tensors if e.name == b.name)
        first = next(e for e in m.tensors if e.name == a.name)
        second.offset = first.offset + 8  # inside the first one's bytes, still in range

    assert sizes[b.name] + 8 <= sizes[a.name]
    _rewrite_manifest(good, tmp_path / "ov.modelc", overlap)
    with pytest.raises(FormatError, match="overlap"):
        open_artifact(tmp_path / "ov.modelc")
    p = subprocess.run(
        [sys.executable, "-m", "modelc.cli", "inspect", str(tmp_path / "ov.modelc")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "overlap" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
