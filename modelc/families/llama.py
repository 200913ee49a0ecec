"""LLaMA (and Mistral): how modelc recognises, configures and maps the family.

The forward is the one decoder (:class:`modelc.runtime.arch.decoder.Decoder`).  HF Q/K rows are permuted to
GGUF's interleaved RoPE pairs as ``convert_hf_to_gguf.py`` does; ``sliding_window``
(Mistral) is read from ``config.json`` or ``llama.attention.sliding_window``.  The HF
directory of a ``SmolVLMForConditionalGeneration`` / ``Idefics3ForConditionalGeneration``
loads as its llama text model (``text_config``, ``model.text_model.*``; the vision tower
and connector are the ``--mmproj`` file's).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import gguf

from modelc.families.contract import (
    DecoderTraits,
    Family,
    GGUFMeta,
    Shapes,
    activation,
    find_shape,
    gguf_rope,
    hf_rope,
    n_blocks,
    permuted,
    renamed,
)
from modelc.formats.ir import HParams, Tensor

_QK = re.compile(r"\.attn_([qk])\.(weight|bias)$")


def _from_config(config: Mapping[str, Any]) -> HParams:
    cfg = {**config, **(config.get("text_config") or {})}  # SmolVLM: the text model's
    n_embd = int(cfg["hidden_size"])
    n_head = int(cfg["num_attention_heads"])
    theta, scaling = hf_rope(cfg)
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    n_ctx = int(cfg.get("max_position_embeddings", 2048))
    return HParams(
        n_vocab=int(cfg["vocab_size"]),
        n_ctx=n_ctx,
        n_embd=n_embd,
        n_layer=int(cfg["num_hidden_layers"]),
        n_head=n_head,
        n_head_kv=int(cfg.get("num_key_value_heads") or n_head),
        n_ff=int(cfg["intermediate_size"]),
        head_dim=int(cfg.get("head_dim") or n_embd // n_head),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_style="interleaved",
        rope_scaling=scaling,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        sliding_window=int(window) if window and int(window) < n_ctx else 0,
        activation=activation(str(cfg.get("hidden_act", "silu"))),
        n_expert=int(cfg.get("num_local_experts") or 0),  # Mixtral
        n_expert_used=int(cfg.get("num_experts_per_tok") or 0),
    )


def _from_shapes(names: Sequence[str], shapes: Shapes) -> HParams:
    n_vocab, n_embd = find_shape(shapes, "embed_tokens.weight")
    head_dim = 64 if int(n_embd) % 64 == 0 else int(n_embd)
    q_rows = int(find_shape(shapes, ".self_attn.q_proj.weight")[0])
    k_rows = int(find_shape(shapes, ".self_attn.k_proj.weight")[0])
    return HParams(
        n_vocab=int(n_vocab),
        n_ctx=2048,
        n_embd=int(n_embd),
        n_layer=n_blocks(names, r"(?:^|\.)layers\.(\d+)\."),
        n_head=q_rows // head_dim,
        n_head_kv=k_rows // head_dim,
        n_ff=int(find_shape(shapes, ".mlp.gate_proj.weight")[0]),
        head_dim=head_dim,
        rope_style="interleaved",
        tie_embeddings=not any(n.endswith("lm_head.weight") for n in names),
        activation="silu",
    )


def gguf_hparams(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    """The llama-like keys of a GGUF (llama, qwen2, qwen3 share them)."""
    hp.norm_eps = float(m("attention.layer_norm_rms_epsilon", 1e-5))
    hp.rope_theta = float(m("rope.freq_base", 10000.0))
    hp.rope_style = "interleaved"
    hp.activation = "silu"
    hp.rope_scaling = gguf_rope(m)
    hp.sliding_window = int(m("attention.sliding_window", 0))
    hp.n_expert = int(m("expert_count", 0))  # mixtral, qwen3moe
    hp.n_expert_used = int(m("expert_used_count", 0))


def _permute_qk(src: str, name: str, t: Tensor, hp: HParams) -> Tensor:
    m = _QK.search(name)
    if m is None:
        return renamed(t, name)
    return permuted(t, name, hp.n_head if m.group(1) == "q" else hp.n_head_kv)


def llama_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    """The Q/K/gate shapes llama-like hyper-parameters imply."""
    return {
        "blk.0.attn_q.weight": (hp.n_head * hp.head_dim, hp.n_embd),
        "blk.0.attn_k.weight": (hp.n_head_kv * hp.head_dim, hp.n_embd),
        "blk.0.ffn_gate.weight": (hp.n_ff, hp.n_embd),
    }


LLAMA_REQUIRED = (
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "ffn_gate.weight",
)
LLAMA_LORA_SLOTS = {
    "attn_q": "wq",
    "attn_k": "wk",
    "attn_v": "wv",
    "attn_output": "wo",
    "ffn_gate": "w_gate",
    "ffn_up": "w_up",
    "ffn_down": "w_down",
}
HF_LLAMA_MODULES = re.compile(r"(^|\.)layers\.\d+\.(self_attn|mlp)\.")

FAMILY = Family(
    name="llama",
    kind="text",
    decoder=DecoderTraits(),
    gguf_arch=gguf.MODEL_ARCH.LLAMA,
    gguf_names=("llama",),
    hf_classes=(
        "LlamaForCausalLM",
        "LlamaModel",
        "MistralForCausalLM",
        "MixtralForCausalLM",
        "SmolVLMForConditionalGeneration",
        "Idefics3ForConditionalGeneration",
    ),
    model_types=("llama", "mistral", "mixtral", "smolvlm", "idefics3"),
    signature=re.compile(r"(^|\.)layers\.\d+\.self_attn\.q_proj\.weight$"),
    drop=re.compile(r"rotary_emb\.inv_freq$|^model\.(vision_model|connector)\."),
    rename=lambda name: name.replace("model.text_model.", "model.", 1),
    from_config=_from_config,
    from_shapes=_from_shapes,
    from_gguf=gguf_hparams,
    transform=_permute_qk,
    required=LLAMA_REQUIRED,
    output_required=True,
    shapes=llama_shapes,
    lora_slots=LLAMA_LORA_SLOTS,
    lora_modules=HF_LLAMA_MODULES,
    lora_permute_qk=True,
)
