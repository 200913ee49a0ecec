"""GGUF reader: the real SmolLM2 file, small files written with gguf-py (tests/gguf_support.py),
corrupt files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as G

from modelc.errors import ArchitectureError, FormatError, UnsupportedError
from modelc.formats import load_model
from modelc.formats.gguf import load_gguf
from modelc.formats.ir import BLOCK_SIZES, NUMPY_DTYPES, DType
from tests import assets
from tests.gguf_support import tiny_llama, write_gguf

PLAIN = {
    DType.F32: np.float32,
    DType.F16: np.float16,
    DType.F64: np.float64,
    DType.I8: np.int8,
    DType.I16: np.int16,
    DType.I32: np.int32,
    DType.I64: np.int64,
}


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return assets.smollm2_gguf()


def test_smollm2_hparams_and_tensors(smollm2: Path) -> None:
    ir = load_model(smollm2)
    assert ir.architecture == "llama"
    hp = ir.hparams
    assert (hp.n_vocab, hp.n_ctx, hp.n_embd, hp.n_layer) == (49152, 8192, 576, 30)
    assert (hp.n_head, hp.n_head_kv, hp.n_ff, hp.head_dim) == (9, 3, 1536, 64)
    assert hp.rope_theta == 100000.0 and hp.rope_style == "interleaved"
    assert hp.activation == "silu" and hp.tie_embeddings  # SmolLM2 has no output.weight
    assert abs(hp.norm_eps - 1e-5) < 1e-9
    assert len(ir.tensors) == 2 + 9 * 30
    emb = ir.tensors["token_embd.weight"]
    assert emb.dtype is DType.Q8_0 and emb.shape == (49152, 576)
    data = emb.data()
    assert data.dtype == np.uint8 and data.shape == (49152, 576 // 32 * 34)
    assert not data.flags.owndata  # a view of the memory map, not a copy
    q = ir.tensors["blk.0.ffn_down.weight"]
    assert q.dtype is DType.Q4_1 and q.shape == (576, 1536) and q.data().shape == (576, 48 * 20)
    norm = ir.tensors["blk.0.attn_norm.weight"]
    assert norm.dtype is DType.F32 and norm.data().shape == (576,)


def test_smollm2_tokenizer_and_metadata(smollm2: Path) -> None:
    ir = load_gguf(smollm2)
    tok = ir.tokenizer
    assert tok is not None and tok.model == "gpt2" and tok.pre == "smollm"
    assert len(tok.tokens) == len(tok.token_types) == 49152 and len(tok.merges) == 48900
    assert tok.tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (1, 2, 0, 2)
    assert not tok.add_bos and not tok.add_space_prefix
    assert ir.chat_template is not None and "<|im_start|>" in ir.chat_template
    assert ir.metadata["general.architecture"] == "llama"
    assert ir.metadata["llama.vocab_size"] == 49152
    assert not any(k.startswith("tokenizer.ggml") for k in ir.metadata)


def test_vocab_only_file_is_a_tokenizer() -> None:
    ir = load_gguf(assets.vocab_dir() / "ggml-vocab-llama-spm.gguf")
    assert ir.architecture == "tokenizer" and not ir.tensors
    assert ir.tokenizer is not None and ir.tokenizer.model == "llama"
    assert len(ir.tokenizer.scores) == 32000 and ir.tokenizer.add_bos
    assert ir.tokenizer.add_space_prefix  # llama.cpp's default for SentencePiece vocabularies


def test_tiny_llama_metadata(tmp_path: Path) -> None:
    ir = load_gguf(tiny_llama(tmp_path / "m.gguf"))
    hp = ir.hparams
    assert (hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff) == (64, 4, 2, 16, 96)
    assert hp.n_vocab == 3 and hp.rope_theta == 5e5
    assert hp.rope_scaling.type == "linear" and hp.rope_scaling.factor == 2.0
    assert ir.chat_template == "{{ messages }}"
    assert ir.tokenizer is not None and ir.tokenizer.merges == ["a b"] and ir.tokenizer.bos_id == 2
    assert ir.tensors["blk.0.attn_q.weight"].dtype is DType.Q8_0


@pytest.mark.parametrize("dtype", [*PLAIN, DType.BF16, *BLOCK_SIZES])
def test_every_dtype_round_trips(tmp_path: Path, dtype: DType) -> None:
    rng = np.random.default_rng(1)
    shape = (3, 512)
    if dtype in PLAIN:
        arr = (rng.standard_normal(shape) * 50).astype(PLAIN[dtype])
        tensors: dict[str, tuple[Any, G | None]] = {"t.weight": (arr, None)}
        expect = arr
    else:
        raw_type = G[dtype.name]
        bs, ts = (1, 2) if dtype is DType.BF16 else BLOCK_SIZES[dtype]
        raw = rng.integers(0, 256, size=(shape[0], shape[1] // bs * ts), dtype=np.uint8)
        tensors = {"t.weight": (raw, raw_type)}
        expect = raw.view(np.uint16) if dtype is DType.BF16 else raw
    ir = load_gguf(write_gguf(tmp_path / "t.gguf", "gpt2", {}, tensors))
    t = ir.tensors["t.weight"]
    assert t.dtype is dtype and t.shape == shape
    got = t.data()
    if dtype in NUMPY_DTYPES:
        assert got.dtype == NUMPY_DTYPES[dtype]
    assert np.array_equal(got, expect)


def test_gpt2_and_bert_hparams(tmp_path: Path) -> None:
    w = np.zeros((4, 32), np.float32)
    gpt2 = load_gguf(
        write_gguf(
            tmp_path / "g.gguf",
            "gpt2",
            {
                "gpt2.embedding_length": 32,
                "gpt2.attention.head_count": 2,
                "gpt2.attention.layer_norm_epsilon": 1e-5,
            },
            {"token_embd.weight": (w, None), "output.weight": (w, None)},
        )
    )
    assert gpt2.architecture == "gpt2" and gpt2.hparams.activation == "gelu_tanh"
    assert not gpt2.hparams.tie_embeddings and gpt2.hparams.n_vocab == 4
    bert = load_gguf(
        write_gguf(
            tmp_path / "b.gguf",
            "bert",
            {
                "bert.embedding_length": 32,
                "bert.pooling_type": 2,
                "tokenizer.ggml.token_type_count": 2,
            },
            {"token_embd.weight": (w, None)},
        )
    )
    hp = bert.hparams
    assert bert.architecture == "bert" and hp.pooling == "cls" and hp.n_token_types == 2
    assert hp.normalize_embeddings and hp.activation == "gelu"


def test_unknown_architecture(tmp_path: Path) -> None:
    path = write_gguf(
        tmp_path / "q.gguf",
        "t5",
        {},
        {"token_embd.weight": (np.zeros((2, 32), np.float32), None)},
    )
    with pytest.raises(ArchitectureError, match=r"t5.*llama, gpt2, bert, qwen2, (\w+, )*qwen3"):
        load_gguf(path)


def test_unsupported_tensor_type(tmp_path: Path) -> None:
    raw = np.zeros((2, 66), np.uint8)  # IQ2_XXS: 256 weights in 66 bytes
    path = write_gguf(tmp_path / "iq.gguf", "llama", {}, {"blk.0.attn_q.weight": (raw, G.IQ2_XXS)})
    with pytest.raises(UnsupportedError, match=r"blk\.0\.attn_q\.weight.*IQ2_XXS"):
        load_gguf(path)


def test_truncated_copies(tmp_path: Path) -> None:
    good = tiny_llama(tmp_path / "good.gguf")
    data = good.read_bytes()
    bad = tmp_path / "bad.gguf"
    for cut in [0, 3, 4, 8, 20, 24, 60, 200, 400, len(data) // 2, len(data) - 1]:
        bad.write_bytes(data[:cut])
        with pytest.raises(FormatError) as e:
            load_gguf(bad)
        msg = str(e.value)
        assert "bad.gguf" in msg and "\n" not in msg, (cut, msg)


def test_random_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    bad = tmp_path / "rand.gguf"
    for prefix in (b"", b"GGUF\x03\x00\x00\x00"):
        for _ in range(20):
            bad.write_bytes(prefix + rng.integers(0, 256, size=300, dtype=np.uint8).tobytes())
            with pytest.raises((FormatError, UnsupportedError)) as e:
                load_gguf(bad)
            assert "rand.gguf" in str(e.value)


def test_tensor_offset_past_the_end(tmp_path: Path) -> None:
    good = tiny_llama(tmp_path / "good.gguf")
    reader = gguf.GGUFReader(good)
    tensor = next(t for t in reader.tensors if t.name == "output_norm.weight")
    field = tensor.field
    pos = field.offset + sum(int(p.nbytes) for p in field.parts[:-1])  # the u64 data offset
    size = good.stat().st_size
    del reader, tensor, field
    lie = tmp_path / "lie.gguf"
    shutil.copy(good, lie)
    with lie.open("r+b") as f:
        f.seek(pos)
        f.write((size // 32 * 32).to_bytes(8, "little"))
    with pytest.raises(
        FormatError, match=r"tensor output_norm\.weight points past the end of the file"
    ):
        load_gguf(lie)


def test_overlapping_tensors_refused(tmp_path: Path) -> None:
    """Two tensors sharing bytes (issue 15: loaded and packed silently) are a FormatError,
    and `modelc inspect` says so in one line."""
    import subprocess
    import sys

    good = tiny_llama(tmp_path / "good.gguf")
    reader = gguf.GGUFReader(good)
    ts = {t.name: t for t in reader.tensors}
    a, b = ts["output_norm.weight"], ts["token_embd.weight"]
    pos = a.field.offset + sum(int(p.nbytes) for p in a.field.parts[:-1])  # a's data offset
    b_offset = int(b.field.parts[-1][0])
    del reader, ts, a, b
    bad = tmp_path / "overlap.gguf"
    shutil.copy(good, bad)
    with bad.open("r+b") as f:
        f.seek(pos)
        f.write(b_offset.to_bytes(8, "little"))  # output_norm inside token_embd's bytes
    with pytest.raises(FormatError, match="overlap"):
        load_gguf(bad)
    p = subprocess.run(
        [sys.executable, "-m", "modelc.cli", "inspect", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MODELC_CACHE": str(tmp_path / "cache")},
    )
    assert p.returncode == 2 and "overlap" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_tensor_with_absurd_dims(tmp_path: Path) -> None:
    good = tiny_llama(tmp_path / "good.gguf")
    reader = gguf.GGUFReader(good)
    field = next(t for t in reader.tensors if t.name == "output_norm.weight").field
    pos = field.offset + sum(int(p.nbytes) for p in field.parts[:3])  # the u64 dims
    del reader, field
    data = bytearray(good.read_bytes())
    data[pos : pos + 8] = (2**62).to_bytes(8, "little")
    bad = tmp_path / "dims.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"output_norm\.weight points past the end"):
        load_gguf(bad)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="no such file"):
        load_gguf(tmp_path / "nope.gguf")
