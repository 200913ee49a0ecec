"""Tiny randomly initialised Qwen3.5 models (dense ``qwen35``, mixture ``qwen35moe``), made
with numpy only.

As ``tests/gen_families.py`` (whose tokenizer and helpers it shares): the weights are a
pure function of the seed, written to the test-asset cache as

* an HF directory (``Qwen3_5ForCausalLM``, a ``qwen3_5_text`` config shaped like
  Qwen3.5-9B's scaled down: three Gated DeltaNet layers then one gated full-attention
  layer, 4 query heads on 1 KV head of 32 with a quarter of it rotated, 2 key heads
  serving 4 value heads in the linear layers, a width-4 convolution; the mixture, as
  Qwen3.5-35B-A3B's, every FFN 8 experts, 2 a token, plus a sigmoid-gated shared
  expert, its experts stored fused as transformers 5 saves them), and
* a GGUF in the layout llama.cpp's ``convert_hf_to_gguf.py`` writes for ``qwen35``
  (``Qwen3_5TextModel``): norms stored as ``1 + w`` (not the gated ``ssm_norm``),
  ``A_log`` as ``ssm_a = -exp(A_log)`` (rounded to f32 once, as torch computes it), ``dt_bias`` as ``ssm_dt.bias``, the convolution
  squeezed to (channels, width), the value heads reordered from grouped-by-key-head to
  tiled order; the ``qwen35.ssm.*`` and ``rope.dimension_sections`` keys.
  ``tests/golden/qwen35_converter.json`` holds what the converter itself writes for the
  same HF directory; ``tests/test_qwen35.py`` holds this file to it.

Run ``python -m tests.gen_qwen35`` to (re)create them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.assets import assets_dir, cache_lock
from tests.gen_families import FIX, save_hf
from tests.gguf_support import add_matrix, gguf_file

VERSION = 2
# the pre-tokenizer names the releases' tokenizers map to (the converter is told them)
TOKENIZER_PRE = {"qwen35": "qwen35", "qwen35moe": "qwen35", "qwen3next": "qwen2"}
SEEDS = {"qwen35": 20261234, "qwen35moe": 20261235, "qwen3next": 20261236}
CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "full_attention_interval": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_interleaved": True,
        "mrope_section": [2, 1, 1],
    },
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
MOE: dict[str, Any] = {
    "architectures": ["Qwen3_5MoeForCausalLM"],
    "model_type": "qwen3_5_moe_text",
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48,
}


NEXT: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0},
    "partial_rotary_factor": 0.25,
}


def config(family: str = "qwen35") -> dict[str, Any]:
    if family == "qwen3next":
        return {**CONFIG, **MOE, **NEXT}
    return {**CONFIG, **MOE} if family == "qwen35moe" else dict(CONFIG)


def make_weights(family: str = "qwen35") -> dict[str, np.ndarray[Any, Any]]:
    """HF tensor names -> f32 arrays, a pure function of the family's seed."""
    c = config(family)
    rng = np.random.default_rng(SEEDS[family])
    d, ff, v, hd = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["head_dim"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    kd = c["linear_num_key_heads"] * c["linear_key_head_dim"]
    nv = c["linear_num_value_heads"]
    vd = nv * c["linear_value_head_dim"]

    def w(*shape: int, std: float = 0.08) -> np.ndarray[Any, Any]:
        return (std * rng.standard_normal(shape)).astype(np.float32)

    def norm(n: int, one: float = 0.0) -> np.ndarray[Any, Any]:  # HF stores w of (1 + w)
        return (one + 0.3 * rng.standard_normal(n)).astype(np.float32)

    out = {"model.embed_tokens.weight": w(v, d)}
    for i, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = norm(d)
        if kind == "linear_attention" and family == "qwen3next":  # per key head: q k v z, b a
            q = p + "linear_attn."
            out[q + "in_proj_qkvz.weight"] = w(2 * kd + 2 * vd, d, std=0.15)
            out[q + "in_proj_ba.weight"] = w(2 * nv, d, std=0.3)
        elif kind == "linear_attention":
            q = p + "linear_attn."
            out[q + "in_proj_qkv.weight"] = w(2 * kd + vd, d, std=0.15)
            out[q + "in_proj_z.weight"] = w(vd, d)
            out[q + "in_proj_b.weight"] = w(nv, d, std=0.3)
            out[q + "in_proj_a.weight"] = w(nv, d, std=0.3)
        if kind == "linear_attention":
            out[q + "conv1d.weight"] = w(2 * kd + vd, 1, c["linear_conv_kernel_dim"], std=0.4)
            out[q + "dt_bias"] = w(nv, std=0.5)
            out[q + "A_log"] = rng.uniform(-1.0, 1.0, nv).astype(np.float32)
            out[q + "norm.weight"] = norm(c["linear_value_head_dim"], one=1.0)
            out[q + "out_proj.weight"] = w(d, vd)
        else:
            out[p + "self_attn.q_proj.weight"] = w(2 * nh * hd, d)
            out[p + "self_attn.k_proj.weight"] = w(nkv * hd, d)
            out[p + "self_attn.v_proj.weight"] = w(nkv * hd, d)
            out[p + "self_attn.q_norm.weight"] = norm(hd)
            out[p + "self_attn.k_norm.weight"] = norm(hd)
            out[p + "self_attn.o_proj.weight"] = w(d, nh * hd)
        out[p + "post_attention_layernorm.weight"] = norm(d)
        if family != "qwen35":  # a router (std 1: decisive top-k), experts, shared one
            n_e, fe, fs = (
                c["num_experts"],
                c["moe_intermediate_size"],
                c["shared_expert_intermediate_size"],
            )
            out[p + "mlp.gate.weight"] = rng.standard_normal((n_e, d)).astype(np.float32)
            out[p + "mlp.experts.gate_up_proj"] = w(n_e, 2 * fe, d)
            out[p + "mlp.experts.down_proj"] = w(n_e, d, fe)
            out[p + "mlp.shared_expert.gate_proj.weight"] = w(fs, d)
            out[p + "mlp.shared_expert.up_proj.weight"] = w(fs, d)
            out[p + "mlp.shared_expert.down_proj.weight"] = w(d, fs)
            out[p + "mlp.shared_expert_gate.weight"] = w(1, d, std=0.3)
            continue
        out[p + "mlp.gate_proj.weight"] = w(ff, d)
        out[p + "mlp.up_proj.weight"] = w(ff, d)
        out[p + "mlp.down_proj.weight"] = w(d, ff)
    out["model.norm.weight"] = norm(d)
    out["lm_head.weight"] = w(v, d)
    return out


def tiled(x: np.ndarray[Any, Any], axis: int, head: int) -> np.ndarray[Any, Any]:
    """Value heads grouped by key head -> tiled (``_LinearAttentionVReorderBase``)."""
    c = CONFIG
    nk, r = c["linear_num_key_heads"], c["linear_num_value_heads"] // c["linear_num_key_heads"]
    x = np.moveaxis(x, axis, 0)
    y = x.reshape(nk, r, head, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)
    return np.ascontiguousarray(np.moveaxis(y, 0, axis))


def gguf_tensors(
    weights: dict[str, np.ndarray[Any, Any]], family: str = "qwen35"
) -> dict[str, np.ndarray[Any, Any]]:
    """The HF weights as llama.cpp's converter writes them for ``family``."""
    c = CONFIG
    kd2 = 2 * c["linear_num_key_heads"] * c["linear_key_head_dim"]
    hv = c["linear_value_head_dim"]
    nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[family.upper()], c["num_hidden_layers"])
    out = {}
    nk, dk = c["linear_num_key_heads"], c["linear_key_head_dim"]
    for name, data in weights.items():
        if name.endswith("in_proj_qkvz.weight"):  # per key head q k v z -> qkv, z
            i, r = name.split(".")[2], data.shape[0] // nk - 2 * dk
            heads = data.reshape(nk, -1, data.shape[1])
            q, k, v, z = np.split(heads, [dk, 2 * dk, 2 * dk + r // 2], axis=1)
            flat = [x.reshape(-1, data.shape[1]) for x in (q, k, v, z)]
            out[f"blk.{i}.attn_qkv.weight"] = np.ascontiguousarray(np.concatenate(flat[:3]))
            out[f"blk.{i}.attn_gate.weight"] = np.ascontiguousarray(flat[3])
            continue
        if ".mlp.experts." in name:  # fused (n_expert, 2*ff, d): gate rows, then up rows
            i = name.split(".")[2]
            if name.endswith("gate_up_proj"):
                half = data.shape[1] // 2
                out[f"blk.{i}.ffn_gate_exps.weight"] = np.ascontiguousarray(data[:, :half])
                out[f"blk.{i}.ffn_up_exps.weight"] = np.ascontiguousarray(data[:, half:])
            else:
                out[f"blk.{i}.ffn_down_exps.weight"] = data
            continue
        if name.endswith(".A_log"):
            data = -np.exp(data.astype(np.float64))  # rounded once, as torch's f32 exp
        elif name.endswith(".dt_bias"):
            name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            data = data + np.float32(1.0)
        if ".linear_attn." in name and family != "qwen3next":  # qwen3next keeps HF's order
            if "in_proj_qkv" in name or "conv1d" in name:
                data = np.concatenate([data[:kd2], tiled(data[kd2:], 0, hv)])
            elif "in_proj_z" in name:
                data = tiled(data, 0, hv)
            elif "in_proj_a" in name or "in_proj_b" in name or name.endswith(("A_log", "bias")):
                data = tiled(data, 0, 1)
            elif "out_proj" in name:
                data = tiled(data, 1, hv)
        if "conv1d" in name:
            data = data.reshape(data.shape[0], -1)
        new = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new is not None, name
        out[new] = np.ascontiguousarray(data, dtype=np.float32)
    return out


def write_gguf(
    weights: dict[str, np.ndarray[Any, Any]], path: Path, family: str, q8: bool = False
) -> None:
    """The family's GGUF; ``q8``: as ``--outtype q8_0`` writes it (every matrix Q8_0 but
    the convolution)."""
    c = config(family)
    rope = c["rope_parameters"]
    with gguf_file(path, family, atomic=True) as w:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(f"tiny-{family}")
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.ALL_F32)
        w.add_block_count(c["num_hidden_layers"])
        w.add_context_length(c["max_position_embeddings"])
        w.add_embedding_length(c["hidden_size"])
        w.add_feed_forward_length(c["intermediate_size"])
        w.add_head_count(c["num_attention_heads"])
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_rope_freq_base(rope["rope_theta"])
        w.add_layer_norm_rms_eps(c["rms_norm_eps"])
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
        if "mrope_section" in rope:
            w.add_rope_dimension_sections([*rope["mrope_section"], 0])  # padded to 4
        w.add_ssm_conv_kernel(c["linear_conv_kernel_dim"])
        w.add_ssm_state_size(c["linear_key_head_dim"])
        w.add_ssm_group_count(c["linear_num_key_heads"])
        w.add_ssm_time_step_rank(c["linear_num_value_heads"])
        w.add_ssm_inner_size(c["linear_value_head_dim"] * c["linear_num_value_heads"])
        recurrent = [t == "linear_attention" for t in c["layer_types"]]
        w.add_array(f"{family}.attention.recurrent_layers", recurrent)
        if family != "qwen35":
            w.add_expert_count(c["num_experts"])
            w.add_expert_used_count(c["num_experts_per_tok"])
            w.add_expert_feed_forward_length(c["moe_intermediate_size"])
            w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
        w.add_full_attention_interval(c["full_attention_interval"])
        w.add_rope_dimension_count(
            int(c["head_dim"] * c.get("partial_rotary_factor", rope.get("partial_rotary_factor")))
        )
        tj = json.loads((FIX / "tokenizer.json").read_text())
        added = {a["content"]: a["id"] for a in tj["added_tokens"]}
        tokens = [""] * c["vocab_size"]
        types = [gguf.TokenType.NORMAL] * c["vocab_size"]
        for t, i in {**tj["model"]["vocab"], **added}.items():
            tokens[i] = t
            if t in added:
                types[i] = gguf.TokenType.CONTROL
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(TOKENIZER_PRE[family])
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(
            [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
        )
        w.add_eos_token_id(added["<|im_end|>"])
        w.add_pad_token_id(added["<|endoftext|>"])
        w.add_add_bos_token(False)
        tc = json.loads((FIX / "tokenizer_config.json").read_text())
        w.add_chat_template(tc["chat_template"])
        for name, data in gguf_tensors(weights, family).items():
            quant = q8 and data.ndim == 2 and "ssm_conv1d" not in name
            add_matrix(w, name, data, gguf.GGMLQuantizationType.Q8_0 if quant else None)


def family_dir(family: str) -> Path:
    return assets_dir() / f"tiny-{family}-v{VERSION}"


def ensure_qwen35(family: str = "qwen35") -> tuple[Path, Path]:
    """The tiny Qwen3.5's (``qwen35`` or ``qwen35moe``) HF directory and GGUF (created if
    missing)."""
    dest = family_dir(family)
    hf, gg = dest / "hf", dest / f"{family}.gguf"
    with cache_lock(dest.name):
        if gg.exists() and (hf / "model.safetensors").exists():
            return hf, gg
        weights = make_weights(family)
        save_hf(hf, config(family), weights)
        write_gguf(weights, gg, family)
    return hf, gg


def ensure_qwen35_q8() -> Path:
    """The tiny qwen35 as a Q8_0 GGUF (created if missing)."""
    q8 = ensure_qwen35()[1].with_name("qwen35-q8_0.gguf")
    with cache_lock(q8.name):
        if not q8.exists():
            write_gguf(make_weights(), q8, "qwen35", q8=True)
    return q8


if __name__ == "__main__":
    for fam in SEEDS:
        print(*ensure_qwen35(fam))
