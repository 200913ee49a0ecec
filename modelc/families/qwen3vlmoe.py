"""Qwen3-VL-MoE (Qwen3-VL-30B-A3B, -235B-A22B; GGUF ``qwen3vlmoe``): Qwen3-VL's text model
(:mod:`modelc.families.qwen3vl`: interleaved M-RoPE, DeepStack) with Qwen3-MoE's mixture
of experts in every layer (:mod:`modelc.families.qwen3moe`: softmax routing, the top-k
weights renormalised, as transformers' ``Qwen3VLMoeTextTopKRouter`` always does).

Tensors as ``convert_hf_to_gguf.py``'s ``Qwen3VLMoeTextModel`` writes them (Qwen3-MoE's
``ffn_gate_inp`` and stacked ``ffn_{gate,up,down}_exps``); an HF directory's fused
``mlp.experts.gate_up_proj`` (n_expert, d, 2 * ff) and ``down_proj`` (n_expert, ff, d)
are split and transposed as the converter does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gguf

from modelc.errors import UnsupportedError
from modelc.families.contract import DecoderTraits, Family
from modelc.families.qwen3moe import FAMILY as QWEN3MOE
from modelc.families.qwen3moe import with_experts
from modelc.families.qwen3vl import FAMILY as QWEN3VL
from modelc.families.qwen3vl import qwen3vl_config, qwen3vl_gguf
from modelc.formats.ir import HParams


def _from_config(config: Mapping[str, Any]) -> HParams:
    cfg = {**config, **(config.get("text_config") or {})}
    if cfg.get("decoder_sparse_step", 1) != 1 or cfg.get("mlp_only_layers"):
        raise UnsupportedError(
            "this Qwen3-VL-MoE config has dense layers among the mixtures; modelc runs the "
            "released layout, every layer a mixture"
        )
    return with_experts(qwen3vl_config(config), cfg)


FAMILY = Family(
    name="qwen3vlmoe",
    kind="text",
    decoder=DecoderTraits(),
    gguf_arch=gguf.MODEL_ARCH.QWEN3VLMOE,
    gguf_names=("qwen3vlmoe",),
    hf_classes=("Qwen3VLMoeForConditionalGeneration",),
    model_types=("qwen3_vl_moe",),
    drop=QWEN3VL.drop,
    rename=QWEN3VL.rename,
    from_config=_from_config,
    from_gguf=qwen3vl_gguf,
    required=QWEN3MOE.required,
    output_required=True,
    shapes=QWEN3MOE.shapes,
)
