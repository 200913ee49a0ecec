"""Helpers for the tiny random decoder families of ``tests/gen_<family>.py`` (smollm3, ...).

Each family module gives a ``config.json`` (shaped like the real release's, scaled down)
and a seed; the weights are a pure numpy function of the seed (:func:`llama_weights`), so
the tests (no torch) and ``scripts/make_tiny_<family>.py`` (transformers, llama.cpp's
converter) see identical numbers.  :func:`ensure` writes the HF directory (the committed
384-token tokenizer of ``tests/fixtures/families/``) and the family's GGUF into the
test-asset cache; :func:`add_vocab` writes that tokenizer as ``convert_hf_to_gguf``'s
``_set_vocab_gpt2`` does.  The converter's own GGUF of the same directory is recorded
in ``tests/golden/family_<family>.json`` (``converter``), and the tests hold ours to it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.assets import assets_dir, cache_lock

FIX = Path(__file__).parent / "fixtures" / "families"
Arrays = dict[str, np.ndarray[Any, Any]]


def head_dim(cfg: dict[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


class Rand:
    """The random parts of a tiny model, drawn in call order from one seed."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def w(self, *shape: int) -> np.ndarray[Any, Any]:
        return (0.08 * self.rng.standard_normal(shape)).astype(np.float32)

    def norm(self, n: int) -> np.ndarray[Any, Any]:
        return (1.0 + 0.3 * self.rng.standard_normal(n)).astype(np.float32)


