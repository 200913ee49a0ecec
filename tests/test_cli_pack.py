"""``modelc pack``, ``export`` and ``pull`` end to end (issue 12): export round trips,
requantizing quantized models, ``-o`` paths and file modes, ``file://`` and failed pulls."""

from __future__ import annotations

import functools
import http.server
import json
import re
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from safetensors.numpy import save_file

from modelc.artifact import load_artifact
from modelc.artifact.transform import to_f32
from modelc.formats import load_model
from modelc.formats.ir import DType, ModelIR
from modelc.formats.quants import dequantize, quantize
from tests import assets
from tests.cli_support import Cli, write_mlp
from tests.gguf_support import gguf_file

FIX = Path(__file__).parent / "fixtures" / "formats"


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "home", tmp_path / "cache", tmp_path)


@pytest.fixture(scope="module")
def smol() -> Path:
    return assets.smollm2_gguf()


def _f32(ir: ModelIR, name: str) -> np.ndarray[Any, Any]:
    t = ir.tensors[name]
    return to_f32(t.data(), t.dtype, t.shape)


# --- export, then pack the export: the same model ------------------------------------------


def _tiny_bert(d: Path) -> Path:
    """A 2-layer Hugging Face BertModel directory (safetensors + config.json)."""
    e, f, v, p = 32, 64, 40, 16
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (v, e),
        "embeddings.position_embeddings.weight": (p, e),
        "embeddings.token_type_embeddings.weight": (2, e),
        "embeddings.LayerNorm.weight": (e,),
        "embeddings.LayerNorm.bias": (e,),
        "pooler.dense.weight": (e, e),
        "pooler.dense.bias": (e,),
    }
    for i in range(2):
        pre = f"encoder.layer.{i}."
        for n in ("self.query", "self.key", "self.value", "output.dense"):
            shapes[f"{pre}attention.{n}.weight"] = (e, e)
            shapes[f"{pre}attention.{n}.bias"] = (e,)
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[f"{pre}{n}.weight"] = shapes[f"{pre}{n}.bias"] = (e,)
        shapes[f"{pre}intermediate.dense.weight"] = (f, e)
        shapes[f"{pre}intermediate.dense.bias"] = (f,)
        shapes[f"{pre}output.dense.weight"] = (e, f)
        shapes[f"{pre}output.dense.bias"] = (e,)
    rng = np.random.default_rng(5)
    d.mkdir()
    save_file(
        {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()},
        str(d / "model.safetensors"),
    )
    config = {
        "model_type": "bert",
        "architectures": ["BertModel"],
        "vocab_size": v,
        "hidden_size": e,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": f,
        "max_position_embeddings": p,
        "type_vocab_size": 2,
        "hidden_act": "gelu",
    }
    (d / "config.json").write_text(json.dumps(config))
    return d


def _quantized_llama_gguf(path: Path) -> Path:
    """The llama-st fixture as a GGUF: Q4_1 matrices, a Q8_0 embedding, f32 norms."""
    ir = load_model(FIX / "llama-st")
    hp = ir.hparams
    with gguf_file(path, "llama") as w:
        for key, value in {
            "block_count": hp.n_layer,
            "context_length": hp.n_ctx,
            "embedding_length": hp.n_embd,
            "feed_forward_length": hp.n_ff,
            "attention.head_count": hp.n_head,
            "attention.head_count_kv": hp.n_head_kv,
        }.items():
            w.add_uint32(f"llama.{key}", value)
        w.add_float32("llama.attention.layer_norm_rms_epsilon", hp.norm_eps)
        w.add_float32("llama.rope.freq_base", hp.rope_theta)
        for name, t in ir.tensors.items():
            x = np.ascontiguousarray(t.data(), dtype=np.float32)
            if x.ndim == 2 and x.shape[1] % 32 == 0:
                kind = DType.Q8_0 if name == "token_embd.weight" else DType.Q4_1
                w.add_tensor(
                    name, quantize(x, kind), raw_dtype=gguf.GGMLQuantizationType[kind.name]
                )
            else:
                w.add_tensor(name, x)
    return path


