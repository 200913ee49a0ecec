"""Tiny randomly initialised DeepSeek V2-Lite- and V3-shaped models, made with numpy only.

As ``tests/gen_families.py``: the weights are a pure function of each model's seed, written
to the test-asset cache (never the repository) as an HF directory (``config.json`` shaped
like the release's, scaled down; the committed 384-token tokenizer of
``tests/fixtures/families``) and as a GGUF in the layout llama.cpp's
``convert_hf_to_gguf.py`` writes for ``deepseek2``: ``kv_b_proj`` split into
``attn_k_b`` (per head, transposed) and ``attn_v_b``, the experts stacked, the router's
correction bias as ``ffn_exp_probs_b.bias``, MQA-style ``head_count_kv`` 1 and the MLA
key/value lengths.  ``scripts/make_tiny_deepseek2.py`` checks that GGUF against the
converter's own, tensor by tensor (``tests/golden/deepseek2_*_manifest.json``).

* ``v2lite``: no Q LoRA, softmax routing (greedy top-k, not renormalised), two shared
  experts, the first layer dense, plain RoPE.
* ``v3``: Q LoRA, sigmoid routing with a correction bias over 4 groups (top 2 groups),
  renormalised and scaled by 2.5, one shared expert, YaRN (factor 4, mscale 1).
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
from tests.gen_families import FIX
from tests.gguf_manifest import read
from tests.gguf_support import add_matrix, gguf_file

VERSION = 1
BASE: dict[str, Any] = {
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
CONFIGS: dict[str, dict[str, Any]] = {
    "v2lite": {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "q_lora_rank": None,
        "n_routed_experts": 8,
        "n_shared_experts": 2,
        "num_experts_per_tok": 3,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "greedy",
        "scoring_func": "softmax",
        "norm_topk_prob": False,
        "routed_scaling_factor": 1.0,
    },
    "v3": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "q_lora_rank": 48,
        "n_routed_experts": 16,
        "n_shared_experts": 1,
        "num_experts_per_tok": 4,
        "n_group": 4,
        "topk_group": 2,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "rope_interleave": True,
        "rope_scaling": {
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    },
}
SEEDS = {"v2lite": 20261220, "v3": 20261221}


def config(model: str) -> dict[str, Any]:
    return {**BASE, **CONFIGS[model]}


def make_weights(model: str) -> dict[str, np.ndarray[Any, Any]]:
    """HF tensor names -> f32 arrays, a pure function of the model's seed."""
    cfg = config(model)
    rng = np.random.default_rng(SEEDS[model])
    d, ff, fe, v = (
        cfg["hidden_size"],
        cfg["intermediate_size"],
        cfg["moe_intermediate_size"],
        cfg["vocab_size"],
    )
    nh, nope, rope, vd = (
        cfg["num_attention_heads"],
        cfg["qk_nope_head_dim"],
        cfg["qk_rope_head_dim"],
        cfg["v_head_dim"],
    )
    rank, qrank, n_e = cfg["kv_lora_rank"], cfg["q_lora_rank"], cfg["n_routed_experts"]

    def w(*shape: int) -> np.ndarray[Any, Any]:
        return (0.08 * rng.standard_normal(shape)).astype(np.float32)

    def norm(n: int) -> np.ndarray[Any, Any]:
        return (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)

    out = {"model.embed_tokens.weight": w(v, d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out[p + "input_layernorm.weight"] = norm(d)
        if qrank:
            out[a + "q_a_proj.weight"] = w(qrank, d)
            out[a + "q_a_layernorm.weight"] = norm(qrank)
            out[a + "q_b_proj.weight"] = w(nh * (nope + rope), qrank)
        else:
            out[a + "q_proj.weight"] = w(nh * (nope + rope), d)
        out[a + "kv_a_proj_with_mqa.weight"] = w(rank + rope, d)
        out[a + "kv_a_layernorm.weight"] = norm(rank)
        out[a + "kv_b_proj.weight"] = w(nh * (nope + vd), rank)
        out[a + "o_proj.weight"] = w(d, nh * vd)
        out[p + "post_attention_layernorm.weight"] = norm(d)
        m = p + "mlp."
        if i < cfg["first_k_dense_replace"]:
            out[m + "gate_proj.weight"] = w(ff, d)
            out[m + "up_proj.weight"] = w(ff, d)
            out[m + "down_proj.weight"] = w(d, ff)
            continue
        out[m + "gate.weight"] = rng.standard_normal((n_e, d)).astype(np.float32)
        if cfg["topk_method"] == "noaux_tc":
            out[m + "gate.e_score_correction_bias"] = (0.3 * rng.standard_normal(n_e)).astype(
                np.float32
            )
        for e in range(n_e):
            out[m + f"experts.{e}.gate_proj.weight"] = w(fe, d)
            out[m + f"experts.{e}.up_proj.weight"] = w(fe, d)
            out[m + f"experts.{e}.down_proj.weight"] = w(d, fe)
        fs = fe * cfg["n_shared_experts"]
        out[m + "shared_experts.gate_proj.weight"] = w(fs, d)
        out[m + "shared_experts.up_proj.weight"] = w(fs, d)
        out[m + "shared_experts.down_proj.weight"] = w(d, fs)
    out["model.norm.weight"] = norm(d)
    out["lm_head.weight"] = w(v, d)
    return out


def family_dir(model: str) -> Path:
    return assets_dir() / f"tiny-deepseek2-{model}-v{VERSION}"


def ensure_model(model: str) -> tuple[Path, Path]:
    """The model's HF directory and GGUF (created if missing)."""
    from safetensors.numpy import save_file

    dest = family_dir(model)
    hf, gg = dest / "hf", dest / f"deepseek2-{model}.gguf"
    with cache_lock(dest.name):
        if gg.exists() and (hf / "model.safetensors").exists():
            return hf, gg
        hf.mkdir(parents=True, exist_ok=True)
        weights = make_weights(model)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(FIX / name, hf / name)
        (hf / "config.json").write_text(json.dumps(config(model), indent=2))
        save_file(weights, str(hf / "model.safetensors.tmp"), metadata={"format": "pt"})
        os.replace(hf / "model.safetensors.tmp", hf / "model.safetensors")
        write_gguf(model, weights, gg)
    return hf, gg


def vocab(w: gguf.GGUFWriter) -> None:
    """The fixture vocabulary as ``_set_vocab_gpt2`` writes it (pre ``qwen2``)."""
    tj = json.loads((FIX / "tokenizer.json").read_text())
    added = {a["content"]: a["id"] for a in tj["added_tokens"]}
    n = BASE["vocab_size"]
    tokens, types = [""] * n, [gguf.TokenType.NORMAL] * n
    for t, i in {**tj["model"]["vocab"], **added}.items():
        tokens[i] = t
        if t in added:
            types[i] = gguf.TokenType.CONTROL
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_eos_token_id(BASE["eos_token_id"])
    w.add_pad_token_id(added["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(json.loads((FIX / "tokenizer_config.json").read_text())["chat_template"])


def _hparams(w: gguf.GGUFWriter, cfg: dict[str, Any], lite_key: bool) -> None:
    """The ``deepseek2.*`` keys the converter writes for ``cfg``."""
    rank, rope, nope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"]
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(1)  # MLA runs as MQA over the latent
    rs = cfg.get("rope_scaling")
    if rs:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rs["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rs["beta_slow"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_group_count(cfg["n_group"])
    w.add_expert_group_used_count(cfg["topk_group"])
    sigmoid = cfg["scoring_func"] == "sigmoid"
    w.add_expert_gating_func(
        gguf.ExpertGatingFuncType.SIGMOID if sigmoid else gguf.ExpertGatingFuncType.SOFTMAX
    )
    w.add_key_length(rank + rope)
    w.add_value_length(rank)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_vocab_size(cfg["vocab_size"])
    if cfg["q_lora_rank"] or lite_key:
        w.add_q_lora_rank(cfg["q_lora_rank"] or 0)
    w.add_kv_lora_rank(rank)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(cfg["v_head_dim"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg["norm_topk_prob"]:
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rope)
    if rs and rs.get("mscale_all_dim"):
        w.add_rope_scaling_yarn_log_mul(0.1 * rs["mscale_all_dim"])


def write_gguf(
    model: str,
    weights: dict[str, np.ndarray[Any, Any]],
    path: Path,
    lite_key: bool = False,
    quant: gguf.GGMLQuantizationType | None = None,
) -> None:
    """The model's GGUF as the converter writes it (f32).  ``lite_key``: also
    ``attention.q_lora_rank`` 0, which llama.cpp needs to load a model without Q LoRA
    unless it has V2-Lite's 26 or 27 layers (it tells "lite" models by their layer count).
    ``quant``: matrices whose rows fit its blocks in that type (the router kept f32)."""

    def add(name: str, data: np.ndarray[Any, Any]) -> None:
        fits = quant is not None and data.ndim >= 2 and data.shape[-1] % 32 == 0
        add_matrix(w, name, data, quant if fits and "ffn_gate_inp" not in name else None)

    cfg = config(model)
    nh, nope, vd = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK2, cfg["num_hidden_layers"])
    with gguf_file(path, "deepseek2", atomic=True) as w:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(f"tiny-deepseek2-{model}")
        _hparams(w, cfg, lite_key)
        vocab(w)
        experts: dict[str, list[np.ndarray[Any, Any]]] = {}
        for name, data in weights.items():
            if ".experts." in name:  # stacked per layer and matrix
                i, proj = name.split(".")[2], name.split(".")[-2].removesuffix("_proj")
                experts.setdefault(f"blk.{i}.ffn_{proj}_exps.weight", []).append(data)
                continue
            if name.endswith("kv_b_proj.weight"):  # split per head; K's part transposed
                kv = data.reshape(nh, nope + vd, data.shape[-1])
                i = name.split(".")[2]
                add(f"blk.{i}.attn_k_b.weight", kv[:, :nope].transpose(0, 2, 1).copy())
                add(f"blk.{i}.attn_v_b.weight", kv[:, nope:].copy())
                continue
            if name.endswith("e_score_correction_bias"):
                name = name.replace("e_score_correction_bias", "e_score_correction.bias")
            new = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
            assert new is not None, name
            add(new, np.ascontiguousarray(data, dtype=np.float32))
        for new, mats in experts.items():
            add(new, np.ascontiguousarray(np.stack(mats), dtype=np.float32))


def manifest(path: Path) -> dict[str, Any]:
    """A GGUF's metadata key/values (long arrays as a sha256) and, per tensor, its type,
    shape (numpy order) and the sha256 of its bytes; what the converter manifest holds."""
    skip = {"general.name", "general.size_label", "general.version", "general.quantization_version"}
    meta, tensors = read(path, lambda k: k not in skip)
    rows = {t.name: {"type": t.type, "shape": t.shape[::-1], "sha256": t.sha256} for t in tensors}
    return {"metadata": meta, "tensors": dict(sorted(rows.items()))}


if __name__ == "__main__":
    for m in CONFIGS:
        print(*ensure_model(m))
