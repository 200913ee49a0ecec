"""A tiny random Ministral 3 (``tests/gen_tiny.py``): Ministral-3-8B's text model scaled down.

GQA 4:1, an untied head, RoPE base 1e6 with YaRN (factor 16 over an original context of
16, ``mscale`` = ``mscale_all_dim`` = 1 as the release) and Llama 4's attention
temperature (``llama_4_scaling_beta`` 0.1), so prompts past 16 tokens exercise both.
The GGUF is what ``convert_hf_to_gguf.py``'s ``Ministral3Model`` writes (Q/K rows
permuted to interleaved pairs).  The chat template is Ministral-3-14B-Reasoning's
(llama.cpp's ``models/templates/``).  ``python -m tests.gen_mistral3``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf

from tests.gen_tiny import (
    Arrays,
    add_tensors,
    add_vocab,
    ensure,
    head_dim,
    llama_weights,
    permute_qk,
)
from tests.gguf_support import hf_gguf

VERSION = 1
SEED = 20261223
TEMPLATE = (
    Path(__file__).parent
    / "fixtures"
    / "templates"
    / "mistralai-Ministral-3-14B-Reasoning-2512.jinja"
)
ROPE: dict[str, Any] = {
    "type": "yarn",
    "rope_theta": 1000000.0,
    "factor": 16.0,
    "original_max_position_embeddings": 16,
    "max_position_embeddings": 256,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale_all_dim": 1.0,
    "mscale": 1.0,
    "llama_4_scaling_beta": 0.1,
}
CONFIG: dict[str, Any] = {
    "architectures": ["Ministral3ForCausalLM"],
    "model_type": "ministral3",
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_parameters": ROPE,
    "hidden_act": "silu",
    "sliding_window": None,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}


def weights() -> Arrays:
    return llama_weights(CONFIG, SEED)


def write_gguf(ws: Arrays, path: Path) -> None:
    cfg = CONFIG
    with hf_gguf(path, "mistral3", "tiny-mistral3", cfg, rope_base=ROPE["rope_theta"]) as w:
        w.add_vocab_size(cfg["vocab_size"])
        w.add_key_length(head_dim(cfg))
        w.add_value_length(head_dim(cfg))
        w.add_rope_dimension_count(head_dim(cfg))
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(ROPE["factor"])
        w.add_rope_scaling_orig_ctx_len(ROPE["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(ROPE["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(ROPE["beta_slow"])
        w.add_rope_scaling_yarn_log_mul(ROPE["mscale_all_dim"])
        w.add_attn_temperature_scale(ROPE["llama_4_scaling_beta"])
        add_vocab(w, cfg["vocab_size"], TEMPLATE.read_text())
        add_tensors(w, gguf.MODEL_ARCH.MISTRAL3, cfg, ws, permute_qk(CONFIG))


def ensure_model() -> tuple[Path, Path]:
    """The HF directory and the GGUF (made if missing)."""
    name = f"tiny-mistral3-v{VERSION}"
    return ensure(name, CONFIG, weights, write_gguf, TEMPLATE.read_text())


if __name__ == "__main__":
    print(*ensure_model())