ROUND_TRIPS = {
    "llama-st": (FIX / "llama-st", []),
    "llama-bin-int4": (FIX / "llama-bin", ["--quantize", "int4"]),
    "llama-gguf-q4_1": ("gguf", []),
    "gpt2-st-q8_0": (FIX / "gpt2-st", ["--quantize", "q8_0"]),
    "gpt2-bin-fp16": (FIX / "gpt2-bin", ["--quantize", "fp16", "--compress"]),
    "bert": ("bert", []),
    "bert-q4_0": ("bert", ["--quantize", "q4_0"]),
    "mlp-st-int8": (FIX / "mlp.safetensors", ["--quantize", "int8"]),
    "mlp-onnx": (FIX / "mlp.onnx", []),
    "mlp-onnx-matmul-fp16": (FIX / "mlp_matmul.onnx", ["--quantize", "fp16"]),
}


@pytest.mark.parametrize("case", list(ROUND_TRIPS))
def test_export_then_pack_round_trips(cli: Cli, tmp_path: Path, case: str) -> None:
    src, flags = ROUND_TRIPS[case]
    if src == "bert":
        src = _tiny_bert(tmp_path / "bert")
    elif src == "gguf":
        src = _quantized_llama_gguf(tmp_path / "llama.gguf")
    cli("pack", str(src), "-o", "a.modelc", *flags)
    cli("export", "a.modelc", "-o", "a.safetensors")
    out = cli("pack", "a.safetensors", "-o", "b.modelc").stdout
    a, b = load_artifact(tmp_path / "a.modelc"), load_artifact(tmp_path / "b.modelc")
    info_a, info_b = (
        json.loads(cli("inspect", f, "--json").stdout) for f in ("a.modelc", "b.modelc")
    )
    assert info_b["architecture"] == info_a["architecture"] in out
    assert info_b["hparams"] == info_a["hparams"]
    assert (b.tokenizer, b.chat_template, b.generation) == (
        a.tokenizer,
        a.chat_template,
        a.generation,
    )
    assert (b.graph, b.metadata) == (a.graph, a.metadata)
    assert list(b.tensors) == list(a.tensors)
    for name, t in a.tensors.items():
        assert b.tensors[name].shape == t.shape, name
        np.testing.assert_array_equal(_f32(b, name), _f32(a, name), err_msg=name)
    if flags:  # the first pack did quantize: the export holds its dequantized values
        assert any(t.dtype.is_quantized or t.dtype is DType.F16 for t in a.tensors.values())
    # and exporting the re-packed model writes the same file again
    cli("export", "b.modelc", "-o", "b.safetensors")
    assert (tmp_path / "b.safetensors").read_bytes() == (tmp_path / "a.safetensors").read_bytes()


def test_exported_model_runs_the_same(cli: Cli, tmp_path: Path) -> None:
    """An exported, re-packed llama keeps its tokenizer and gives the same greedy text."""
    cli("pack", str(FIX / "llama-st"), "-o", "a.modelc", "--quantize", "q8_0")
    cli("export", "a.modelc", "-o", "a.safetensors")
    args = ["hello world", "--max-tokens", "6", "--temperature", "0", "--seed", "1"]
    want = cli("generate", "a.modelc", *args).stdout
    assert want.strip()
    assert cli("generate", "a.safetensors", *args).stdout == want


