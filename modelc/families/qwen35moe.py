"""Qwen3.5-MoE (GGUF ``qwen35moe``: Qwen3.5-35B-A3B, -122B-A10B, -397B-A17B): Qwen3.5's
hybrid of Gated DeltaNet and gated attention (:mod:`modelc.families.qwen35`) with a
mixture of experts in every layer plus a shared expert.

Each token goes through its ``n_expert_used`` most probable experts (softmax, top-k
weights renormalised, as transformers' ``Qwen3_5MoeTopKRouter`` and llama.cpp's
``build_moe_ffn``) and through the shared expert, whose output is scaled by
``sigmoid(h . ffn_gate_inp_shexp)`` (:mod:`modelc.runtime.arch.moe`).  Tensors as
``convert_hf_to_gguf.py`` writes them: the stacked experts ``ffn_{gate,up,down}_exps``
(transformers 5's fused ``gate_up_proj`` split, gate rows first), ``ffn_gate_inp``,
``ffn_{gate,up,down}_shexp`` and ``ffn_gate_inp_shexp`` (1, d).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gguf

from modelc.families.contract import Family
from modelc.families.qwen35 import (
    QWEN35_DROP,
    QWEN35_REQUIRED,
    QWEN35_TRAITS,
    qwen35_config,
    qwen35_gguf,
    qwen35_rename,
    qwen35_transform,
)
from modelc.formats.ir import HParams


def _from_config(config: Mapping[str, Any]) -> HParams:
    cfg = {**config, **(config.get("text_config") or {})}
    hp = qwen35_config(cfg)
    hp.n_expert = int(cfg["num_experts"])
    hp.n_expert_used = int(cfg["num_experts_per_tok"])
    return hp


FAMILY = Family(
    name="qwen35moe",
    kind="text",
    decoder=QWEN35_TRAITS,
    gguf_arch=gguf.MODEL_ARCH.QWEN35MOE,
    gguf_names=("qwen35moe",),
    hf_classes=("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"),
    model_types=("qwen3_5_moe_text", "qwen3_5_moe"),
    drop=QWEN35_DROP,
    from_config=_from_config,
    from_gguf=qwen35_gguf,
    rename=qwen35_rename,
    transform=qwen35_transform,
    required=QWEN35_REQUIRED,
    output_required=True,
)
