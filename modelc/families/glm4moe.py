"""GLM-4.5 / 4.6 / 4.7 (``glm4moe``: GLM-4.5, GLM-4.5-Air, GLM-4.6): grouped-query
attention with Q/K/V biases, per-head Q/K RMS norms where ``use_qk_norm`` (GLM-4.5), NeoX
RoPE on the first half of each head (``partial_rotary_factor`` 0.5), and DeepSeek-V3's
mixture (:class:`~modelc.formats.ir.Routing`: sigmoid scores plus the correction bias for
the choice, renormalised, times ``routed_scaling_factor``, one shared expert, the first
``first_k_dense_replace`` layers dense).

Tensors as llama.cpp's ``convert_hf_to_gguf.py`` writes them for ``glm4moe``: the pre-FFN
norm is ``blk.{i}.post_attention_norm`` (HF's ``post_attention_layernorm``), no Q/K
permutation; ``rope.dimension_count`` is the rotated part.  The multi-token-prediction
layers (past ``num_hidden_layers``) are not run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import gguf

from modelc.families.contract import DecoderTraits, Family, GGUFMeta
from modelc.families.deepseek2 import gguf_routing, hf_routing
from modelc.families.llama import LLAMA_REQUIRED, gguf_hparams, llama_shapes
from modelc.families.qwen2 import neox_config
from modelc.formats.ir import HParams, Tensor


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    hp = neox_config(cfg)
    rs = cfg.get("rope_parameters") or {}
    factor = float(cfg.get("partial_rotary_factor") or rs.get("partial_rotary_factor") or 0.5)
    hp.rope_dim = int(hp.head_dim * factor)
    hp.n_expert = int(cfg.get("n_routed_experts") or 0)
    hp.n_expert_used = int(cfg.get("num_experts_per_tok") or 0)
    hp.routing = hf_routing(cfg, "sigmoid") if hp.n_expert else None
    return hp


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    gguf_hparams(m, hp, tensors, meta)
    hp.rope_style = "neox"
    hp.rope_dim = int(m("rope.dimension_count", 0))
    if hp.n_expert:
        hp.routing = gguf_routing(m, default_gating=2)


def _rename(name: str) -> str:
    return name.replace("e_score_correction_bias", "e_score_correction.bias")


FAMILY = Family(
    name="glm4moe",
    kind="text",
    decoder=DecoderTraits(ffn_norm="post_attention_norm", default_ctx=4096),
    gguf_arch=gguf.MODEL_ARCH.GLM4_MOE,
    gguf_names=("glm4moe",),
    hf_classes=("Glm4MoeForCausalLM",),
    model_types=("glm4_moe",),
    drop=re.compile(r"rotary_emb\.inv_freq$"),
    from_config=_from_config,
    from_gguf=_from_gguf,
    rename=_rename,
    required=(*LLAMA_REQUIRED, "post_attention_norm.weight"),
    output_required=True,
    shapes=llama_shapes,
)
