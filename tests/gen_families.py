"""Tiny randomly initialised Qwen2, Qwen3 and Mistral models, made with numpy only.

As ``tests/gen_gpt2.py``: the weights are a pure function of each family's seed, so the
tests (no torch) and ``scripts/make_tiny_families.py`` (which loads the very same HF
directories into transformers for the goldens) see identical numbers.  Each family is
written to the test-asset cache, never to the repository, as

* an HF directory (``config.json``, ``model.safetensors`` with the names
  ``save_pretrained`` writes, the committed ``tokenizer.json`` /
  ``tokenizer_config.json`` of ``tests/fixtures/families/``: a 384-token byte-level BPE
  with Qwen2's pre-tokenizer and ``<|im_start|>``/``<|im_end|>``), and
* a GGUF in the layout llama.cpp's ``convert_hf_to_gguf.py`` writes for the family:
  tensor names through ``gguf.TensorNameMap``; qwen2/qwen3 keep HF's Q/K rows (NeoX
  RoPE), Mistral (GGUF ``llama``) has them permuted to interleaved pairs; the
  ``{arch}.*`` hyper-parameter keys; the vocabulary as ``_set_vocab_gpt2`` writes it
  (``tokenizer.ggml.model`` gpt2, ``pre`` qwen2, merges, control-token types).

Every norm weight, bias and Q/K norm is randomised, so a missing one shows.
Run ``python -m tests.gen_families`` to (re)create them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.assets import assets_dir

FIX = Path(__file__).parent / "fixtures" / "families"
VERSION = 1  # bump when the weights or the layout change
BASE: dict[str, Any] = {
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "bos_token_id": None,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "tie_word_embeddings": False,
        "use_sliding_window": False,
    },
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "tie_word_embeddings": True,
        "head_dim": 32,
        "attention_bias": False,
    },
    "mistral": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "tie_word_embeddings": False,
        "sliding_window": 8,
    },
}
SEEDS = {"qwen2": 20261202, "qwen3": 20261203, "mistral": 20261207}
GGUF_ARCH = {"qwen2": "qwen2", "qwen3": "qwen3", "mistral": "llama"}


def config(family: str) -> dict[str, Any]:
    return {**BASE, **CONFIGS[family]}


def head_dim(cfg: dict[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def make_weights(family: str) -> dict[str, np.ndarray[Any, Any]]:
    """HF tensor names -> f32 arrays, a pure function of the family's seed."""
    cfg = config(family)
    rng = np.random.default_rng(SEEDS[family])
    d, ff, v, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], head_dim(cfg)
    nq, nkv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def w(*shape: int) -> np.ndarray[Any, Any]:
        return (0.08 * rng.standard_normal(shape)).astype(np.float32)

    def norm(n: int) -> np.ndarray[Any, Any]:
        return (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)

    def bias(n: int) -> np.ndarray[Any, Any]:
        return (0.3 * rng.standard_normal(n)).astype(np.float32)

    out = {"model.embed_tokens.weight": w(v, d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = norm(d)
        out[p + "self_attn.q_proj.weight"] = w(nq, d)
        out[p + "self_attn.k_proj.weight"] = w(nkv, d)
        out[p + "self_attn.v_proj.weight"] = w(nkv, d)
        if family == "qwen2":
            out[p + "self_attn.q_proj.bias"] = bias(nq)
            out[p + "self_attn.k_proj.bias"] = bias(nkv)
            out[p + "self_attn.v_proj.bias"] = bias(nkv)
        if family == "qwen3":
            out[p + "self_attn.q_norm.weight"] = norm(hd)
            out[p + "self_attn.k_norm.weight"] = norm(hd)
        out[p + "self_attn.o_proj.weight"] = w(d, nq)
        out[p + "post_attention_layernorm.weight"] = norm(d)
        out[p + "mlp.gate_proj.weight"] = w(ff, d)
        out[p + "mlp.up_proj.weight"] = w(ff, d)
        out[p + "mlp.down_proj.weight"] = w(d, ff)
    out["model.norm.weight"] = norm(d)
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = w(v, d)
    return out


def _permute(w: np.ndarray[Any, Any], n_head: int) -> np.ndarray[Any, Any]:
    """convert_hf_to_gguf's ``LlamaModel.permute``: rotate-half rows -> interleaved pairs."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf(family: str, weights: dict[str, np.ndarray[Any, Any]], path: Path) -> None:
    cfg, arch = config(family), GGUF_ARCH[family]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"tiny-{family}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if family == "qwen3":
        w.add_key_length(head_dim(cfg))
        w.add_value_length(head_dim(cfg))
    if family == "mistral":
        w.add_rope_dimension_count(head_dim(cfg))
        w.add_sliding_window(cfg["sliding_window"])
    tj = json.loads((FIX / "tokenizer.json").read_text())
    added = {a["content"]: a["id"] for a in tj["added_tokens"]}
    tokens = [""] * cfg["vocab_size"]
    types = [gguf.TokenType.NORMAL] * cfg["vocab_size"]
    for t, i in {**tj["model"]["vocab"], **added}.items():
        tokens[i] = t
        if t in added:
            types[i] = gguf.TokenType.CONTROL
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_eos_token_id(added["<|im_end|>"])
    w.add_pad_token_id(added["<|endoftext|>"])
    w.add_bos_token_id(added["<|endoftext|>"])
    w.add_add_bos_token(False)
    tc = json.loads((FIX / "tokenizer_config.json").read_text())
    w.add_chat_template(tc["chat_template"])
    nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg["num_hidden_layers"])
    for name, data in weights.items():
        new = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new is not None, name
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            key = "num_attention_heads" if "q_proj" in name else "num_key_value_heads"
            data = _permute(data, cfg[key])
        w.add_tensor(new, np.ascontiguousarray(data, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def family_dir(family: str) -> Path:
    return assets_dir() / f"tiny-{family}-v{VERSION}"


def ensure_family(family: str) -> tuple[Path, Path]:
    """The family's HF directory and GGUF (created if missing)."""
    from safetensors.numpy import save_file

    dest = family_dir(family)
    hf, gg = dest / "hf", dest / f"{family}.gguf"
    if gg.exists() and (hf / "model.safetensors").exists():
        return hf, gg
    hf.mkdir(parents=True, exist_ok=True)
    weights = make_weights(family)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIX / name, hf / name)
    (hf / "config.json").write_text(json.dumps(config(family), indent=2))
    save_file(weights, str(hf / "model.safetensors.tmp"), metadata={"format": "pt"})
    os.replace(hf / "model.safetensors.tmp", hf / "model.safetensors")
    write_gguf(family, weights, dest / "tmp.gguf")
    os.replace(dest / "tmp.gguf", gg)
    return hf, gg


if __name__ == "__main__":
    for fam in CONFIGS:
        print(*ensure_family(fam))
