"""A tiny random Llama 4 text model (``tests/gen_tiny.py``): Llama-4-Scout's shape scaled
down.

Every layer a mixture (4 experts, top-1, sigmoid-scored input) with a shared expert, every
4th layer NoPE (4 layers: the last one), Q/K L2 norms on the RoPE layers, GQA 4:1, an
untied head; chunked attention (8192) and attention temperature tuning (floor 8192) as
the release, which llama.cpp fixes at those values, and a context of 16384 (two chunks);
Llama 3 RoPE scaling (factor 16 past 8192, as the release: the GGUF's ``rope_freqs``)
(``scripts/make_tiny_llama4.py`` also records transformers with a floor of 8 and with
chunks of 8, which the tests hold the runtime to).  The GGUF
is what ``convert_hf_to_gguf.py``'s ``Llama4Model`` writes: HF's Q/K rows (interleaved
RoPE already), ``gate_up_proj`` split and transposed into ``ffn_gate_exps`` /
``ffn_up_exps``, ``down_proj`` transposed.  The tokenizer is the committed one with Llama
4's special tokens added (ids 384 on; ``<|begin_of_text|>`` the BOS, ``<|eot|>`` the end
of a turn) and Llama 4's chat template as transformers ships it (``processing_llama4.py``,
committed as ``tests/fixtures/templates/meta-llama-Llama-4-transformers.jinja``).
``python -m tests.gen_llama4``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.gen_tiny import Arrays, Rand, add_vocab, ensure, head_dim, llama_weights
from tests.gguf_support import hf_gguf

VERSION = 4
SEED = 20261224
TEMPLATE = (
    Path(__file__).parent / "fixtures" / "templates" / "meta-llama-Llama-4-transformers.jinja"
)
SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|header_start|>",
    "<|header_end|>",
    "<|eom|>",
    "<|eot|>",
    "<|python_start|>",
    "<|python_end|>",
    "<|image|>",
)
TOKENS = {
    "bos_token": "<|begin_of_text|>",
    "eos_token": "<|eot|>",
    "chat_template": TEMPLATE.read_text(),
}
CONFIG: dict[str, Any] = {
    "architectures": ["Llama4ForCausalLM"],
    "model_type": "llama4_text",
    "vocab_size": 384 + len(SPECIALS),
    "hidden_size": 64,
    "intermediate_size": 64,
    "intermediate_size_mlp": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 16.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "hidden_act": "silu",
    "num_local_experts": 4,
    "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 1,
    "use_qk_norm": True,
    "no_rope_layers": [1, 1, 1, 0],
    "attention_chunk_size": 8192,
    "attn_temperature_tuning": True,
    "floor_scale": 8192,
    "attn_scale": 0.1,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 384,
    "eos_token_id": 389,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}


def _moe(r: Rand, p: str, out: Arrays) -> None:
    d, ff, n_e = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["num_local_experts"]
    q = p + "feed_forward."
    out[q + "router.weight"] = r.rng.standard_normal((n_e, d)).astype(np.float32)
    out[q + "experts.gate_up_proj"] = r.w(n_e, d, 2 * ff)  # x @ it: gate, then up
    out[q + "experts.down_proj"] = r.w(n_e, ff, d)
    for name in ("gate_proj", "up_proj"):
        out[q + f"shared_expert.{name}.weight"] = r.w(ff, d)
    out[q + "shared_expert.down_proj.weight"] = r.w(d, ff)


def weights() -> Arrays:
    """Llama's names with the dense MLP replaced by the mixture (``feed_forward.*``)."""
    ws = llama_weights(CONFIG, SEED, _moe)
    return {k: v for k, v in ws.items() if ".mlp." not in k}


def _gguf_tensors(ws: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    """The converter's names and layout."""
    nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA4, CONFIG["num_hidden_layers"])
    out = {}
    for name, data in ws.items():
        if name.endswith("experts.gate_up_proj"):
            i = name.split(".")[2]
            gate, up = np.split(data.transpose(0, 2, 1), 2, axis=1)
            out[f"blk.{i}.ffn_gate_exps.weight"] = gate
            out[f"blk.{i}.ffn_up_exps.weight"] = up
            continue
        if name.endswith("experts.down_proj"):
            out[f"blk.{name.split('.')[2]}.ffn_down_exps.weight"] = data.transpose(0, 2, 1)
            continue
        new = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new is not None, name
        out[new] = data
    return out


def _rope_freqs() -> np.ndarray[Any, Any]:
    """Llama 3 RoPE scaling as the converter's per-pair divisors (``rope_freqs``)."""
    rp, dim = CONFIG["rope_parameters"], head_dim(CONFIG)
    freqs = np.float32(1.0) / (
        np.float32(rp["rope_theta"]) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    )
    old, lo, hi = (
        rp["original_max_position_embeddings"],
        rp["low_freq_factor"],
        rp["high_freq_factor"],
    )
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / float(f)
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(rp["factor"])
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / rp["factor"] + smooth))
    return np.asarray(out, np.float32)


def write_gguf(ws: Arrays, path: Path) -> None:
    cfg = CONFIG
    with hf_gguf(
        path,
        "llama4",
        "tiny-llama4",
        cfg,
        ff=cfg["intermediate_size_mlp"],
        rope_base=cfg["rope_parameters"]["rope_theta"],
    ) as w:
        w.add_key_length(head_dim(cfg))
        w.add_value_length(head_dim(cfg))
        w.add_expert_count(cfg["num_local_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_vocab_size(cfg["vocab_size"])
        w.add_rope_dimension_count(head_dim(cfg))
        w.add_interleave_moe_layer_step(cfg["interleave_moe_layer_step"])
        w.add_expert_feed_forward_length(cfg["intermediate_size"])
        bos, eos = TOKENS["bos_token"], TOKENS["eos_token"]
        add_vocab(w, cfg["vocab_size"], TEMPLATE.read_text(), SPECIALS, bos, eos)
        w.add_tensor("rope_freqs.weight", _rope_freqs())
        for name, data in _gguf_tensors(ws).items():
            w.add_tensor(name, np.ascontiguousarray(data, np.float32))


def ensure_model() -> tuple[Path, Path]:
    """The HF directory and the GGUF (made if missing)."""
    name = f"tiny-llama4-v{VERSION}"
    return ensure(name, CONFIG, weights, write_gguf, specials=SPECIALS, token_config=TOKENS)


if __name__ == "__main__":
    print(*ensure_model())
