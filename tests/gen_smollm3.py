"""A tiny random SmolLM3 (``tests/gen_tiny.py``): SmolLM3-3B's shape scaled down.

GQA 4:1, tied head, RoPE base 5e6, no sliding window, and every 4th layer NoPE
(``no_rope_layers`` as the release lists it; llama.cpp fixes that step at 4, so the model
has 4 layers, the last one NoPE).  The GGUF is what ``convert_hf_to_gguf.py``'s
``SmolLM3Model`` writes: Q/K rows permuted to interleaved pairs.  The chat template is
SmolLM3-3B's (llama.cpp's ``models/templates/``).  ``python -m tests.gen_smollm3``.
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
SEED = 20261220
TEMPLATE = Path(__file__).parent / "fixtures" / "templates" / "HuggingFaceTB-SmolLM3-3B.jinja"
CONFIG: dict[str, Any] = {
    "architectures": ["SmolLM3ForCausalLM"],
    "model_type": "smollm3",
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 5000000.0,
    "hidden_act": "silu",
    "no_rope_layers": [1, 1, 1, 0],
    "no_rope_layer_interval": 4,
    "use_sliding_window": False,
    "sliding_window": None,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": True,
    "bos_token_id": None,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}


def weights() -> Arrays:
    return llama_weights(CONFIG, SEED)


def write_gguf(ws: Arrays, path: Path) -> None:
    cfg = CONFIG
    with hf_gguf(path, "smollm3", "tiny-smollm3", cfg) as w:
        w.add_vocab_size(cfg["vocab_size"])
        w.add_rope_dimension_count(head_dim(cfg))
        add_vocab(w, cfg["vocab_size"], TEMPLATE.read_text())
        add_tensors(w, gguf.MODEL_ARCH.SMOLLM3, cfg, ws, permute_qk(CONFIG))


def ensure_model() -> tuple[Path, Path]:
    """The HF directory and the GGUF (made if missing)."""
    return ensure(f"tiny-smollm3-v{VERSION}", CONFIG, weights, write_gguf, TEMPLATE.read_text())


if __name__ == "__main__":
    print(*ensure_model())
