"""A tiny random Phi-4-mini (``tests/gen_tiny.py``): Phi-4-mini-instruct's shape scaled
down.

Phi-3's layout (fused ``qkv_proj`` and ``gate_up_proj``) with partial RoPE
(``partial_rotary_factor`` 0.75: 12 of each 16-wide head rotate), GQA 3:1, a tied head,
LongRoPE (long = short factors, so llama.cpp, which picks by context size, agrees) and
the release's ``sliding_window`` past the context.  ``tokenizer_class`` GPT2Tokenizer, as
the release's, so the converter writes the byte-level vocabulary.  The GGUF is what
``convert_hf_to_gguf.py``'s ``Phi3MiniModel`` writes.  ``python -m tests.gen_phi4mini``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.gen_tiny import Arrays, add_tensors, add_vocab, ensure, llama_weights

VERSION = 1
SEED = 20261221
FACTORS = [1.0, 1.25, 1.5, 2.0, 3.0, 4.5]  # one per rotated pair
CONFIG: dict[str, Any] = {
    "architectures": ["Phi3ForCausalLM"],
    "model_type": "phi3",
    "vocab_size": 384,
    "hidden_size": 48,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,
    "max_position_embeddings": 256,
    "original_max_position_embeddings": 64,
    "partial_rotary_factor": 0.75,
    "rope_scaling": {"type": "longrope", "short_factor": FACTORS, "long_factor": FACTORS},
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "sliding_window": 262144,
    "tie_word_embeddings": True,
    "bos_token_id": None,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}


def weights() -> Arrays:
    """Phi-3's names: Q, K, V rows fused in ``qkv_proj``, gate then up in ``gate_up_proj``."""
    ws = llama_weights(CONFIG, SEED)
    out: Arrays = {}
    for name, data in ws.items():
        p, _, rest = name.rpartition("self_attn.")
        if rest == "q_proj.weight":
            kv = (ws[p + "self_attn.k_proj.weight"], ws[p + "self_attn.v_proj.weight"])
            out[p + "self_attn.qkv_proj.weight"] = np.concatenate([data, *kv])
        elif name.endswith("mlp.gate_proj.weight"):
            up = ws[name.replace("gate_proj", "up_proj")]
            out[name.replace("gate_proj", "gate_up_proj")] = np.concatenate([data, up])
        elif not name.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")):
            out[name] = data
    return out


def write_gguf(ws: Arrays, path: Path) -> None:
    from tests.gguf_support import gguf_file

    cfg = CONFIG
    n_ctx, old = cfg["max_position_embeddings"], cfg["original_max_position_embeddings"]
    d, n_head = cfg["hidden_size"], cfg["num_attention_heads"]
    with gguf_file(path, "phi3", atomic=True) as w:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name("tiny-phi4mini")
        w.add_context_length(n_ctx)
        w.add_rope_scaling_orig_ctx_len(old)
        w.add_embedding_length(d)
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_head_count(n_head)
        w.add_head_count_kv(cfg["num_key_value_heads"])
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_rope_dimension_count(int(cfg["partial_rotary_factor"] * d) // n_head)
        w.add_rope_freq_base(cfg["rope_theta"])
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_sliding_window(cfg["sliding_window"])
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(n_ctx / old) / math.log(old)))
        add_vocab(w, cfg["vocab_size"])
        rs = cfg["rope_scaling"]
        w.add_tensor("rope_factors_long.weight", np.asarray(rs["long_factor"], np.float32))
        w.add_tensor("rope_factors_short.weight", np.asarray(rs["short_factor"], np.float32))
        add_tensors(w, gguf.MODEL_ARCH.PHI3, cfg, ws)


def ensure_model() -> tuple[Path, Path]:
    """The HF directory and the GGUF (made if missing)."""
    name = f"tiny-phi4mini-v{VERSION}"
    return ensure(name, CONFIG, weights, write_gguf, tokenizer_class="GPT2Tokenizer")


if __name__ == "__main__":
    print(*ensure_model())
