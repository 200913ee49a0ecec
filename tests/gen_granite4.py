"""Tiny random Granite 4.0-H models (``tests/gen_tiny.py``): ``granite4``,
Granite-4.0-H-Micro's shape scaled down (dense: the FFN its ``shared_mlp``), and
``granite4moe``, Granite-4.0-H-Tiny's (every layer 4 experts, 2 a token, beside the
``shared_mlp`` as a shared expert; its experts fused as ``block_sparse_moe.input_linear``).

Mamba-2 layers and GQA attention layers without RoPE (``position_embedding_type``
``nope``), here ``mamba, mamba, attention``; 4 query heads on 1 KV head; the Mamba-2
mixer of 8 heads of 16 over ``2 * hidden`` channels, one group, a state of 16, a width-4
convolution with a bias; Granite's multipliers (embeddings x12, residual x0.22, logits
/4, Q·K scale ``1 / (2 * head_dim)`` as the release's ``1/128`` is for heads of 64); the
head tied to the embeddings.  The GGUF is what ``convert_hf_to_gguf.py``'s
``GraniteHybridModel`` writes: ``head_count_kv`` per layer (0 on the Mamba layers), Q/K
rows permuted to interleaved pairs, ``shared_mlp.input_linear`` split into
``ffn_gate`` / ``ffn_up``, ``A_log`` as ``ssm_a = -exp(A_log)``, ``ssm_norm`` as (groups,
channels / groups), the experts' fused gate + up split and the shared MLP as
``ffn_*_shexp``.  The chat template is Granite 4.0's (llama.cpp's ``models/templates/``).
``python -m tests.gen_granite4``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.assets import cache_lock
from tests.gen_tiny import Arrays, Rand, add_vocab, ensure, permute
from tests.gguf_support import add_matrix, gguf_file

VERSION = 1
SEEDS = {"granite4": 20261250, "granite4moe": 20261251}
TEMPLATE = Path(__file__).parent / "fixtures" / "templates" / "ibm-granite-granite-4.0.jinja"
CONFIG: dict[str, Any] = {
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "model_type": "granitemoehybrid",
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "shared_intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "layer_types": ["mamba", "mamba", "attention"],
    "position_embedding_type": "nope",
    "rope_theta": 10000,
    "attention_bias": False,
    "attention_multiplier": 0.03125,
    "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22,
    "logits_scaling": 4.0,
    "mamba_n_heads": 8,
    "mamba_d_head": 16,
    "mamba_d_state": 16,
    "mamba_n_groups": 1,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 256,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "num_local_experts": 0,
    "num_experts_per_tok": 0,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "bos_token_id": None,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}


# Granite-4.0-H-Tiny's mixture scaled down: every layer 4 experts, 2 a token, beside the
# shared_mlp (a shared expert)
MOE: dict[str, Any] = {
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "intermediate_size": 32,
    "shared_intermediate_size": 64,
}


def config(family: str = "granite4") -> dict[str, Any]:
    return {**CONFIG, **MOE} if family == "granite4moe" else dict(CONFIG)


def _sizes() -> tuple[int, int, int, int]:
    """(d_inner, conv channels, Mamba heads, groups x state)."""
    c = CONFIG
    inner = c["mamba_expand"] * c["hidden_size"]
    gs = c["mamba_n_groups"] * c["mamba_d_state"]
    return inner, inner + 2 * gs, c["mamba_n_heads"], gs


def weights(family: str = "granite4") -> Arrays:
    """HF names -> f32 arrays, a pure function of the family's seed."""
    c, r = config(family), Rand(SEEDS[family])
    d, v, ff = c["hidden_size"], c["vocab_size"], c["shared_intermediate_size"]
    hd = d // c["num_attention_heads"]
    nq, nkv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    inner, conv, nh, _ = _sizes()
    out = {"model.embed_tokens.weight": r.w(v, d)}
    for i, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = r.norm(d)
        if kind == "mamba":
            m = p + "mamba."
            out[m + "in_proj.weight"] = 2.0 * r.w(inner + conv + nh, d)
            out[m + "conv1d.weight"] = 5.0 * r.w(conv, 1, c["mamba_d_conv"])
            out[m + "conv1d.bias"] = r.w(conv)
            out[m + "dt_bias"] = 5.0 * r.w(nh)
            out[m + "A_log"] = r.rng.uniform(-1.0, 1.0, nh).astype(np.float32)
            out[m + "D"] = r.norm(nh)
            out[m + "norm.weight"] = r.norm(inner)
            out[m + "out_proj.weight"] = 16.0 * r.w(d, inner)
        else:
            out[p + "self_attn.q_proj.weight"] = 4.0 * r.w(nq, d)
            out[p + "self_attn.k_proj.weight"] = 4.0 * r.w(nkv, d)
            out[p + "self_attn.v_proj.weight"] = r.w(nkv, d)
            out[p + "self_attn.o_proj.weight"] = 16.0 * r.w(d, nq)
        out[p + "post_attention_layernorm.weight"] = r.norm(d)
        out[p + "shared_mlp.input_linear.weight"] = 2.0 * r.w(2 * ff, d)
        out[p + "shared_mlp.output_linear.weight"] = 16.0 * r.w(d, ff)
        if c["num_local_experts"]:  # the router (std 1: decisive top-k), fused experts
            n_e, fe, q = c["num_local_experts"], c["intermediate_size"], p + "block_sparse_moe."
            out[q + "router.layer.weight"] = r.rng.standard_normal((n_e, d)).astype(np.float32)
            out[q + "input_linear.weight"] = 2.0 * r.w(n_e, 2 * fe, d)
            out[q + "output_linear.weight"] = 16.0 * r.w(n_e, d, fe)
    out["model.norm.weight"] = r.norm(d)
    return out


