"""A tiny random LFM2 (``tests/gen_tiny.py``): LFM2-350M's shape scaled down.

Short-convolution layers and GQA attention layers (2:1, per-head Q/K norms, NeoX RoPE,
base 1e6) as the release interleaves them, here ``conv, full_attention, conv``; a width-3
convolution (``conv_L_cache``), the FFN width adjusted as the release's
(``block_auto_adjust_ff_dim``: two thirds, rounded up to ``block_multiple_of``), the head
tied to the embeddings (``tie_embedding``).  The GGUF is what ``convert_hf_to_gguf.py``'s
``LFM2Model`` writes: ``head_count_kv`` per layer (0 on the convolution layers), the
convolution squeezed to (channels, width), the final norm under its ``token_embd_norm``
name.  The chat template is LFM2.5-Instruct's (llama.cpp's ``models/templates/``).
``python -m tests.gen_lfm2``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as G

from tests.assets import cache_lock
from tests.gen_tiny import Arrays, Rand, add_tensors, add_vocab, ensure
from tests.gguf_support import add_matrix, gguf_file

VERSION = 1
SEED = 20261240
TEMPLATE = Path(__file__).parent / "fixtures" / "templates" / "LFM2.5-Instruct.jinja"
CONFIG: dict[str, Any] = {
    "architectures": ["Lfm2ForCausalLM"],
    "model_type": "lfm2",
    "vocab_size": 384,
    "hidden_size": 64,
    "block_ff_dim": 192,
    "intermediate_size": 192,
    "block_auto_adjust_ff_dim": True,
    "block_ffn_dim_multiplier": 1.0,
    "block_multiple_of": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "layer_types": ["conv", "full_attention", "conv"],
    "conv_L_cache": 3,
    "conv_bias": False,
    "max_position_embeddings": 256,
    "norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "tie_embedding": True,
    "bos_token_id": None,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}
FF = 128  # block_ff_dim 192: int(2 * 192 / 3) = 128, a multiple of 32


def add_mixer(cfg: dict[str, Any], r: Rand, i: int, out: Arrays) -> None:
    """Layer ``i``'s norm and its convolution or attention (drawn from ``r``)."""
    d, width = cfg["hidden_size"], cfg["conv_L_cache"]
    hd = d // cfg["num_attention_heads"]
    nq, nkv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    p = f"model.layers.{i}."
    out[p + "operator_norm.weight"] = r.norm(d)
    if cfg["layer_types"][i] == "conv":  # in_proj's B, C, x; a kernel large enough to matter
        out[p + "conv.in_proj.weight"] = 2.0 * r.w(3 * d, d)
        out[p + "conv.conv.weight"] = 6.0 * r.w(d, 1, width)
        out[p + "conv.out_proj.weight"] = 2.0 * r.w(d, d)
    else:
        out[p + "self_attn.q_proj.weight"] = r.w(nq, d)
        out[p + "self_attn.k_proj.weight"] = r.w(nkv, d)
        out[p + "self_attn.v_proj.weight"] = r.w(nkv, d)
        out[p + "self_attn.q_layernorm.weight"] = r.norm(hd)
        out[p + "self_attn.k_layernorm.weight"] = r.norm(hd)
        out[p + "self_attn.out_proj.weight"] = r.w(d, nq)
    out[p + "ffn_norm.weight"] = r.norm(d)


def weights() -> Arrays:
    """HF names -> f32 arrays, a pure function of the seed."""
    cfg, r = CONFIG, Rand(SEED)
    d, v = cfg["hidden_size"], cfg["vocab_size"]
    out = {"model.embed_tokens.weight": r.w(v, d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        add_mixer(cfg, r, i, out)
        out[p + "feed_forward.w1.weight"] = r.w(FF, d)
        out[p + "feed_forward.w3.weight"] = r.w(FF, d)
        out[p + "feed_forward.w2.weight"] = r.w(d, FF)
    out["model.embedding_norm.weight"] = r.norm(d)
    return out


def _layout(name: str, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return data.reshape(data.shape[0], -1) if name.endswith("conv.conv.weight") else data


def write_gguf(ws: Arrays, path: Path, pre: str = "qwen2", q8: bool = False) -> None:
    """The converter's GGUF; ``pre``: the pre-tokenizer name (the release's is ``lfm2``,
    llama.cpp's Llama 3 regex, whole-word tokens first); ``q8``: as ``--outtype q8_0``
    writes it (every matrix Q8_0 but the convolution kernel)."""
    cfg = CONFIG
    kv_heads = [0 if t == "conv" else cfg["num_key_value_heads"] for t in cfg["layer_types"]]
    with gguf_file(path, "lfm2", atomic=True) as w:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name("tiny-lfm2")
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.ALL_F32)
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(cfg["hidden_size"])
        w.add_feed_forward_length(FF)  # as adjusted
        w.add_head_count(cfg["num_attention_heads"])
        w.add_head_count_kv(kv_heads)
        w.add_rope_freq_base(cfg["rope_theta"])
        w.add_layer_norm_rms_eps(cfg["norm_eps"])
        w.add_vocab_size(cfg["vocab_size"])
        w.add_shortconv_l_cache(cfg["conv_L_cache"])
        add_vocab(w, cfg["vocab_size"], TEMPLATE.read_text())
        if pre != "qwen2":
            w.add_tokenizer_pre(pre)  # overwrites add_vocab's
        if not q8:
            add_tensors(w, gguf.MODEL_ARCH.LFM2, cfg, ws, _layout)
            return
        nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LFM2, cfg["num_hidden_layers"])
        for name, data in ws.items():
            new = nmap.get_name(name, try_suffixes=(".weight",))
            assert new is not None, name
            quant = data.ndim == 2 and "shortconv.conv" not in new
            add_matrix(w, new, _layout(name, data), G.Q8_0 if quant else None)


def ensure_model() -> tuple[Path, Path]:
    """The HF directory and the GGUF (made if missing)."""
    return ensure(f"tiny-lfm2-v{VERSION}", CONFIG, weights, write_gguf, TEMPLATE.read_text())


def ensure_q8() -> Path:
    """The tiny GGUF as ``--outtype q8_0`` (made if missing)."""
    gg = ensure_model()[1].with_name("lfm2-q8_0.gguf")
    with cache_lock(gg.name):
        if not gg.exists():
            write_gguf(weights(), gg, q8=True)
    return gg


def ensure_release_pre() -> Path:
    """The tiny GGUF with the release's pre-tokenizer name, ``lfm2`` (made if missing)."""
    gg = ensure_model()[1].with_name("lfm2-pre.gguf")
    with cache_lock(gg.name):
        if not gg.exists():
            write_gguf(weights(), gg, pre="lfm2")
    return gg


if __name__ == "__main__":
    print(*ensure_model())
