"""Fuzzing every reader with mutated real files (issue 15): any input loads or raises a
ModelcError; nothing else escapes, and nothing hangs.  The readers: GGUF, safetensors,
PyTorch zip, ONNX, the ``.modelc`` artifact, a ``tokenizer.json`` (built, then encoding and
decoding a text) and a chat template (SmolLM2's, rendered in the sandbox).

Seeds are real files: a GGUF written by gguf-py (tests/gguf_support.py's tiny llama), the
fixtures' safetensors and PyTorch zip, ONNX, and a packed ``.modelc``.  Hypothesis mutates
them (bytes overwritten, inserted, deleted; the file cut short) for a bounded number of
examples in CI; a longer run is a matter of ``--hypothesis-seed`` and a larger
``FUZZ_EXAMPLES`` (environment).  A crasher found is kept below as a regression case.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelc.artifact import open_artifact, write_artifact
from modelc.errors import ModelcError, TokenizerError
from modelc.formats import load_model
from modelc.formats.gguf import load_gguf
from modelc.formats.hf import read_tokenizer
from modelc.formats.onnx import load_onnx
from modelc.formats.pytorch import load_pytorch
from modelc.formats.safetensors import load_safetensors
from modelc.runtime.chat_template import render_chat
from modelc.runtime.tokenizer import Tokenizer, from_tokenizer_json
from tests.gguf_support import tiny_llama

ROOT_FIX = Path(__file__).parent / "fixtures"
FIX = ROOT_FIX / "formats"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))


def _gguf_seed(tmp: Path) -> bytes:
    return tiny_llama(tmp / "seed.gguf").read_bytes()


def _modelc_seed(tmp: Path) -> bytes:
    dest = tmp / "seed.modelc"
    write_artifact(load_model(FIX / "mlp.safetensors"), dest)
    return dest.read_bytes()


@st.composite
def mutated(draw: st.DrawFn, seed: bytes) -> bytes:
    """``seed`` with a few random edits (overwrite / insert / delete a run, or a cut)."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["overwrite", "insert", "delete", "cut", "u64"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "overwrite":
            run = draw(st.binary(min_size=1, max_size=16))
            data[at : at + len(run)] = run
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        elif kind == "cut":
            del data[at:]
        else:  # a huge little-endian count or offset where a length may stand
            big = draw(st.sampled_from([2**31, 2**32 - 1, 2**40, 2**62, 2**63, 2**64 - 1]))
            data[at : at + 8] = big.to_bytes(8, "little")
    return bytes(data)


def _check(load: Callable[[Path], Any], path: Path, data: bytes) -> None:
    path.write_bytes(data)
    t0 = time.monotonic()
    try:
        loaded = load(path)
        _touch(loaded)
    except ModelcError:
        pass
    assert time.monotonic() - t0 < 5.0, "a reader took more than 5 s on a small file"


def _touch(loaded: Any) -> None:
    """Read every tensor a reader returned (lazy loaders fail only here)."""
    tensors = getattr(loaded, "tensors", None)
    if isinstance(tensors, dict):
        for t in tensors.values():
            t.data()
    elif isinstance(tensors, list):  # an artifact's manifest entries
        pass
    close = getattr(loaded, "close", None)
    if callable(close):
        close()


def _load_tokenizer(path: Path) -> None:
    """A tokenizer.json builds (or is refused), through a HF directory's reader and on its
    own, and the tokenizer it gives encodes and decodes."""
    spec, _ = read_tokenizer(path.parent, {})
    assert spec is not None
    for tok in (Tokenizer(spec), from_tokenizer_json(path)):
        ids = tok.encode("Hello, world! <|im_start|>user\nnaïve café 123", parse_special=True)
        tok.decode(ids)


def _template_seed(_tmp: Path) -> bytes:
    from modelc.formats.gguf import open_reader
    from tests.assets import smollm2_gguf

    field = open_reader(smollm2_gguf()).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]])


def _render_template(path: Path) -> None:
    """A chat template (a stranger's code) renders or is refused with a UsageError."""
    render_chat(
        path.read_bytes().decode("utf-8", errors="replace"),
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Italy?"},
        ],
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
    )


READERS: dict[str, tuple[Callable[[Path], bytes], Callable[[Path], Any], str]] = {
    "gguf": (_gguf_seed, load_gguf, "x.gguf"),
    "safetensors": (
        lambda _t: (FIX / "mlp.safetensors").read_bytes(),
        load_safetensors,
        "x.safetensors",
    ),
    "pytorch": (lambda _t: (FIX / "mlp.bin").read_bytes(), load_pytorch, "x.bin"),
    "onnx": (lambda _t: (FIX / "mlp.onnx").read_bytes(), load_onnx, "x.onnx"),
    "modelc": (_modelc_seed, open_artifact, "x.modelc"),
    "tokenizer.json": (
        lambda _t: (ROOT_FIX / "families" / "tokenizer.json").read_bytes(),
        _load_tokenizer,
        "tokenizer.json",
    ),
    "chat template": (_template_seed, _render_template, "template.jinja"),
}


