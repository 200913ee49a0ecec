"""A tiny random OLMo 2 (``tests/gen_tiny.py``): OLMo-2-1124-7B's shape scaled down.

No input norms; post-attention and post-feedforward norms; Q/K RMS norms over the whole
projection (``n_head * head_dim`` wide); full multi-head attention (no GQA, as the
release); an untied head; RoPE base 500000.  The GGUF is what ``convert_hf_to_gguf.py``'s
``Olmo2Model`` writes (HF's rows, NeoX RoPE).  ``python -m tests.gen_olmo2``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf

from tests.gen_tiny import Arrays, Rand, add_tensors, add_vocab, ensure, head_dim, llama_weights
from tests.gguf_support import hf_gguf

VERSION = 1
SEED = 20261222
CONFIG: dict[str, Any] = {
    "architectures": ["Olmo2ForCausalLM"],
    "model_type": "olmo2",
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}


def olmo_weights(cfg: dict[str, Any], seed: int) -> Arrays:
    """An OLMo 2 / 3 model's weights: llama's without input norms, with whole-projection
    Q/K norms and a post-feedforward norm."""
    hd = head_dim(cfg)

    def extra(r: Rand, p: str, out: Arrays) -> None:
        out[p + "self_attn.q_norm.weight"] = r.norm(cfg["num_attention_heads"] * hd)
        out[p + "self_attn.k_norm.weight"] = r.norm(cfg["num_key_value_heads"] * hd)
        out[p + "post_feedforward_layernorm.weight"] = r.norm(cfg["hidden_size"])

    return llama_weights(cfg, seed, extra, input_norm=False)


def weights() -> Arrays:
    return olmo_weights(CONFIG, SEED)


def write_gguf(
    ws: Arrays, path: Path, arch: str = "olmo2", cfg: dict[str, Any] | None = None
) -> None:
    """``arch``: the file's ``general.architecture`` (a family of OLMo 2's layout);
    ``cfg``: the model's config.json (OLMo 2's by default); its ``sliding_window`` and
    ``layer_types`` written as the converter's ``Olmo2Model`` writes them (OLMo 3, with
    the windowed layers' RoPE base, the same)."""
    cfg = cfg or CONFIG
    with hf_gguf(path, arch, f"tiny-{arch}", cfg) as w:
        if "sliding_window" in cfg:
            w.add_sliding_window(cfg["sliding_window"])
            w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
            w.add_rope_freq_base_swa(cfg["rope_theta"])
        if "rope_scaling" in cfg:  # YaRN, with the keys the config names
            rs = cfg["rope_scaling"]
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(rs["factor"])
            w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
            w.add_rope_scaling_yarn_attn_factor(rs["attention_factor"])
            w.add_rope_scaling_yarn_beta_fast(rs["beta_fast"])
            w.add_rope_scaling_yarn_beta_slow(rs["beta_slow"])
        add_vocab(w, cfg["vocab_size"])
        add_tensors(w, gguf.MODEL_ARCH.OLMO2, cfg, ws)


def ensure_model() -> tuple[Path, Path]:
    """The HF directory and the GGUF (made if missing)."""
    return ensure(f"tiny-olmo2-v{VERSION}", CONFIG, weights, write_gguf)


if __name__ == "__main__":
    print(*ensure_model())
