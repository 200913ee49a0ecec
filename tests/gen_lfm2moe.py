"""A tiny random LFM2-MoE (``lfm2moe``): LFM2-8B-A1B's shape scaled down on the tiny LFM2
of ``tests/gen_lfm2.py`` (the same layers and tokenizer).

The first layer's FFN dense (``num_dense_layers``), the others a mixture: 4 experts, 2 a
token, chosen by sigmoid scores plus ``expert_bias``, their weights renormalised; the
release's per-expert ``feed_forward.experts.{e}.w1/w3/w2`` layout.  The GGUF is what
``convert_hf_to_gguf.py``'s ``LFM2MoeModel`` writes: the experts stacked, the bias as
``exp_probs_b.bias``, sigmoid gating and the leading dense layers in the metadata.
``python -m tests.gen_lfm2moe``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.gen_lfm2 import CONFIG as LFM2
from tests.gen_lfm2 import TEMPLATE, add_mixer
from tests.gen_tiny import Arrays, Rand, add_vocab, ensure
from tests.gguf_support import gguf_file

VERSION = 1
SEED = 20261241
CONFIG: dict[str, Any] = {
    **{k: v for k, v in LFM2.items() if not k.startswith("block_")},
    "architectures": ["Lfm2MoeForCausalLM"],
    "model_type": "lfm2_moe",
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_dense_layers": 1,
    "use_expert_bias": True,
    "routed_scaling_factor": 1.0,
    "norm_topk_prob": True,
}


def weights() -> Arrays:
    """HF names -> f32 arrays, a pure function of the seed."""
    cfg, r = CONFIG, Rand(SEED)
    d, v, ff, fe = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], 32
    n_e = cfg["num_experts"]
    out = {"model.embed_tokens.weight": r.w(v, d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.feed_forward."
        add_mixer(cfg, r, i, out)
        if i < cfg["num_dense_layers"]:
            out[p + "w1.weight"] = r.w(ff, d)
            out[p + "w3.weight"] = r.w(ff, d)
            out[p + "w2.weight"] = r.w(d, ff)
            continue
        out[p + "gate.weight"] = r.rng.standard_normal((n_e, d)).astype(np.float32)
        out[p + "expert_bias"] = (0.5 * r.rng.standard_normal(n_e)).astype(np.float32)
        for e in range(n_e):
            out[f"{p}experts.{e}.w1.weight"] = 2.0 * r.w(fe, d)
            out[f"{p}experts.{e}.w3.weight"] = 2.0 * r.w(fe, d)
            out[f"{p}experts.{e}.w2.weight"] = 2.0 * r.w(d, fe)
    out["model.embedding_norm.weight"] = r.norm(d)
    return out


def gguf_tensors(ws: Arrays) -> Arrays:
    """The HF weights as the converter writes them (GGUF names and layouts)."""
    cfg = CONFIG
    nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LFM2MOE, cfg["num_hidden_layers"])
    out: Arrays = {}
    kinds = {"w1": "gate", "w3": "up", "w2": "down"}
    for name, data in ws.items():
        parts = name.split(".")
        if ".experts." in name:  # stacked in expert order
            if parts[5] != "0":
                continue
            i, kind = parts[2], parts[6]
            stack = [ws[name.replace(".experts.0.", f".experts.{e}.")] for e in range(4)]
            out[f"blk.{i}.ffn_{kinds[kind]}_exps.weight"] = np.stack(stack)
            continue
        if name.endswith("expert_bias"):
            name += ".bias"
        if name.endswith("conv.conv.weight"):
            data = data.reshape(data.shape[0], -1)
        new = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new is not None, name
        out[new] = np.ascontiguousarray(data, np.float32)
    return out


def write_gguf(ws: Arrays, path: Path) -> None:
    cfg = CONFIG
    kv_heads = [0 if t == "conv" else cfg["num_key_value_heads"] for t in cfg["layer_types"]]
    with gguf_file(path, "lfm2moe", atomic=True) as w:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name("tiny-lfm2moe")
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(cfg["hidden_size"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count(cfg["num_attention_heads"])
        w.add_head_count_kv(kv_heads)
        w.add_rope_freq_base(cfg["rope_theta"])
        w.add_layer_norm_rms_eps(cfg["norm_eps"])
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_leading_dense_block_count(cfg["num_dense_layers"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_vocab_size(cfg["vocab_size"])
        w.add_shortconv_l_cache(cfg["conv_L_cache"])
        add_vocab(w, cfg["vocab_size"], TEMPLATE.read_text())
        for name, data in gguf_tensors(ws).items():
            w.add_tensor(name, data)


def ensure_model() -> tuple[Path, Path]:
    """The HF directory and the GGUF (made if missing)."""
    return ensure(f"tiny-lfm2moe-v{VERSION}", CONFIG, weights, write_gguf, TEMPLATE.read_text())


if __name__ == "__main__":
    print(*ensure_model())
