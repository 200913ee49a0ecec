"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (NeoX RoPE, per-head Q/K
RMS norms) with a mixture-of-experts FFN in every layer.

Tensors as llama.cpp's ``convert_hf_to_gguf.py`` writes them for ``qwen3moe``: the router
``blk.{i}.ffn_gate_inp`` (n_expert, d) and the experts stacked, ``ffn_gate_exps`` /
``ffn_up_exps`` (n_expert, ff, d) and ``ffn_down_exps`` (n_expert, d, ff); the
``qwen3moe.expert_count`` / ``expert_used_count`` keys.  Each token goes through its
``n_expert_used`` most probable experts (softmax over all of them), their outputs weighted
by those probabilities renormalised to sum to 1, as llama.cpp runs qwen3moe (and
transformers with ``norm_topk_prob``, which the released models set).  From an HF
directory the per-expert tensors are stacked as the converter stacks them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gguf

from modelc.errors import UnsupportedError
from modelc.families.contract import DecoderTraits, Family
from modelc.families.llama import FAMILY as LLAMA
from modelc.families.llama import LLAMA_REQUIRED, llama_shapes
from modelc.families.qwen2 import neox_config, neox_gguf
from modelc.formats.ir import HParams


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    """Qwen3's config reading, with the experts (each layer a mixture, renormalised)."""
    sparse = cfg.get("decoder_sparse_step", 1) == 1 and not cfg.get("mlp_only_layers")
    if not cfg.get("norm_topk_prob", False) or not sparse:
        raise UnsupportedError(
            "this Qwen3-MoE config is not supported (norm_topk_prob false, or dense layers "
            "among the mixtures); modelc runs the released layout, every layer a mixture "
            "with its top-k weights renormalised"
        )
    return with_experts(neox_config(cfg), cfg)


def with_experts(hp: HParams, cfg: Mapping[str, Any]) -> HParams:
    """``hp`` with a Qwen mixture's experts: each one's width, how many, how many a token."""
    hp.n_ff = int(cfg["moe_intermediate_size"])
    hp.n_expert = int(cfg["num_experts"])
    hp.n_expert_used = int(cfg["num_experts_per_tok"])
    return hp


FAMILY = Family(
    name="qwen3moe",
    kind="text",
    decoder=DecoderTraits(),
    gguf_arch=gguf.MODEL_ARCH.QWEN3MOE,
    gguf_names=("qwen3moe",),
    hf_classes=("Qwen3MoeForCausalLM",),
    model_types=("qwen3_moe",),
    drop=LLAMA.drop,
    from_config=_from_config,
    from_gguf=neox_gguf,
    required=(*LLAMA_REQUIRED, "attn_q_norm.weight", "attn_k_norm.weight"),
    output_required=True,
    shapes=llama_shapes,
)
