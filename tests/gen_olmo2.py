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


def _olmo2_layer(r: Rand, p: str, out: Arrays) -> None:
    hd = head_dim(CONFIG)
    out[p + "self_attn.q_norm.weight"] = r.norm(CONFIG["num_attention_heads"] * hd)
    out[p + "self_attn.k_norm.weight"] = r.norm(CONFIG["num_key_value_heads"] * hd)
    out[p + "post_feedforward_layernorm.weight"] = r.norm(CONFIG["hidden_size"])


def weights() -> Arrays:
    return llama_weights(CONFIG, SEED, _olmo2_layer, input_norm=False)


def write_gguf(ws: Arrays, path: Path, arch: str = "olmo2") -> None:
    """``arch``: the file's ``general.architecture`` (a family of OLMo 2's layout)."""
    cfg = CONFIG
    with hf_gguf(path, arch, f"tiny-{arch}", cfg) as w:
        add_vocab(w, cfg["vocab_size"])
        add_tensors(w, gguf.MODEL_ARCH.OLMO2, cfg, ws)


def ensure_model() -> tuple[Path, Path]:
    """The HF directory and the GGUF (made if missing)."""
    return ensure(f"tiny-olmo2-v{VERSION}", CONFIG, weights, write_gguf)


if __name__ == "__main__":
    print(*ensure_model())
