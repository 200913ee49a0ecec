"""Tiny randomly initialised Qwen2, Qwen3, Mistral, Gemma2, Gemma3 and Phi-3 models, made
with numpy only.

As ``tests/gen_gpt2.py``: the weights are a pure function of each family's seed, so the
tests (no torch) and ``scripts/make_tiny_families.py`` (which loads the very same HF
directories into transformers for the goldens) see identical numbers.  Each family is
written to the test-asset cache, never to the repository, as

* an HF directory (``config.json``, ``model.safetensors`` with the names
  ``save_pretrained`` writes, the committed ``tokenizer.json`` /
  ``tokenizer_config.json`` of ``tests/fixtures/families/``: a 384-token byte-level BPE
  with Qwen2's pre-tokenizer and ``<|im_start|>``/``<|im_end|>``), and
* a GGUF in the layout llama.cpp's ``convert_hf_to_gguf.py`` writes for the family:
  tensor names through ``gguf.TensorNameMap``; qwen2/qwen3 keep HF's Q/K rows (NeoX
  RoPE), Mistral (GGUF ``llama``) has them permuted to interleaved pairs; Gemma's norms
  stored as ``1 + w``; Phi-3's fused ``attn_qkv`` / ``ffn_up`` and LongRoPE factor tensors; the
  ``{arch}.*`` hyper-parameter keys; the vocabulary as ``_set_vocab_gpt2`` writes it
  (``tokenizer.ggml.model`` gpt2, ``pre`` qwen2, merges, control-token types).

Every norm weight, bias and Q/K norm is randomised, so a missing one shows.
Run ``python -m tests.gen_families`` to (re)create them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import gguf
import gguf.quants
import numpy as np

from tests.assets import assets_dir, cache_lock
from tests.gguf_support import add_matrix, hf_gguf

FIX = Path(__file__).parent / "fixtures" / "families"
VERSION = 1
# Phi-3's LongRoPE divisors, one per rotated pair (head_dim 16)
PHI3_SHORT = [1.0, 1.25, 1.5, 2.0, 3.0, 4.5, 7.0, 12.0]
PHI3_LONG = [
    1.0,
    1.5,
    2.5,
    4.0,
    8.0,
    16.0,
    32.0,
    64.0,
]  # bump when the weights or the layout change
BASE: dict[str, Any] = {
    "vocab_size": 384,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "bos_token_id": None,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "tie_word_embeddings": False,
        "use_sliding_window": False,
    },
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "tie_word_embeddings": True,
        "head_dim": 32,
        "attention_bias": False,
    },
    "mistral": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "tie_word_embeddings": False,
        "sliding_window": 8,
    },
    "gemma2": {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "tie_word_embeddings": True,
        "head_dim": 16,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": 16,  # = head_dim: GGUF has no key for it (llama.cpp's rule)
        "attn_logit_softcapping": 3.0,  # small enough to change the answers
        "final_logit_softcapping": 2.0,
        "sliding_window": 4,  # layers 0 and 2 windowed, 1 global
        "pad_token_id": 0,
    },
    "gemma3": {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "tie_word_embeddings": True,
        "num_hidden_layers": 6,  # layers 0-4 windowed, 5 global
        "head_dim": 32,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": 32,
        "sliding_window": 4,
        "rope_theta": 1_000_000.0,  # global layers, linear x2
        "rope_local_base_freq": 10000.0,  # windowed layers
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "pad_token_id": 0,
    },
    "qwen3moe": {  # GGUF only in modelc (an HF directory's experts are separate tensors)
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "tie_word_embeddings": False,
        "head_dim": 32,
        "attention_bias": False,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
    "mixtral": {  # a llama GGUF with stacked experts
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "tie_word_embeddings": False,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": None,
    },
    "phi3": {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "tie_word_embeddings": False,
        "original_max_position_embeddings": 64,
        # LongRoPE; long = short, so llama.cpp (which picks by context size) agrees too
        "rope_scaling": {"type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_SHORT},
        "sliding_window": None,
        "pad_token_id": 0,
    },
}
SEEDS = {
    "qwen2": 20261202,
    "qwen3": 20261203,
    "mistral": 20261207,
    "gemma2": 20261209,
    "gemma3": 20261210,
    "phi3": 20261211,
    "qwen3moe": 20261212,
    "mixtral": 20261213,
}
GGUF_ARCH = {
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "mistral": "llama",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "phi3": "phi3",
    "qwen3moe": "qwen3moe",
    "mixtral": "llama",
}
GEMMA = ("gemma2", "gemma3")
# a mixture's HF names: the FFN's prefix and each expert's gate / up / down matrix
MOE_HF = {
    "qwen3moe": ("mlp.", ("gate_proj", "up_proj", "down_proj")),
    "mixtral": ("block_sparse_moe.", ("w1", "w3", "w2")),
}


def config(family: str) -> dict[str, Any]:
    return {**BASE, **CONFIGS[family]}


def head_dim(cfg: dict[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def make_weights(family: str) -> dict[str, np.ndarray[Any, Any]]:
    """HF tensor names -> f32 arrays, a pure function of the family's seed."""
    cfg = config(family)
    rng = np.random.default_rng(SEEDS[family])
    d, ff, v, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], head_dim(cfg)
    nq, nkv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def w(*shape: int) -> np.ndarray[Any, Any]:
        return (0.08 * rng.standard_normal(shape)).astype(np.float32)

    one = 0.0 if family in GEMMA else 1.0  # HF Gemma's RMSNorm multiplies by 1 + w

    def norm(n: int) -> np.ndarray[Any, Any]:
        return (one + 0.3 * rng.standard_normal(n)).astype(np.float32)

    def bias(n: int) -> np.ndarray[Any, Any]:
        return (0.3 * rng.standard_normal(n)).astype(np.float32)

    out = {"model.embed_tokens.weight": w(v, d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = norm(d)
        if family == "phi3":
            out[p + "self_attn.qkv_proj.weight"] = w(nq + 2 * nkv, d)
        else:
            out[p + "self_attn.q_proj.weight"] = w(nq, d)
            out[p + "self_attn.k_proj.weight"] = w(nkv, d)
            out[p + "self_attn.v_proj.weight"] = w(nkv, d)
        if family == "qwen2":
            out[p + "self_attn.q_proj.bias"] = bias(nq)
            out[p + "self_attn.k_proj.bias"] = bias(nkv)
            out[p + "self_attn.v_proj.bias"] = bias(nkv)
        if family in ("qwen3", "gemma3", "qwen3moe"):
            out[p + "self_attn.q_norm.weight"] = norm(hd)
            out[p + "self_attn.k_norm.weight"] = norm(hd)
        out[p + "self_attn.o_proj.weight"] = w(d, nq)
        out[p + "post_attention_layernorm.weight"] = norm(d)
        if family in GEMMA:
            out[p + "pre_feedforward_layernorm.weight"] = norm(d)
            out[p + "post_feedforward_layernorm.weight"] = norm(d)
        if family in MOE_HF:  # a router (std 1: decisive top-k) and the experts
            q, (gate, up, down) = p + MOE_HF[family][0], MOE_HF[family][1]
            n_e = cfg.get("num_experts") or cfg["num_local_experts"]
            fe = cfg.get("moe_intermediate_size", ff)
            out[q + "gate.weight"] = rng.standard_normal((n_e, d)).astype(np.float32)
            for e in range(n_e):
                out[q + f"experts.{e}.{gate}.weight"] = w(fe, d)
                out[q + f"experts.{e}.{up}.weight"] = w(fe, d)
                out[q + f"experts.{e}.{down}.weight"] = w(d, fe)
            continue
        if family == "phi3":
            out[p + "mlp.gate_up_proj.weight"] = w(2 * ff, d)
        else:
            out[p + "mlp.gate_proj.weight"] = w(ff, d)
            out[p + "mlp.up_proj.weight"] = w(ff, d)
        out[p + "mlp.down_proj.weight"] = w(d, ff)
    out["model.norm.weight"] = norm(d)
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = w(v, d)
    return out


def _permute(w: np.ndarray[Any, Any], n_head: int) -> np.ndarray[Any, Any]:
    """convert_hf_to_gguf's ``LlamaModel.permute``: rotate-half rows -> interleaved pairs."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf(
    family: str,
    weights: dict[str, np.ndarray[Any, Any]],
    path: Path,
    quant: gguf.GGMLQuantizationType | None = None,
) -> None:
    """The family's GGUF; with ``quant``, its matrices in that type (the router kept f32,
    as llama.cpp's quantizer keeps ``ffn_gate_inp``)."""
    cfg, arch = config(family), GGUF_ARCH[family]
    # llama.cpp gives Phi-3 names' "</s>" special attributes; this vocabulary has none
    with hf_gguf(path, arch, f"tiny-{family}" if family != "phi3" else "tiny-p-three", cfg) as w:
        if family in ("qwen3", "qwen3moe", *GEMMA):
            w.add_key_length(head_dim(cfg))
            w.add_value_length(head_dim(cfg))
        if family == "qwen3moe":
            w.add_expert_count(cfg["num_experts"])
            w.add_expert_used_count(cfg["num_experts_per_tok"])
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if family == "mixtral":
            w.add_rope_dimension_count(head_dim(cfg))
            w.add_expert_count(cfg["num_local_experts"])
            w.add_expert_used_count(cfg["num_experts_per_tok"])
        if family == "mistral":
            w.add_rope_dimension_count(head_dim(cfg))
            w.add_sliding_window(cfg["sliding_window"])
        if family in GEMMA:
            w.add_sliding_window(cfg["sliding_window"])
        if family == "gemma2":  # Gemma2Model writes no rope.freq_base (llama.cpp: 10000)
            w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
            w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        if family == "gemma3":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(cfg["rope_scaling"]["factor"])
        if family == "phi3":
            old, n_ctx = cfg["original_max_position_embeddings"], cfg["max_position_embeddings"]
            w.add_rope_scaling_orig_ctx_len(old)
            w.add_rope_dimension_count(head_dim(cfg))
            w.add_sliding_window(0)  # sliding_window None, as convert_hf_to_gguf writes it
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(n_ctx / old) / math.log(old)))
            rs = cfg["rope_scaling"]
            w.add_tensor("rope_factors_long.weight", np.asarray(rs["long_factor"], np.float32))
            w.add_tensor("rope_factors_short.weight", np.asarray(rs["short_factor"], np.float32))
        tj = json.loads((FIX / "tokenizer.json").read_text())
        added = {a["content"]: a["id"] for a in tj["added_tokens"]}
        tokens = [""] * cfg["vocab_size"]
        types = [gguf.TokenType.NORMAL] * cfg["vocab_size"]
        for t, i in {**tj["model"]["vocab"], **added}.items():
            tokens[i] = t
            if t in added:
                types[i] = gguf.TokenType.CONTROL
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(
            [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
        )
        w.add_eos_token_id(added["<|im_end|>"])
        w.add_pad_token_id(added["<|endoftext|>"])
        w.add_bos_token_id(added["<|endoftext|>"])
        w.add_add_bos_token(False)
        tc = json.loads((FIX / "tokenizer_config.json").read_text())
        w.add_chat_template(tc["chat_template"])
        nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg["num_hidden_layers"])
        experts: dict[str, list[np.ndarray[Any, Any]]] = {}
        for name, data in weights.items():
            if ".experts." in name:  # stacked per layer and matrix, as the converter does
                i, proj = name.split(".")[2], name.split(".")[-2].removesuffix("_proj")
                proj = {"w1": "gate", "w3": "up", "w2": "down"}.get(proj, proj)
                experts.setdefault(f"blk.{i}.ffn_{proj}_exps.weight", []).append(data)
                continue
            new = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
            assert new is not None, name
            if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
                key = "num_attention_heads" if "q_proj" in name else "num_key_value_heads"
                data = _permute(data, cfg[key])
            if family in GEMMA and name.endswith("norm.weight"):
                data = data + np.float32(1.0)  # convert_hf_to_gguf stores Gemma's 1 + w
            _add(w, new, np.ascontiguousarray(data, dtype=np.float32), quant)
        for new, mats in experts.items():
            _add(w, new, np.ascontiguousarray(np.stack(mats), dtype=np.float32), quant)


