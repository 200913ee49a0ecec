"""A tiny randomly initialised GLM-4.5-shaped model (``glm4moe``), made with numpy only.

As ``tests/gen_deepseek2.py``: the weights are a pure function of the seed, written to the
test-asset cache as an HF directory (``config.json`` shaped like GLM-4.5's, scaled down:
GQA 4:1 with ``head_dim`` set apart from the width, Q/K/V biases, Q/K norms, half the head
rotated, 8 routed experts and one shared, the first layer dense; the committed 384-token
tokenizer) and as a GGUF in the layout llama.cpp's ``convert_hf_to_gguf.py`` writes
(``post_attention_layernorm`` as ``post_attention_norm``, the experts stacked, the
correction bias as ``exp_probs_b.bias``); ``scripts/make_tiny_glm4moe.py`` checks it
against the converter's (``tests/golden/glm4moe_manifest.json``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.assets import assets_dir, cache_lock
from tests.gen_deepseek2 import vocab
from tests.gen_families import FIX
from tests.gguf_support import add_matrix, gguf_file

VERSION = 1
SEED = 20261230
CONFIG: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLM"],
    "model_type": "glm4_moe",
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "partial_rotary_factor": 0.5,
    "attention_bias": True,
    "use_qk_norm": True,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "num_nextn_predict_layers": 0,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


def make_weights() -> dict[str, np.ndarray[Any, Any]]:
    """HF tensor names -> f32 arrays, a pure function of the seed."""
    c = CONFIG
    rng = np.random.default_rng(SEED)
    d, ff, fe, v, hd = (
        c["hidden_size"],
        c["intermediate_size"],
        c["moe_intermediate_size"],
        c["vocab_size"],
        c["head_dim"],
    )
    nq, nkv, n_e = (
        c["num_attention_heads"] * hd,
        c["num_key_value_heads"] * hd,
        c["n_routed_experts"],
    )

    def w(*shape: int) -> np.ndarray[Any, Any]:
        return (0.08 * rng.standard_normal(shape)).astype(np.float32)

    def norm(n: int) -> np.ndarray[Any, Any]:
        return (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)

    def bias(n: int) -> np.ndarray[Any, Any]:
        return (0.3 * rng.standard_normal(n)).astype(np.float32)

    out = {"model.embed_tokens.weight": w(v, d)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out[p + "input_layernorm.weight"] = norm(d)
        for name, rows in (("q", nq), ("k", nkv), ("v", nkv)):
            out[a + f"{name}_proj.weight"] = w(rows, d)
            out[a + f"{name}_proj.bias"] = bias(rows)
        out[a + "q_norm.weight"] = norm(hd)
        out[a + "k_norm.weight"] = norm(hd)
        out[a + "o_proj.weight"] = w(d, nq)
        out[p + "post_attention_layernorm.weight"] = norm(d)
        m = p + "mlp."
        if i < c["first_k_dense_replace"]:
            out[m + "gate_proj.weight"] = w(ff, d)
            out[m + "up_proj.weight"] = w(ff, d)
            out[m + "down_proj.weight"] = w(d, ff)
            continue
        out[m + "gate.weight"] = rng.standard_normal((n_e, d)).astype(np.float32)
        out[m + "gate.e_score_correction_bias"] = (0.3 * rng.standard_normal(n_e)).astype(
            np.float32
        )
        for e in range(n_e):
            out[m + f"experts.{e}.gate_proj.weight"] = w(fe, d)
            out[m + f"experts.{e}.up_proj.weight"] = w(fe, d)
            out[m + f"experts.{e}.down_proj.weight"] = w(d, fe)
        out[m + "shared_experts.gate_proj.weight"] = w(fe, d)
        out[m + "shared_experts.up_proj.weight"] = w(fe, d)
        out[m + "shared_experts.down_proj.weight"] = w(d, fe)
    out["model.norm.weight"] = norm(d)
    out["lm_head.weight"] = w(v, d)
    return out


def write_gguf(weights: dict[str, np.ndarray[Any, Any]], path: Path) -> None:
    """The GGUF as the converter writes it (f32)."""
    c = CONFIG
    nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GLM4_MOE, c["num_hidden_layers"])
    with gguf_file(path, "glm4moe", atomic=True) as w:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name("tiny-glm4moe")
        w.add_block_count(c["num_hidden_layers"])
        w.add_context_length(c["max_position_embeddings"])
        w.add_embedding_length(c["hidden_size"])
        w.add_feed_forward_length(c["intermediate_size"])
        w.add_head_count(c["num_attention_heads"])
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_rope_freq_base(c["rope_theta"])
        w.add_layer_norm_rms_eps(c["rms_norm_eps"])
        w.add_expert_count(c["n_routed_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_group_count(c["n_group"])
        w.add_expert_group_used_count(c["topk_group"])
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_rope_dimension_count(int(c["head_dim"] * c["partial_rotary_factor"]))
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_expert_shared_count(c["n_shared_experts"])
        w.add_leading_dense_block_count(c["first_k_dense_replace"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_scale(c["routed_scaling_factor"])
        w.add_expert_weights_norm(c["norm_topk_prob"])
        w.add_nextn_predict_layers(c["num_nextn_predict_layers"])
        vocab(w)
        experts: dict[str, list[np.ndarray[Any, Any]]] = {}
        for name, data in weights.items():
            if ".experts." in name:
                i, proj = name.split(".")[2], name.split(".")[-2].removesuffix("_proj")
                experts.setdefault(f"blk.{i}.ffn_{proj}_exps.weight", []).append(data)
                continue
            name = name.replace("e_score_correction_bias", "e_score_correction.bias")
            new = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
            assert new is not None, name
            add_matrix(w, new, np.ascontiguousarray(data, dtype=np.float32))
        for new, mats in experts.items():
            add_matrix(w, new, np.ascontiguousarray(np.stack(mats), dtype=np.float32))


def ensure_model() -> tuple[Path, Path]:
    """The HF directory and GGUF (created if missing)."""
    from safetensors.numpy import save_file

    dest = assets_dir() / f"tiny-glm4moe-v{VERSION}"
    hf, gg = dest / "hf", dest / "glm4moe.gguf"
    with cache_lock(dest.name):
        if gg.exists() and (hf / "model.safetensors").exists():
            return hf, gg
        hf.mkdir(parents=True, exist_ok=True)
        weights = make_weights()
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(FIX / name, hf / name)
        (hf / "config.json").write_text(json.dumps(CONFIG, indent=2))
        save_file(weights, str(hf / "model.safetensors.tmp"), metadata={"format": "pt"})
        os.replace(hf / "model.safetensors.tmp", hf / "model.safetensors")
        write_gguf(weights, gg)
    return hf, gg


if __name__ == "__main__":
    print(*ensure_model())
