"""Tiny randomly initialised Gemma 4 text models (dense and mixture), made with numpy only.

As ``tests/gen_families.py`` (whose helpers it uses): the weights are a pure function of a
seed, each written to the test-asset cache as an HF directory (``config.json`` shaped like
``google/gemma-4-E2B``'s text config, scaled down, and the committed 384-token Gemma-style
tokenizer of ``tests/fixtures/gemma4/`` with Gemma 4's chat template) and as a GGUF in
the layout llama.cpp's ``convert_hf_to_gguf.py`` (``Gemma4Model``) writes.  ``gemma4``
holds every dense text layer kind Gemma 4 has: per-layer input embeddings, the last layers reusing the
keys and values of earlier ones (and twice as wide an FFN there), global layers with
their own head size and KV head count and proportional RoPE over a quarter of the head,
values from the key projection on global layers (``attention_k_eq_v``, as the 31B),
V norms, plain (not ``1 + w``) norms, a per-layer output scalar and soft-capped logits.

Layers: 0 and 2 windowed (head size 16, 2 KV heads), 1 and 3 global (head size 32, 1 KV
head); 2 and 3 reuse the K/V of 0 and 1.  ``gemma4moe`` is shaped like ``gemma-4-26B-A4B``:
no per-layer inputs nor KV sharing, every layer's FFN beside a mixture of 4 experts (2 a
token, GELU, gate and up fused) with a router of its own (RMS norm, a scale, per-expert
output scales); layers 0 and 1 windowed, 2 global.  Run ``python -m tests.gen_gemma4`` to
(re)create them.
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
from tests.gguf_manifest import read
from tests.gguf_support import add_matrix, gguf_file

FIX = Path(__file__).parent / "fixtures" / "gemma4"
VERSION = 4  # bump when the weights or the layout change
SEED = 20261220
PLE = 8  # hidden_size_per_layer_input
CONFIG: dict[str, Any] = {
    "architectures": ["Gemma4ForCausalLM"],
    "model_type": "gemma4_text",
    "vocab_size": 384,
    "vocab_size_per_layer_input": 384,
    "hidden_size": 64,
    "hidden_size_per_layer_input": PLE,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_global_key_value_heads": 1,
    "head_dim": 16,
    "global_head_dim": 32,
    "attention_k_eq_v": True,
    "num_kv_shared_layers": 2,
    "use_double_wide_mlp": True,
    "layer_types": [
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "full_attention",
    ],
    "sliding_window": 4,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
        },
    },
    "final_logit_softcapping": 3.0,  # small enough to change the answers (E2B: 30)
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "enable_moe_block": False,
    "tie_word_embeddings": True,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}
CONFIGS: dict[str, dict[str, Any]] = {
    "gemma4": CONFIG,
    "gemma4moe": {
        **CONFIG,
        "num_hidden_layers": 3,
        "hidden_size_per_layer_input": 0,
        "intermediate_size": 64,
        "num_kv_shared_layers": 0,
        "use_double_wide_mlp": False,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "enable_moe_block": True,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 32,
    },
}
SEEDS = {"gemma4": SEED, "gemma4moe": SEED + 1}


def _shared(c: dict[str, Any], i: int) -> bool:
    return bool(i >= c["num_hidden_layers"] - c["num_kv_shared_layers"])


def _glob(c: dict[str, Any], i: int) -> bool:
    return bool(c["layer_types"][i] == "full_attention")


def make_weights(variant: str = "gemma4") -> dict[str, np.ndarray[Any, Any]]:
    """HF tensor names -> f32 arrays, a pure function of the variant's seed."""
    c = CONFIGS[variant]
    rng = np.random.default_rng(SEEDS[variant])
    d, v, n_layer = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]

    def w(*shape: int) -> np.ndarray[Any, Any]:
        return (0.08 * rng.standard_normal(shape)).astype(np.float32)

    def norm(n: int) -> np.ndarray[Any, Any]:  # Gemma 4's RMSNorm multiplies by w itself
        return (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)

    ple = c["hidden_size_per_layer_input"]
    out = {"model.embed_tokens.weight": w(v, d)}
    if ple:
        out["model.embed_tokens_per_layer.weight"] = w(
            c["vocab_size_per_layer_input"], n_layer * ple
        )
        out["model.per_layer_model_projection.weight"] = w(n_layer * ple, d)
        out["model.per_layer_projection_norm.weight"] = norm(ple)
    for i in range(n_layer):
        p = f"model.layers.{i}."
        hd = c["global_head_dim"] if _glob(c, i) else c["head_dim"]
        nkv = c["num_global_key_value_heads"] if _glob(c, i) else c["num_key_value_heads"]
        ff = c["intermediate_size"] * (2 if _shared(c, i) and c["use_double_wide_mlp"] else 1)
        out[p + "input_layernorm.weight"] = norm(d)
        out[p + "self_attn.q_proj.weight"] = w(c["num_attention_heads"] * hd, d)
        out[p + "self_attn.q_norm.weight"] = norm(hd)
        if not _shared(c, i):
            out[p + "self_attn.k_proj.weight"] = w(nkv * hd, d)
            if not (_glob(c, i) and c["attention_k_eq_v"]):
                out[p + "self_attn.v_proj.weight"] = w(nkv * hd, d)
            out[p + "self_attn.k_norm.weight"] = norm(hd)
        out[p + "self_attn.o_proj.weight"] = w(d, c["num_attention_heads"] * hd)
        out[p + "post_attention_layernorm.weight"] = norm(d)
        out[p + "pre_feedforward_layernorm.weight"] = norm(d)
        out[p + "mlp.gate_proj.weight"] = w(ff, d)
        out[p + "mlp.up_proj.weight"] = w(ff, d)
        out[p + "mlp.down_proj.weight"] = w(d, ff)
        out[p + "post_feedforward_layernorm.weight"] = norm(d)
        if c["enable_moe_block"]:  # a router (std 1: decisive top-k) and stacked experts
            n_e, fe = c["num_experts"], c["moe_intermediate_size"]
            out[p + "router.proj.weight"] = rng.standard_normal((n_e, d)).astype(np.float32)
            out[p + "router.scale"] = norm(d)
            out[p + "router.per_expert_scale"] = norm(n_e)
            out[p + "experts.gate_up_proj"] = w(n_e, 2 * fe, d)
            out[p + "experts.down_proj"] = w(n_e, d, fe)
            out[p + "post_feedforward_layernorm_1.weight"] = norm(d)
            out[p + "pre_feedforward_layernorm_2.weight"] = norm(d)
            out[p + "post_feedforward_layernorm_2.weight"] = norm(d)
        if ple:
            out[p + "per_layer_input_gate.weight"] = w(ple, d)
            out[p + "per_layer_projection.weight"] = w(d, ple)
            out[p + "post_per_layer_input_norm.weight"] = norm(d)
        out[p + "layer_scalar"] = (0.5 + rng.random(1)).astype(np.float32)
    out["model.norm.weight"] = norm(d)
    return out