def test_corrupt_export_metadata_is_one_line(cli: Cli, tmp_path: Path) -> None:
    cli("pack", str(FIX / "mlp.safetensors"), "-o", "a.modelc")
    cli("export", "a.modelc", "-o", "a.safetensors")
    raw = (tmp_path / "a.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["__metadata__"]["modelc.hparams"] = '{"n_layer": "three"}'
    blob = json.dumps(header).encode()
    blob += b" " * (n - len(blob)) if len(blob) <= n else b""
    assert len(blob) == n, "the test's header edit must keep its length"
    (tmp_path / "bad.safetensors").write_bytes(raw[:8] + blob + raw[8 + n :])
    cli.fails(
        "pack",
        "bad.safetensors",
        "-o",
        "b.modelc",
        match=r"modelc\.hparams.*export the model again",
    )


# --- --quantize / --prune on an already-quantized GGUF -------------------------------------


def _quantized_matrices(ir: ModelIR) -> list[str]:
    return [
        n
        for n, t in ir.tensors.items()
        if t.dtype.is_quantized and len(t.shape) == 2 and "norm" not in n
    ]


def test_quantize_requantizes_a_quantized_gguf(cli: Cli, smol: Path, tmp_path: Path) -> None:
    src = load_model(smol)
    mats = _quantized_matrices(src)
    assert {src.tensors[n].dtype for n in mats} == {DType.Q4_1, DType.Q8_0}
    # llama-quantize's Q4_0: the tied token embedding as the output, Q6_K, whose blocks do not
    # fit its 576-wide rows: Q8_0, the source's own type, so its bytes stay
    assert src.tensors["token_embd.weight"].dtype is DType.Q8_0
    n = len(mats) - 1
    out = cli("pack", str(smol), "-o", "q40.modelc", "--quantize", "q4_0").stdout
    assert f"{n} tensors requantized from q4_1" in out
    info = json.loads(cli("inspect", "q40.modelc", "--json").stdout)
    assert set(info["quantization"]["by_dtype"]) == {"q4_0", "q8_0", "f32"}
    pack = info["pack"]
    assert pack["quantize"] == "q4_0" and pack["quantized_tensors"] == n
    assert pack["requantized_tensors"] == n
    assert sorted(pack["requantized_from"]) == ["q4_1"]
    assert f"requantized    {n} tensors" in cli("inspect", "q40.modelc").stdout
    got = load_artifact(tmp_path / "q40.modelc")
    t = src.tensors["blk.0.ffn_down.weight"]  # q4_1 in the source
    want = quantize(dequantize(t.data(), t.dtype, t.shape), DType.Q4_0)  # through f32
    assert got.tensors[t.name].dtype is DType.Q4_0
    np.testing.assert_array_equal(got.tensors[t.name].data(), want)
    embd = got.tensors["token_embd.weight"]
    assert embd.dtype is DType.Q8_0
    np.testing.assert_array_equal(embd.data(), src.tensors["token_embd.weight"].data())
    # --quantize int4 (q4_1): the q4_1 tensors keep their bytes, only the q8_0 one changes
    cli("pack", str(smol), "-o", "q41.modelc", "--quantize", "int4")
    pack = json.loads(cli("inspect", "q41.modelc", "--json").stdout)["pack"]
    n_q8 = sum(src.tensors[n].dtype is DType.Q8_0 for n in mats)
    assert pack["quantized_tensors"] == pack["requantized_tensors"] == n_q8
    assert pack["requantized_from"] == ["q8_0"]
    again = load_artifact(tmp_path / "q41.modelc")
    name = "blk.3.attn_v.weight"
    assert src.tensors[name].dtype is DType.Q4_1
    np.testing.assert_array_equal(again.tensors[name].data(), src.tensors[name].data())


def test_prune_requantizes_a_quantized_gguf(cli: Cli, smol: Path, tmp_path: Path) -> None:
    src = load_model(smol)
    mats = _quantized_matrices(src)
    cli("pack", str(smol), "-o", "pruned.modelc", "--prune", "0.05")
    info = json.loads(cli("inspect", "pruned.modelc", "--json").stdout)
    assert set(info["quantization"]["by_dtype"]) == {"q4_1", "q8_0", "f32"}  # types kept
    pack = info["pack"]
    assert pack["prune_threshold"] == 0.05 and pack["requantized_tensors"] == len(mats)
    assert "quantize" not in pack and pack.get("quantized_tensors", 0) == 0
    want = 0
    for n in mats:
        x = _f32(src, n)
        want += int(np.count_nonzero((np.abs(x) < 0.05) & (x != 0)))
    assert pack["pruned_weights"] == want > 0
    got = load_artifact(tmp_path / "pruned.modelc")
    x, y = _f32(src, "token_embd.weight"), _f32(got, "token_embd.weight")  # q8_0: zero is exact
    assert np.all(y[np.abs(x) < 0.05] == 0)
    t = src.tensors["token_embd.weight"]
    np.testing.assert_array_equal(
        got.tensors["token_embd.weight"].data(), quantize(np.where(np.abs(x) < 0.05, 0, x), t.dtype)
    )


def test_prune_refuses_a_type_it_cannot_write(cli: Cli, tmp_path: Path) -> None:
    """A Q3_K matrix cannot be requantized to Q3_K: say so, and how to prune it anyway."""
    rng = np.random.default_rng(0)
    with gguf_file(tmp_path / "k.gguf", "gpt2") as w:
        w.add_tensor(
            "t.weight",
            rng.integers(0, 256, size=(2, 110), dtype=np.uint8),
            raw_dtype=gguf.GGMLQuantizationType.Q3_K,
        )
    cli.fails(
        "pack", "k.gguf", "-o", "k.modelc", "--prune", "0.1",
        match=r"--prune must requantize tensor t\.weight, but modelc cannot write q3_k.*add --quantize",
    )  # fmt: skip
    assert not list(tmp_path.glob("*.modelc")) and not list(tmp_path.glob(".*.tmp"))
    cli("pack", "k.gguf", "-o", "k.modelc", "--prune", "0.1", "--quantize", "q8_0")
    assert json.loads(cli("inspect", "k.modelc", "--json").stdout)["pack"]["requantized_from"] == [
        "q3_k"
    ]


# --- -o paths, and the modes of written files ------------------------------------------------


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_pack_output_directory(cli: Cli, tmp_path: Path) -> None:
    write_mlp(tmp_path / "m.safetensors")
    cli.fails(
        "pack", "m.safetensors", "-o", "nodir/m.modelc",
        match=r"output directory nodir does not exist; create it first \(mkdir -p nodir\)",
    )  # fmt: skip
    cli.fails("pack", "m.safetensors", "-o", "a/b/", match="output directory a/b does not exist")
    cli.fails(
        "export", "m.safetensors", "-o", "nodir/m.safetensors", match="output directory nodir"
    )
    (tmp_path / "file").write_text("")
    cli.fails("pack", "m.safetensors", "-o", "file/m.modelc", match="file is not a directory")
    assert not (tmp_path / "nodir").exists() and not (tmp_path / "a").exists()
    (tmp_path / "out").mkdir()
    assert cli("pack", "m.safetensors", "-o", "out").stdout.startswith("packed out/m.modelc:")
    cli("verify", "out/m.modelc")
    cli("pack", str(FIX / "llama-st"), "-o", "out/")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["llama-st.modelc", "m.modelc"]
    cli("export", "out/m.modelc", "-o", "out")
    assert (tmp_path / "out" / "m.safetensors").is_file()


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_written_files_get_the_umask(cli: Cli, tmp_path: Path, umask: int, mode: int) -> None:
    write_mlp(tmp_path / "m.safetensors")
    cli("pack", "m.safetensors", "-o", "m.modelc", umask=umask)
    cli("pack", "m.safetensors", "--name", "m", umask=umask)
    cli("export", "m", "-o", "m.safetensors.out.safetensors", umask=umask)
    cli("inspect", "m.safetensors", umask=umask)  # packed on the fly into the cache
    entry = Path(json.loads(cli("list", "--json").stdout)[0]["path"])
    cached = list((tmp_path / "cache" / "packed").glob("*.modelc"))
    written = [tmp_path / "m.modelc", entry, entry.parent / "current", *cached]
    written.append(tmp_path / "m.safetensors.out.safetensors")
    assert len(cached) == 1
    assert {str(p): _mode(p) for p in written} == {str(p): mode for p in written}


# --- pull: file:// URLs, other schemes, failures that leave nothing -------------------------


def test_pull_file_url(cli: Cli, tmp_path: Path, smol: Path) -> None:
    out = cli("pull", smol.as_uri()).stdout
    assert out.startswith("pulled smollm2-135m-instruct.q4_1:latest")
    src = tmp_path / "my model.safetensors"
    write_mlp(src)
    assert "%20" in src.as_uri()
    cli("pull", src.as_uri(), "--name", "mine", "--quantize", "q8_0")
    import hashlib

    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    cli("pull", "file://localhost" + src.as_uri()[7:], "--sha256", digest)  # name from the file
    listing = {e["name"]: e for e in json.loads(cli("list", "--json").stdout)}
    assert sorted(listing) == ["mine", "my-model", "smollm2-135m-instruct.q4_1"]
    assert listing["mine"]["quantization"].startswith("q8_0")
    assert listing["smollm2-135m-instruct.q4_1"]["architecture"] == "llama"
    bad = "0" * 64
    cli.fails(
        "pull",
        src.as_uri(),
        "--sha256",
        bad,
        match=rf"{re.escape(src.as_uri())}: sha256 is {digest}",
    )
    missing = (tmp_path / "nope.gguf").as_uri()
    cli.fails("pull", missing, match=rf"^modelc: error: {re.escape(missing)}: no such file")
    cli.fails("pull", "file://otherhost/x.gguf", match="file:// URLs name local files")
    assert len(json.loads(cli("list", "--json").stdout)) == 3
    assert not (tmp_path / "cache").exists() or not any(
        p.is_file() for p in (tmp_path / "cache").rglob("*")
    )  # a local file is read where it lies, never copied to the cache


@pytest.mark.parametrize("url", ["ftp://example.com/m.gguf", "s3://bucket/m.gguf", "gs://org/m"])
def test_pull_unsupported_scheme(cli: Cli, url: str) -> None:
    scheme = url.split(":")[0].lower()
    cli.fails(
        "pull", url, match=rf"^modelc: error: {re.escape(url)}: modelc cannot pull {scheme}://"
    )


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def www(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A static http server on 127.0.0.1 serving a temp directory: (base URL, directory)."""
    root = tmp_path / "www"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()


def _files(d: Path) -> list[Path]:
    return [p for p in d.rglob("*") if p.is_file()] if d.exists() else []


def test_failed_pulls_name_the_url_and_leave_nothing(
    cli: Cli, tmp_path: Path, www: tuple[str, Path]
) -> None:
    base, root = www
    write_mlp(root / "m.safetensors")
    cache, home = tmp_path / "cache", tmp_path / "home"
    url = f"{base}/missing.gguf"
    cli.fails("pull", url, match=rf"^modelc: error: {re.escape(url)}: HTTP 404")
    url = f"{base}/m.safetensors"
    cli.fails(
        "pull",
        url,
        "--sha256",
        "0" * 64,
        match=rf"{re.escape(url)}: sha256 is [0-9a-f]{{64}}, expected 0{{64}}",
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = f"http://127.0.0.1:{port}/m.gguf"
    cli.fails("pull", dead, match=rf"{re.escape(dead)}: cannot connect")
    assert _files(cache) == [] and _files(home) == []
    assert not (cache / "downloads").exists() or not any((cache / "downloads").iterdir())
    # the same URL, right checksum: pulled, packed, the download kept in the cache
    import hashlib

    digest = hashlib.sha256((root / "m.safetensors").read_bytes()).hexdigest()
    assert cli("pull", url, "--sha256", digest).stdout.startswith("pulled m:latest")
    assert [p.name for p in _files(cache)] == ["m.safetensors"]
    root.joinpath("notamodel.gguf").write_bytes(b"GGUF" + b"\x00" * 60)
    bad = f"{base}/notamodel.gguf"
    cli.fails("pull", bad, match="notamodel.gguf")
    assert [e["name"] for e in json.loads(cli("list", "--json").stdout)] == ["m"]
    assert not [p for p in _files(home) if p.name.endswith(".tmp")]