@pytest.mark.parametrize("name", list(READERS))
def test_mutated_files_load_or_fail_cleanly(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    make_seed, load, filename = READERS[name]
    work = tmp_path_factory.mktemp(f"fuzz-{name}")
    seed = make_seed(work)
    _check(load, work / filename, seed)  # the seed itself loads

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=os.environ.get("FUZZ_RANDOM") is None,  # CI: the same cases each run
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        database=None,
    )
    @given(data=mutated(seed))
    def run(data: bytes) -> None:
        _check(load, work / filename, data)

    run()


# --- crashers the fuzzing found, kept as regression cases ------------------------------------
def _zip_member_headers(data: bytes, name: bytes) -> tuple[int, int]:
    """Offsets of ``name``'s local header and central-directory entry in a zip."""
    central = data.index(b"PK\x01\x02")
    while data[central + 46 : central + 46 + len(name)] != name:
        central = data.index(b"PK\x01\x02", central + 4)
    header = int.from_bytes(data[central + 42 : central + 46], "little")
    return header, central


def test_crasher_zip_member_with_an_unknown_compression_method(tmp_path: Path) -> None:
    """zipfile's NotImplementedError used to escape the PyTorch reader."""
    import zipfile

    src = tmp_path / "deflated.bin"
    with (
        zipfile.ZipFile(FIX / "mlp.bin") as zin,
        zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as zout,
    ):
        for item in zin.infolist():
            zout.writestr(item.filename, zin.read(item))
    data = bytearray(src.read_bytes())
    name = next(n for n in zipfile.ZipFile(src).namelist() if "/data/" in n).encode()
    header, central = _zip_member_headers(bytes(data), name)
    data[header + 8 : header + 10] = (99).to_bytes(2, "little")  # AES/unknown method
    data[central + 10 : central + 12] = (99).to_bytes(2, "little")
    bad = tmp_path / "method.bin"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelcError):
        _touch(load_pytorch(bad))


def test_crasher_stored_member_past_the_end(tmp_path: Path) -> None:
    """A local header whose name length lies made np.memmap raise ValueError."""
    import zipfile

    data = bytearray((FIX / "mlp.bin").read_bytes())
    name = next(n for n in zipfile.ZipFile(FIX / "mlp.bin").namelist() if "/data/" in n).encode()
    header, _ = _zip_member_headers(bytes(data), name)
    data[header + 26 : header + 28] = (60000).to_bytes(2, "little")  # the name length
    bad = tmp_path / "past.bin"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelcError):
        _touch(load_pytorch(bad))


def test_crasher_zip_spanning_disks(tmp_path: Path) -> None:
    """zipfile.is_zipfile raised BadZipFile ('span multiple disks') out of the reader."""
    import struct

    data = bytearray((FIX / "mlp.bin").read_bytes())
    end = data.rindex(b"PK\x05\x06")
    # A ZIP64 end-of-directory locator that says the archive spans two disks.
    data[end:end] = struct.pack("<4sLQL", b"PK\x06\x07", 0, 0, 2)
    bad = tmp_path / "disks.bin"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelcError):
        _touch(load_pytorch(bad))


def test_crasher_onnx_initializer_name_not_utf8(tmp_path: Path) -> None:
    """An initializer name that is not UTF-8 came back as bytes and broke name matching."""
    import onnx

    model = onnx.load(FIX / "mlp.onnx")
    name = model.graph.initializer[0].name.encode()
    data = (FIX / "mlp.onnx").read_bytes()
    assert name in data
    bad = tmp_path / "name.onnx"
    bad.write_bytes(data.replace(name, b"\xff" * len(name)))
    with pytest.raises(ModelcError):
        _touch(load_onnx(bad))


def test_crasher_gguf_tensor_with_a_zero_dimension(tmp_path: Path) -> None:
    """A dimension of 0 loaded as an empty tensor that broke the model later; refuse it up front."""
    import gguf

    good = tiny_llama(tmp_path / "good.gguf")
    reader = gguf.GGUFReader(good)
    field = next(t for t in reader.tensors if t.name == "token_embd.weight").field
    pos = field.offset + sum(int(p.nbytes) for p in field.parts[:3])  # the first u64 dim
    del reader, field
    data = bytearray(good.read_bytes())
    data[pos : pos + 8] = (0).to_bytes(8, "little")
    bad = tmp_path / "zero.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelcError):
        _touch(load_gguf(bad))


@pytest.mark.parametrize(
    "added",
    [
        [{"id": 0}],  # no content: a KeyError escaped the tokenizer
        [{"id": 2**40, "content": "<x>"}],  # a list of 2^40 token texts would be made
        {"id": 0, "content": "<x>"},  # not a list
    ],
)
def test_crasher_tokenizer_json_added_tokens(tmp_path: Path, added: object) -> None:
    data = json.loads((ROOT_FIX / "families" / "tokenizer.json").read_text())
    data["added_tokens"] = added
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    for load in (
        lambda: Tokenizer(read_tokenizer(tmp_path, {})[0]),
        lambda: from_tokenizer_json(path),
    ):
        with pytest.raises(TokenizerError, match="added"):
            load()