# tokens Gemma4Model's set_vocab marks USER_DEFINED, "so that the chat parser can read them"
VISIBLE = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>"}
VISIBLE |= {"<tool_response|>", '<|"|>'}


def _vocab(w: gguf.GGUFWriter) -> None:
    """The vocabulary as ``Gemma4Model.set_vocab`` writes it (``LlamaHfVocab``: every
    score -1000, ``<0xXX>`` BYTE, the special tokens CONTROL but the visible ones
    USER_DEFINED; then ``SpecialVocab``'s merges, ids, flags and chat template)."""
    tj = json.loads((FIX / "tokenizer.json").read_text())
    tc = json.loads((FIX / "tokenizer_config.json").read_text())
    vocab: dict[str, int] = tj["model"]["vocab"]
    tokens = sorted(vocab, key=lambda t: vocab[t])
    special = {tc[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token")}
    special |= set(tc["extra_special_tokens"])
    types = [
        gguf.TokenType.BYTE
        if t.startswith("<0x") and len(t) == 6
        else gguf.TokenType.USER_DEFINED
        if t in VISIBLE
        else gguf.TokenType.CONTROL
        if t in special
        else gguf.TokenType.NORMAL
        for t in tokens
    ]
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores([-1000.0] * len(tokens))
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_bos_token_id(vocab[tc["bos_token"]])
    w.add_eos_token_id(vocab[tc["eos_token"]])
    w.add_unk_token_id(vocab[tc["unk_token"]])
    w.add_pad_token_id(vocab[tc["pad_token"]])
    w.add_mask_token_id(vocab[tc["mask_token"]])
    w.add_add_bos_token(True)
    w.add_add_sep_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(tc["chat_template"])
    w.add_add_space_prefix(False)


def write_gguf(
    weights: dict[str, np.ndarray[Any, Any]],
    path: Path,
    quant: gguf.GGMLQuantizationType | None = None,
    variant: str = "gemma4",
) -> None:
    """The model as ``Gemma4Model`` of convert_hf_to_gguf writes it: the global layers' head
    size as ``key_length``, the windowed ones' as ``key_length_swa``, per-layer KV head
    counts and FFN widths as arrays, the proportional RoPE as ``rope_freqs`` (1 for the
    rotated pairs, 1e30 for the others), norms as they are, ``layer_scalar`` as
    ``blk.{i}.layer_output_scale``."""
    c = CONFIGS[variant]
    n_layer = c["num_hidden_layers"]
    swa = [not _glob(c, i) for i in range(n_layer)]
    with gguf_file(path, "gemma4", atomic=True) as w:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(f"tiny-{variant}")
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        ftype = FILE_TYPES[quant or gguf.GGMLQuantizationType.F32]
        w.add_file_type(ftype)
        w.add_block_count(n_layer)
        w.add_context_length(c["max_position_embeddings"])
        w.add_embedding_length(c["hidden_size"])
        w.add_head_count(c["num_attention_heads"])
        rope = c["rope_parameters"]
        w.add_rope_freq_base(rope["full_attention"]["rope_theta"])
        w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
        w.add_layer_norm_rms_eps(c["rms_norm_eps"])
        w.add_final_logit_softcapping(c["final_logit_softcapping"])
        w.add_sliding_window(c["sliding_window"])
        w.add_shared_kv_layers(c["num_kv_shared_layers"])
        w.add_embedding_length_per_layer_input(c["hidden_size_per_layer_input"])
        w.add_sliding_window_pattern(swa)
        w.add_key_length(c["global_head_dim"])
        w.add_value_length(c["global_head_dim"])
        w.add_key_length_swa(c["head_dim"])
        w.add_value_length_swa(c["head_dim"])
        first_shared = n_layer - c["num_kv_shared_layers"]
        ff = c["intermediate_size"]
        if c["use_double_wide_mlp"]:
            w.add_feed_forward_length([ff if i < first_shared else 2 * ff for i in range(n_layer)])
        else:
            w.add_feed_forward_length(ff)
        if c["enable_moe_block"]:
            w.add_expert_count(c["num_experts"])
            w.add_expert_used_count(c["top_k_experts"])
            w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        kv_full, kv_swa = c["num_global_key_value_heads"], c["num_key_value_heads"]
        w.add_head_count_kv([kv_swa if s else kv_full for s in swa])
        w.add_rope_dimension_count(c["global_head_dim"])
        w.add_rope_dimension_count_swa(c["head_dim"])
        _vocab(w)
        nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, n_layer)
        for name, data in weights.items():
            new = _gguf_name(nmap, name)
            assert new is not None, name
            add_matrix(
                w,
                new,
                np.ascontiguousarray(data, np.float32),
                _qtype(data, quant, "ffn_gate_inp" in new),
            )
        part = c["rope_parameters"]["full_attention"]["partial_rotary_factor"]
        n_rot = int(c["global_head_dim"] * part / 2)
        freqs = [1.0] * n_rot + [1e30] * (c["global_head_dim"] // 2 - n_rot)
        w.add_tensor("rope_freqs.weight", np.asarray(freqs, np.float32))


def _gguf_name(nmap: gguf.TensorNameMap, name: str) -> str | None:
    """The converter's name of an HF tensor (its ``filter_tensors`` / ``modify_tensors``)."""
    i = name.split(".")[2] if name.startswith("model.layers.") else ""
    if name.endswith("router.scale"):
        return f"blk.{i}.ffn_gate_inp.scale"
    if name.endswith("router.per_expert_scale"):
        return f"blk.{i}.ffn_down_exps.scale"
    if name.endswith(("layer_scalar", "experts.gate_up_proj", "experts.down_proj")):
        name += ".weight"
    new = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
    return None if new is None else str(new)


FILE_TYPES = {
    gguf.GGMLQuantizationType.F32: gguf.LlamaFileType.ALL_F32,
    gguf.GGMLQuantizationType.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
}


def _qtype(
    data: np.ndarray[Any, Any], quant: gguf.GGMLQuantizationType | None, router: bool
) -> gguf.GGMLQuantizationType | None:
    """The converter's choice: vectors and routers f32; a matrix whose rows are not whole
    blocks f16."""
    if data.ndim < 2 or quant is None or router:
        return None
    block = gguf.GGML_QUANT_SIZES[quant][0]
    return quant if data.shape[-1] % block == 0 else gguf.GGMLQuantizationType.F16


def gemma4_dir(variant: str = "gemma4") -> Path:
    return assets_dir() / f"tiny-{variant}-v{VERSION}"


def ensure_gemma4(variant: str = "gemma4") -> tuple[Path, Path]:
    """The variant's HF directory and GGUF (created if missing)."""
    from safetensors.numpy import save_file

    dest = gemma4_dir(variant)
    hf, gg = dest / "hf", dest / f"{variant}.gguf"
    with cache_lock(dest.name):
        if gg.exists() and (hf / "model.safetensors").exists():
            return hf, gg
        hf.mkdir(parents=True, exist_ok=True)
        weights = make_weights(variant)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(FIX / name, hf / name)
        (hf / "config.json").write_text(json.dumps(CONFIGS[variant], indent=2))
        save_file(weights, str(hf / "model.safetensors.tmp"), metadata={"format": "pt"})
        os.replace(hf / "model.safetensors.tmp", hf / "model.safetensors")
        write_gguf(weights, gg, variant=variant)
    return hf, gg


if __name__ == "__main__":
    for v in CONFIGS:
        print(*ensure_gemma4(v))


def manifest(path: Path) -> dict[str, Any]:
    """A GGUF's metadata (``general.*`` naming keys left out: they follow the directory's
    name; long arrays as the sha256 of their JSON) and per tensor its type, shape and the
    sha256 of its bytes: what the converter's file and ours are compared by."""
    keep = lambda k: not k.startswith("general.") or k in GENERAL  # noqa: E731
    meta, tensors = read(path, keep, digits=None, prefix="")
    return {"metadata": meta, "tensors": {t.name: [t.type, t.shape, t.sha256] for t in tensors}}


GENERAL = (
    "general.architecture",
    "general.type",
    "general.file_type",
    "general.quantization_version",
)
