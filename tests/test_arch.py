"""Architecture inference, canonical names, and the load-time layout transforms (checked numerically)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelc.errors import ArchitectureError, UnsupportedError
from modelc.formats import load_model
from modelc.formats.arch import canonical_name, infer_architecture
from modelc.formats.hf import load_hf_dir, read_hf_weights
from modelc.formats.safetensors import read_header
from tests.assets import minilm_dir

FIX = Path(__file__).parent / "fixtures" / "formats"


def test_minilm_is_bert_with_22_7m_params() -> None:
    d = minilm_dir()
    header, _, _ = read_header(d / "model.safetensors")
    weights = {
        k: v for k, v in header.items() if k != "__metadata__" and not k.endswith("position_ids")
    }
    expected = sum(math.prod(v["shape"]) for v in weights.values())
    ir = load_model(d)
    assert ir.architecture == "bert"
    assert ir.n_params == expected
    assert round(ir.n_params / 1e6, 1) == 22.7
    hp = ir.hparams
    assert (hp.n_vocab, hp.n_ctx, hp.n_embd, hp.n_layer, hp.n_head, hp.n_ff) == (
        30522,
        512,
        384,
        6,
        12,
        1536,
    )
    assert (hp.head_dim, hp.n_token_types, hp.norm_eps, hp.activation) == (32, 2, 1e-12, "gelu")
    assert hp.pooling == "mean" and hp.normalize_embeddings
    assert ir.metadata["dropped_tensors"] == ["embeddings.position_ids"]
    block0 = {n for n in ir.tensors if n.startswith("blk.0.")}
    parts = [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "attn_output_norm",
        "ffn_up",
        "ffn_down",
        "layer_output_norm",
    ]
    assert block0 == {f"blk.0.{p}.{s}" for p in parts for s in ("weight", "bias")}
    top = {n for n in ir.tensors if not n.startswith("blk.")}
    assert top == {
        "token_embd.weight",
        "position_embd.weight",
        "token_types.weight",
        "token_embd_norm.weight",
        "token_embd_norm.bias",
        "pooler.weight",
        "pooler.bias",
    }
    tok = ir.tokenizer
    assert tok is not None and tok.hf_json == (d / "tokenizer.json").read_text(encoding="utf-8")
    assert (tok.cls_id, tok.sep_id, tok.pad_id, tok.unk_id, tok.mask_id) == (
        101,
        102,
        0,
        100,
        103,
    )
    # renamed, not copied: the bytes are the memory-mapped originals
    from safetensors.numpy import load_file

    ref = load_file(str(d / "model.safetensors"))
    np.testing.assert_array_equal(
        ir.tensors["blk.3.ffn_up.weight"].data(), ref["encoder.layer.3.intermediate.dense.weight"]
    )


def test_gpt2_conv1d_transposed_to_out_in() -> None:
    ir = load_hf_dir(FIX / "gpt2-st")
    hp = ir.hparams
    assert ir.architecture == "gpt2"
    assert (hp.n_vocab, hp.n_ctx, hp.n_embd, hp.n_layer, hp.n_head, hp.n_ff) == (
        300,
        64,
        32,
        2,
        4,
        128,
    )
    assert hp.activation == "gelu_tanh" and hp.tie_embeddings and hp.norm_eps == 1e-5
    w = ir.tensors["blk.0.attn_qkv.weight"]
    assert w.shape == (96, 32) and ir.tensors["blk.0.ffn_up.weight"].shape == (128, 32)
    assert ir.tensors["blk.0.ffn_down.weight"].shape == (32, 128)
    golden = np.load(FIX / "gpt2_golden.npz")
    got = golden["x"] @ w.data().T + ir.tensors["blk.0.attn_qkv.bias"].data()
    np.testing.assert_allclose(got, golden["qkv"], rtol=1e-5, atol=1e-6)
    assert set(ir.tensors) >= {
        "token_embd.weight",
        "position_embd.weight",
        "output_norm.weight",
        "output_norm.bias",
    }


def _rope_interleaved(q: np.ndarray[Any, Any], theta: float) -> np.ndarray[Any, Any]:
    """GGUF/llama.cpp NORM rope on (seq, heads, head_dim): rotate pairs (2j, 2j+1)."""
    seq, _, hd = q.shape
    freqs = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)  # (hd/2,)
    ang = np.arange(seq)[:, None, None] * freqs[None, None, :]  # (seq, 1, hd/2)
    a, b = q[..., 0::2], q[..., 1::2]
    out = np.empty_like(q, dtype=np.float64)
    out[..., 0::2] = a * np.cos(ang) - b * np.sin(ang)
    out[..., 1::2] = a * np.sin(ang) + b * np.cos(ang)
    return out


@pytest.mark.parametrize("name", ["llama-st", "llama-bin"])
def test_llama_qk_permuted_for_interleaved_rope(name: str) -> None:
    """Permuted q/k + interleaved RoPE == Hugging Face q/k + rotate-half RoPE (after un-interleaving)."""
    ir = load_hf_dir(FIX / name)
    hp = ir.hparams
    assert ir.architecture == "llama" and hp.rope_style == "interleaved"
    assert (hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff) == (
        32,
        2,
        4,
        2,
        8,
        64,
    )
    assert (hp.n_vocab, hp.n_ctx, hp.rope_theta, hp.norm_eps, hp.activation) == (
        300,
        128,
        10000.0,
        1e-5,
        "silu",
    )
    golden = np.load(FIX / "llama_golden.npz")
    x = golden["x"].astype(np.float64)  # (seq, n_embd)
    for proj, heads in (("q", hp.n_head), ("k", hp.n_head_kv)):
        w = ir.tensors[f"blk.0.attn_{proj}.weight"].data()
        q = (x @ w.T).reshape(x.shape[0], heads, hp.head_dim)
        rot = _rope_interleaved(q, hp.rope_theta)
        hf_layout = np.concatenate([rot[..., 0::2], rot[..., 1::2]], axis=-1)  # (seq, heads, hd)
        np.testing.assert_allclose(hf_layout, golden[proj].transpose(1, 0, 2), rtol=1e-4, atol=1e-5)


def test_llama_unpermuted_would_fail() -> None:
    """The check above is sensitive: the raw HF rows under interleaved RoPE do not match."""
    raw, _ = read_hf_weights(FIX / "llama-st")
    golden = np.load(FIX / "llama_golden.npz")
    w = raw["model.layers.0.self_attn.q_proj.weight"].data()
    q = (golden["x"].astype(np.float64) @ w.T).reshape(4, 4, 8)
    rot = _rope_interleaved(q, 10000.0)
    hf_layout = np.concatenate([rot[..., 0::2], rot[..., 1::2]], axis=-1)
    assert not np.allclose(hf_layout, golden["q"].transpose(1, 0, 2), atol=1e-3)


@pytest.mark.parametrize(
    ("arch", "hf", "gguf"),
    [
        ("llama", "model.embed_tokens.weight", "token_embd.weight"),
        ("llama", "model.layers.3.self_attn.q_proj.weight", "blk.3.attn_q.weight"),
        ("llama", "model.layers.3.self_attn.o_proj.weight", "blk.3.attn_output.weight"),
        ("llama", "model.layers.12.mlp.gate_proj.weight", "blk.12.ffn_gate.weight"),
        ("llama", "model.layers.0.post_attention_layernorm.weight", "blk.0.ffn_norm.weight"),
        ("llama", "model.norm.weight", "output_norm.weight"),
        ("llama", "lm_head.weight", "output.weight"),
        ("llama", "model.layers.0.self_attn.rotary_emb.inv_freq", None),
        ("gpt2", "transformer.h.1.attn.c_attn.weight", "blk.1.attn_qkv.weight"),
        ("gpt2", "h.1.mlp.c_proj.bias", "blk.1.ffn_down.bias"),
        ("gpt2", "transformer.wpe.weight", "position_embd.weight"),
        ("gpt2", "transformer.h.0.attn.bias", None),
        ("gpt2", "transformer.h.0.attn.masked_bias", None),
        ("bert", "embeddings.LayerNorm.weight", "token_embd_norm.weight"),
        ("bert", "bert.embeddings.token_type_embeddings.weight", "token_types.weight"),
        (
            "bert",
            "encoder.layer.5.attention.output.LayerNorm.gamma",
            "blk.5.attn_output_norm.weight",
        ),
        ("bert", "encoder.layer.5.output.LayerNorm.bias", "blk.5.layer_output_norm.bias"),
        ("bert", "encoder.layer.5.intermediate.dense.weight", "blk.5.ffn_up.weight"),
        ("bert", "embeddings.position_ids", None),
        ("bert", "cls.predictions.bias", None),
        ("bert", "pooler.dense.weight", "pooler.weight"),
    ],
)
def test_canonical_name(arch: str, hf: str, gguf: str | None) -> None:
    assert canonical_name(arch, hf) == gguf


def _shapes(d: Path) -> dict[str, tuple[int, ...]]:
    raw, _ = read_hf_weights(d)
    return {n: t.shape for n, t in raw.items()}


@pytest.mark.parametrize(
    ("d", "arch"), [("gpt2-st", "gpt2"), ("gpt2-bin", "gpt2"), ("llama-st", "llama")]
)
def test_infer_from_names_and_shapes_only(d: str, arch: str) -> None:
    shapes = _shapes(FIX / d)
    got, hp = infer_architecture(list(shapes), None, shapes)
    assert got == arch
    assert (hp.n_vocab, hp.n_embd, hp.n_layer) == (300, 32, 2)
    if arch == "llama":
        assert hp.n_ff == 64 and not hp.tie_embeddings
    else:
        assert hp.n_ctx == 64 and hp.n_ff == 128


def test_infer_from_config_beats_names() -> None:
    cfg = json.loads((FIX / "llama-st" / "config.json").read_text())
    shapes = _shapes(FIX / "llama-st")
    cfg2 = {
        **cfg,
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "rope_parameters": None,
        "rope_theta": 1e6,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    arch, hp = infer_architecture(list(shapes), cfg2, shapes)
    assert arch == "llama" and hp.rope_theta == 1e6
    assert hp.rope_scaling.type == "llama3" and hp.rope_scaling.factor == 8.0
    assert hp.rope_scaling.original_max_position == 8192
    with pytest.raises(UnsupportedError, match="rope scaling type 'dynamic'"):
        infer_architecture(
            list(shapes), {**cfg, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, shapes
        )


def test_unknown_architecture_lists_names_and_supported() -> None:
    names = ["encoder.block.0.layer.0.SelfAttention.q.weight", "shared.weight", "conv.weight"]
    shapes = {
        "encoder.block.0.layer.0.SelfAttention.q.weight": (4, 4),
        "shared.weight": (9, 4),
        "conv.weight": (3, 3, 3),
    }
    with pytest.raises(
        ArchitectureError,
        match=r"shared\.weight.*Supported architectures: llama, gpt2, bert, mlp, qwen2",
    ):
        infer_architecture(names, None, shapes)
    with pytest.raises(ArchitectureError, match=r"model_type 't5' is not supported"):
        infer_architecture(names, {"model_type": "t5"}, shapes)


def test_mlp_chain_rules() -> None:
    shapes = {
        "fc1.weight": (16, 8),
        "fc1.bias": (16,),
        "fc2.weight": (4, 16),
        "fc10.weight": (2, 4),
    }
    arch, hp = infer_architecture(list(shapes), None, shapes)
    assert arch == "mlp" and hp.layer_sizes == [8, 16, 4, 2]  # natural order: fc2 before fc10
    broken = {"a.weight": (16, 8), "b.weight": (4, 15)}
    with pytest.raises(ArchitectureError, match="cannot tell"):
        infer_architecture(list(broken), None, broken)


def test_tied_lm_head_dropped_when_config_ties(tmp_path: Path) -> None:
    import shutil

    d = tmp_path / "tied"
    shutil.copytree(FIX / "llama-st", d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    ir = load_hf_dir(d)
    assert ir.hparams.tie_embeddings and "output.weight" not in ir.tensors
    assert ir.metadata["dropped_tensors"] == ["lm_head.weight"]


def test_single_file_uses_config_beside_it(tmp_path: Path) -> None:
    d = minilm_dir()
    ir = load_model(d / "model.safetensors")
    assert ir.architecture == "bert" and ir.hparams.n_head == 12  # from config.json, not guessed
    assert "hparams_guessed" not in ir.metadata
    (tmp_path / "model.safetensors").symlink_to(d / "model.safetensors")
    alone = load_model(tmp_path / "model.safetensors")
    assert alone.metadata["hparams_guessed"] and alone.hparams.n_head == 6  # 384 / 64: a guess
    assert alone.tensors.keys() == ir.tensors.keys()
    gpt2 = load_model(FIX / "gpt2-bin" / "pytorch_model.bin")
    assert (
        gpt2.hparams.n_head == 4
        and gpt2.hparams.tie_embeddings
        and "output.weight" not in gpt2.tensors
    )


@pytest.mark.parametrize("name", ["gpt2-st", "gpt2-bin", "llama-st", "llama-bin"])
def test_canonical_weights_reproduce_hf_logits(name: str) -> None:
    """End to end: our names + load-time transforms, run by modelc's numpy runtime, give HF's logits."""
    from modelc.runtime.arch import build
    from modelc.runtime.backends.numpy_ref import NumpyBackend
    from modelc.runtime.model import LanguageModel, SeqChunk

    golden = np.load(FIX / f"{name.split('-')[0]}_golden.npz")
    model = build(load_hf_dir(FIX / name), NumpyBackend())
    assert isinstance(model, LanguageModel)
    tokens = [int(t) for t in golden["tokens"]]
    logits = model.forward([SeqChunk(model.new_cache(), tokens, tuple(range(len(tokens))))])
    np.testing.assert_allclose(logits, golden["logits"], rtol=1e-4, atol=1e-5)


def test_config_disagreeing_with_tensors(tmp_path: Path) -> None:
    import shutil

    d = tmp_path / "bad"
    shutil.copytree(FIX / "llama-st", d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "num_key_value_heads": 4}))
    with pytest.raises(
        ArchitectureError,
        match=r"expect blk\.0\.attn_k\.weight of shape \[32, 32\], but it is \[16, 32\]",
    ):
        load_hf_dir(d)
    (d / "config.json").write_text(json.dumps({**cfg, "vocab_size": 320}))
    assert load_hf_dir(d).hparams.n_vocab == 300  # the embedding rows win