def _add(
    w: gguf.GGUFWriter,
    name: str,
    data: np.ndarray[Any, Any],
    quant: gguf.GGMLQuantizationType | None,
) -> None:
    keep = data.ndim < 2 or "ffn_gate_inp" in name  # vectors and the router stay f32
    add_matrix(w, name, data, None if keep else quant)


def family_dir(family: str) -> Path:
    return assets_dir() / f"tiny-{family}-v{VERSION}"


def save_hf(hf: Path, cfg: dict[str, Any], weights: dict[str, np.ndarray[Any, Any]]) -> None:
    """An HF directory: the committed tokenizer, ``cfg`` as config.json and ``weights``
    (model.safetensors, written under another name and renamed once complete)."""
    from safetensors.numpy import save_file

    hf.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIX / name, hf / name)
    (hf / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(weights, str(hf / "model.safetensors.tmp"), metadata={"format": "pt"})
    os.replace(hf / "model.safetensors.tmp", hf / "model.safetensors")


def ensure_family(family: str) -> tuple[Path, Path]:
    """The family's HF directory and GGUF (created if missing)."""
    dest = family_dir(family)
    hf, gg = dest / "hf", dest / f"{family}.gguf"
    with cache_lock(dest.name):
        if gg.exists() and (hf / "model.safetensors").exists():
            return hf, gg
        weights = make_weights(family)
        save_hf(hf, config(family), weights)
        write_gguf(family, weights, gg)
    return hf, gg


if __name__ == "__main__":
    for fam in CONFIGS:
        print(*ensure_family(fam))
