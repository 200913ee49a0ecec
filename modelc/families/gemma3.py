"""Gemma 3 (text, dense): Gemma 2's traits (the one decoder) with per-head Q/K RMSNorms
(``blk.{i}.attn_q_norm`` / ``attn_k_norm``, stored ``w + 1`` like every Gemma norm), no
attention soft-capping, and five windowed layers to one global (layer 5, 11, ...).

RoPE: global layers rotate with ``rope_theta`` (1e6) and the config's scaling (linear x8
on the 4B and larger), windowed layers with ``rope_local_base_freq`` (10000) unscaled:
transformers 5's ``rope_parameters`` per layer type (``full_attention`` /
``sliding_attention``) or the older ``rope_theta`` / ``rope_scaling`` /
``rope_local_base_freq`` keys; in GGUF ``gemma3.rope.freq_base`` and the scaling keys are
the global layers', the windowed layers' base is 10000 as llama.cpp has it.  The text
model of a ``Gemma3ForConditionalGeneration`` checkpoint is read too (its
``text_config``; the vision tower is left out).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import gguf

from modelc.families.contract import Family, GGUFMeta, gguf_rope, hf_rope
from modelc.families.gemma2 import (
    GEMMA_DECODER,
    GEMMA_REQUIRED,
    add_one_to_norms,
    gemma_config,
    gemma_gguf,
    gemma_shapes,
)
from modelc.families.llama import HF_LLAMA_MODULES, LLAMA_LORA_SLOTS
from modelc.formats.ir import HParams, Tensor

LOCAL_THETA = 10000.0


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    text = cfg.get("text_config")
    cfg = {**cfg, **text} if isinstance(text, Mapping) else cfg
    hp = gemma_config(cfg, 6)
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping) and isinstance(params.get("full_attention"), Mapping):
        glob, loc = params["full_attention"], params.get("sliding_attention") or {}
        hp.rope_theta, hp.rope_scaling = hf_rope({"rope_parameters": glob})
        hp.rope_theta_local = float(loc.get("rope_theta") or LOCAL_THETA)
        if "rope_theta" not in glob:
            hp.rope_theta = 1_000_000.0
    else:
        hp.rope_theta, hp.rope_scaling = hf_rope(
            {**cfg, "rope_theta": cfg.get("rope_theta") or 1_000_000.0}
        )
        hp.rope_theta_local = float(cfg.get("rope_local_base_freq") or LOCAL_THETA)
    return hp


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    gemma_gguf(m, hp, 6, 62, softcap=False)
    hp.rope_theta = float(m("rope.freq_base", 1_000_000.0))
    hp.rope_scaling = gguf_rope(m)
    hp.rope_theta_local = LOCAL_THETA


def _rename(name: str) -> str:
    """A Gemma3ForConditionalGeneration's text weights under Gemma3ForCausalLM's names."""
    return re.sub(r"^(model\.)?language_model\.(model\.)?", "model.", name)


FAMILY = Family(
    name="gemma3",
    kind="text",
    decoder=GEMMA_DECODER,
    gguf_arch=gguf.MODEL_ARCH.GEMMA3,
    gguf_names=("gemma3",),
    hf_classes=("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
    model_types=("gemma3_text", "gemma3"),
    drop=re.compile(r"rotary_emb\.inv_freq$|^lm_head\.weight$|vision_tower|multi_modal_projector"),
    from_config=_from_config,
    from_gguf=_from_gguf,
    rename=_rename,
    transform=add_one_to_norms,
    required=(*GEMMA_REQUIRED, "attn_q_norm.weight", "attn_k_norm.weight"),
    shapes=gemma_shapes,
    lora_slots=LLAMA_LORA_SLOTS,
    lora_modules=HF_LLAMA_MODULES,
)