def llama_weights(
    cfg: dict[str, Any],
    seed: int,
    extra: Callable[[Rand, str, Arrays], None] | None = None,
    input_norm: bool = True,
) -> Arrays:
    """HF names -> f32 arrays of a llama-shaped model; ``extra(rand, prefix, out)`` adds a
    layer's family-specific tensors after its attention projections; ``input_norm``
    False: no ``input_layernorm`` (olmo2)."""
    r = Rand(seed)
    d, ff, v, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], head_dim(cfg)
    nq, nkv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = {"model.embed_tokens.weight": r.w(v, d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if input_norm:
            out[p + "input_layernorm.weight"] = r.norm(d)
        out[p + "self_attn.q_proj.weight"] = r.w(nq, d)
        out[p + "self_attn.k_proj.weight"] = r.w(nkv, d)
        out[p + "self_attn.v_proj.weight"] = r.w(nkv, d)
        out[p + "self_attn.o_proj.weight"] = r.w(d, nq)
        if extra is not None:
            extra(r, p, out)
        out[p + "post_attention_layernorm.weight"] = r.norm(d)
        out[p + "mlp.gate_proj.weight"] = r.w(ff, d)
        out[p + "mlp.up_proj.weight"] = r.w(ff, d)
        out[p + "mlp.down_proj.weight"] = r.w(d, ff)
    out["model.norm.weight"] = r.norm(d)
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = r.w(v, d)
    return out


def permute(w: np.ndarray[Any, Any], n_head: int) -> np.ndarray[Any, Any]:
    """convert_hf_to_gguf's ``LlamaModel.permute``: rotate-half rows -> interleaved pairs."""
    return np.ascontiguousarray(
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def permute_qk(cfg: dict[str, Any]) -> Callable[[str, np.ndarray[Any, Any]], np.ndarray[Any, Any]]:
    """:func:`add_tensors`' ``fix`` for a llama-style model: Q rows permuted by the heads,
    K rows by the KV heads (:func:`permute`)."""

    def fix(name: str, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        if name.endswith("q_proj.weight"):
            return permute(data, cfg["num_attention_heads"])
        if name.endswith("k_proj.weight"):
            return permute(data, cfg["num_key_value_heads"])
        return data

    return fix


def add_tensors(
    w: gguf.GGUFWriter,
    arch: gguf.MODEL_ARCH,
    cfg: dict[str, Any],
    weights: Arrays,
    fix: Callable[[str, np.ndarray[Any, Any]], np.ndarray[Any, Any]] | None = None,
) -> None:
    """Every weight under its GGUF name (``fix(hf_name, array)``: the converter's layout)."""
    nmap = gguf.get_tensor_name_map(arch, cfg["num_hidden_layers"])
    for name, data in weights.items():
        new = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new is not None, name
        w.add_tensor(new, np.ascontiguousarray(fix(name, data) if fix else data, np.float32))


def tokenizer_json(specials: Sequence[str] = ()) -> dict[str, Any]:
    """The committed tokenizer, with ``specials`` added as special tokens from id 384 on."""
    tj: dict[str, Any] = json.loads((FIX / "tokenizer.json").read_text())
    base = len(tj["model"]["vocab"])
    tj["added_tokens"] += [added_token(t, base + i) for i, t in enumerate(specials)]
    return tj


def added_token(text: str, i: int) -> dict[str, Any]:
    """A tokenizer.json ``added_tokens`` entry: special token ``text`` at id ``i``."""
    return {
        "id": i,
        "content": text,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def add_gpt2_tokens(
    w: gguf.GGUFWriter, n_vocab: int, specials: Sequence[str] = ()
) -> dict[str, int]:
    """The committed tokenizer's tokens, types and merges with ``specials`` added
    (:func:`tokenizer_json`), as ``_set_vocab_gpt2`` writes them (pre ``qwen2``: its regex);
    the added tokens' ids, by text."""
    return add_gpt2_vocab(w, tokenizer_json(specials), n_vocab)


def add_gpt2_vocab(w: gguf.GGUFWriter, tj: Mapping[str, Any], n_vocab: int) -> dict[str, int]:
    """The tokens, types and merges of the tokenizer.json ``tj`` as ``_set_vocab_gpt2``
    writes them (pre ``qwen2``); the added tokens' ids, by text."""
    added = {a["content"]: a["id"] for a in tj["added_tokens"]}
    tokens = [""] * n_vocab
    types = [gguf.TokenType.NORMAL] * n_vocab
    for t, i in {**tj["model"]["vocab"], **added}.items():
        tokens[i] = t
        if t in added:
            types[i] = gguf.TokenType.CONTROL
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    return added


def write_tokenizer(
    dest: Path, specials: Sequence[str], config: Mapping[str, Any], indent: int = 1
) -> None:
    """``dest``'s tokenizer.json (the committed one with ``specials``: :func:`tokenizer_json`)
    and its tokenizer_config.json (``config``)."""
    tj = tokenizer_json(specials)
    (dest / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=indent))


def add_vocab(
    w: gguf.GGUFWriter,
    n_vocab: int,
    chat_template: str | None = None,
    specials: Sequence[str] = (),
    bos: str | None = None,
    eos: str = "<|im_end|>",
) -> None:
    """The committed tokenizer as ``_set_vocab_gpt2`` writes it (pre ``qwen2``: its regex;
    no BOS unless ``bos`` names one), with ``chat_template`` or the committed one, and
    ``specials`` added (:func:`tokenizer_json`)."""
    added = add_gpt2_tokens(w, n_vocab, specials)
    if bos is not None:
        w.add_bos_token_id(added[bos])
    w.add_eos_token_id(added[eos])
    w.add_pad_token_id(added["<|endoftext|>"])
    w.add_add_bos_token(False)
    tc = json.loads((FIX / "tokenizer_config.json").read_text())
    w.add_chat_template(chat_template or tc["chat_template"])


def ensure(
    name: str,
    cfg: dict[str, Any],
    weights: Callable[[], Arrays],
    write_gguf: Callable[[Arrays, Path], None],
    chat_template: str | None = None,
    tokenizer_class: str | None = None,
    specials: Sequence[str] = (),
    token_config: Mapping[str, Any] | None = None,
) -> tuple[Path, Path]:
    """The model's HF directory and GGUF in the asset cache (``name`` carries the
    version), made if missing; ``chat_template`` and ``tokenizer_class`` replace the
    committed tokenizer_config.json's, ``token_config`` more of its keys; ``specials``
    are added to the tokenizer (:func:`tokenizer_json`)."""
    from safetensors.numpy import save_file

    dest = assets_dir() / name
    hf, gg = dest / "hf", dest / f"{name}.gguf"
    with cache_lock(dest.name):
        if gg.exists() and (hf / "model.safetensors").exists():
            return hf, gg
        hf.mkdir(parents=True, exist_ok=True)
        if specials:
            tj = tokenizer_json(specials)
            (hf / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
        else:
            shutil.copy(FIX / "tokenizer.json", hf / "tokenizer.json")
        tc = {**json.loads((FIX / "tokenizer_config.json").read_text()), **(token_config or {})}
        if chat_template is not None:
            tc["chat_template"] = chat_template
        if tokenizer_class is not None:
            tc["tokenizer_class"] = tokenizer_class
        (hf / "tokenizer_config.json").write_text(json.dumps(tc, indent=1) + "\n")
        (hf / "config.json").write_text(json.dumps(cfg, indent=2))
        ws = weights()
        save_file(ws, str(hf / "model.safetensors.tmp"), metadata={"format": "pt"})
        os.replace(hf / "model.safetensors.tmp", hf / "model.safetensors")
        write_gguf(ws, gg)
    return hf, gg