def gguf_tensors(ws: Arrays, family: str = "granite4") -> Arrays:
    """The HF weights as the converter writes them (GGUF names and layouts)."""
    c = config(family)
    shexp = "_shexp" if c["num_local_experts"] else ""
    inner = _sizes()[0]
    nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GRANITE_HYBRID, c["num_hidden_layers"])
    out: Arrays = {}
    for name, data in ws.items():
        i = name.split(".")[2] if name.startswith("model.layers.") else ""
        if name.endswith("shared_mlp.input_linear.weight"):
            half = data.shape[0] // 2
            out[f"blk.{i}.ffn_gate{shexp}.weight"] = np.ascontiguousarray(data[:half])
            out[f"blk.{i}.ffn_up{shexp}.weight"] = np.ascontiguousarray(data[half:])
            continue
        if name.endswith("shared_mlp.output_linear.weight"):
            out[f"blk.{i}.ffn_down{shexp}.weight"] = data
            continue
        if name.endswith("block_sparse_moe.input_linear.weight"):  # (n_e, 2 ff, d)
            half = data.shape[1] // 2
            out[f"blk.{i}.ffn_gate_exps.weight"] = np.ascontiguousarray(data[:, :half])
            out[f"blk.{i}.ffn_up_exps.weight"] = np.ascontiguousarray(data[:, half:])
            continue
        if name.endswith(".dt_bias"):
            name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
        if name.endswith("q_proj.weight"):
            data = permute(data, c["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            data = permute(data, c["num_key_value_heads"])
        elif name.endswith("conv1d.weight"):
            data = data.reshape(data.shape[0], -1)
        elif name.endswith((".A_log", ".D")):
            if name.endswith(".A_log"):
                data = -np.exp(data.astype(np.float64)).astype(np.float32)
            data = data.reshape(-1, 1)
        elif name.endswith("mamba.norm.weight"):
            data = data.reshape(c["mamba_n_groups"], inner // c["mamba_n_groups"])
        new = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new is not None, name
        out[new] = np.ascontiguousarray(data, np.float32)
    return out


def write_gguf(ws: Arrays, path: Path, q8: bool = False, family: str = "granite4") -> None:
    """The converter's GGUF; ``q8``: as ``--outtype q8_0`` writes it (the matrices Q8_0
    but the convolution kernel and the grouped norm)."""
    c = config(family)
    inner, _, nh, _ = _sizes()
    kv_heads = [c["num_key_value_heads"] if t == "attention" else 0 for t in c["layer_types"]]
    with gguf_file(path, "granitehybrid", atomic=True) as w:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(f"tiny-{family}")
        w.add_block_count(c["num_hidden_layers"])
        w.add_context_length(2**20)  # the converter's, without RoPE
        w.add_embedding_length(c["hidden_size"])
        w.add_feed_forward_length(c["intermediate_size"])
        w.add_head_count(c["num_attention_heads"])
        w.add_head_count_kv(kv_heads)
        w.add_rope_freq_base(c["rope_theta"])
        w.add_layer_norm_rms_eps(c["rms_norm_eps"])
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.ALL_F32)
        w.add_vocab_size(c["vocab_size"])
        w.add_rope_dimension_count(c["hidden_size"] // c["num_attention_heads"])
        w.add_attention_scale(c["attention_multiplier"])
        w.add_embedding_scale(c["embedding_multiplier"])
        w.add_residual_scale(c["residual_multiplier"])
        w.add_logit_scale(c["logits_scaling"])
        w.add_expert_count(c["num_local_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_shared_feed_forward_length(c["shared_intermediate_size"])
        w.add_ssm_conv_kernel(c["mamba_d_conv"])
        w.add_ssm_state_size(c["mamba_d_state"])
        w.add_ssm_group_count(c["mamba_n_groups"])
        w.add_ssm_inner_size(inner)
        w.add_ssm_time_step_rank(nh)
        w.add_rope_scaling_finetuned(False)
        add_vocab(w, c["vocab_size"], TEMPLATE.read_text())
        for name, data in gguf_tensors(ws, family).items():
            keep = name.endswith(("ssm_conv1d.weight", "ssm_norm.weight"))
            quant = q8 and data.ndim == 2 and name.endswith(".weight") and not keep
            add_matrix(w, name, data, gguf.GGMLQuantizationType.Q8_0 if quant else None)


def ensure_model(family: str = "granite4") -> tuple[Path, Path]:
    """The HF directory and the GGUF of ``granite4`` (dense) or ``granite4moe`` (made if
    missing)."""
    return ensure(
        f"tiny-{family}-v{VERSION}",
        config(family),
        lambda: weights(family),
        lambda ws, path: write_gguf(ws, path, family=family),
        TEMPLATE.read_text(),
    )


def ensure_q8() -> Path:
    """The tiny GGUF as ``--outtype q8_0`` (made if missing)."""
    gg = ensure_model()[1].with_name("granite4-q8_0.gguf")
    with cache_lock(gg.name):
        if not gg.exists():
            write_gguf(weights(), gg, q8=True)
    return gg


if __name__ == "__main__":
    print(*ensure_model())
