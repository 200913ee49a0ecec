"""Mistral 3 / Ministral 3 (text): LLaMA with YaRN and Llama 4's attention temperature.

``Ministral3ForCausalLM`` (``model_type`` ``ministral3``): ``rope_parameters`` of type
``yarn`` with ``mscale`` / ``mscale_all_dim`` (the cos/sin factor is their ratio) and
``llama_4_scaling_beta``: queries past ``original_max_position_embeddings`` are scaled by
``1 + beta * ln(1 + floor(pos / original))``.  GGUF (``mistral3``, as
``convert_hf_to_gguf.py``'s ``Ministral3Model``, a ``LlamaModel``, writes it): Q/K rows
permuted to interleaved pairs, ``rope.scaling.yarn_log_multiplier`` = ``mscale_all_dim`` (llama.cpp
takes ``mscale`` as 1) and ``attention.temperature_scale`` = beta.  The vision model's HF
directory (``Mistral3ForConditionalGeneration``, Mistral Small 3.1: ``text_config`` over
the top level, ``language_model.`` weights) loads its text model, the vision tower left
to the ``--mmproj`` file (``pixtral``, :mod:`modelc.vision.pixtral`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import gguf

from modelc.errors import UnsupportedError
from modelc.families.contract import DecoderTraits, Family, GGUFMeta, yarn_mscale
from modelc.families.llama import FAMILY as LLAMA
from modelc.families.llama import gguf_hparams
from modelc.formats.ir import HParams, Tensor


def _from_config(config: Mapping[str, Any]) -> HParams:
    cfg = {**config, **(config.get("text_config") or {})}
    assert LLAMA.from_config is not None
    hp = LLAMA.from_config(cfg)
    params = cfg.get("rope_parameters") or {}
    hp.attn_temp_scale = float(params.get("llama_4_scaling_beta") or 0.0)
    hp.attn_temp_floor = int(params.get("original_max_position_embeddings") or 0)
    return hp


def _rename(name: str) -> str:
    """A Mistral3ForConditionalGeneration's text weights under a causal LM's names."""
    return re.sub(r"^language_model\.", "", re.sub(r"^model\.language_model\.", "model.", name))


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    gguf_hparams(m, hp, tensors, meta)
    rs = hp.rope_scaling
    log_mul = float(m("rope.scaling.yarn_log_multiplier", 0.0))
    if rs.type == "yarn" and log_mul:  # llama.cpp's rule: mscale 1
        rs.attn_factor = yarn_mscale(rs.factor) / yarn_mscale(rs.factor, log_mul)
    hp.attn_temp_scale = float(m("attention.temperature_scale", 0.0))
    hp.attn_temp_floor = rs.original_max_position
    if hp.attn_temp_scale and not hp.attn_temp_floor:
        raise UnsupportedError(
            "mistral3 GGUF with an attention temperature but no "
            "rope.scaling.original_context_length is not supported"
        )


FAMILY = Family(
    name="mistral3",
    kind="text",
    decoder=DecoderTraits(),
    gguf_arch=gguf.MODEL_ARCH.MISTRAL3,
    gguf_names=("mistral3",),
    hf_classes=("Ministral3ForCausalLM", "Mistral3ForConditionalGeneration"),
    model_types=("ministral3", "mistral3"),
    drop=re.compile(r"rotary_emb\.inv_freq$|vision_tower\.|multi_modal_projector\."),
    rename=_rename,
    from_config=_from_config,
    from_gguf=_from_gguf,
    transform=LLAMA.transform,
    required=LLAMA.required,
    output_required=True,
    shapes=LLAMA.shapes,
    lora_slots=LLAMA.lora_slots,
    lora_modules=LLAMA.lora_modules,
    lora_permute_qk=True,
)
