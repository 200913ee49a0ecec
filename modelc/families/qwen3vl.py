"""Qwen3-VL (text): Qwen3's forward (per-head Q/K norms, NeoX RoPE) with interleaved
M-RoPE (:mod:`modelc.runtime.arch.mrope`) and DeepStack (:mod:`modelc.runtime.arch.deepstack`:
the vision tower's intermediate features added to image positions after the first
``n_deepstack`` layers).  A prompt without images runs as Qwen3.

GGUF (``qwen3vl``, as ``convert_hf_to_gguf.py``'s ``Qwen3VLTextModel`` writes it): Qwen3's
tensors and keys plus ``qwen3vl.rope.dimension_sections`` (t/h/w, padded to four with 0)
and ``qwen3vl.n_deepstack_layers``.  The HF directory of a
``Qwen3VLForConditionalGeneration`` (``text_config``; ``model.language_model.`` weights, the
``model.visual.`` ones left to the ``--mmproj`` file) loads too.  Qwen3-VL-MoE:
:mod:`modelc.families.qwen3vlmoe`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import gguf

from modelc.families.contract import DecoderTraits, Family, GGUFMeta
from modelc.families.qwen2vl import mrope_config, mrope_gguf
from modelc.families.qwen3 import FAMILY as QWEN3
from modelc.formats.ir import HParams, Tensor


def qwen3vl_config(config: Mapping[str, Any]) -> HParams:
    hp = mrope_config(config)
    vision = config.get("vision_config") or {}
    hp.n_deepstack = len(vision.get("deepstack_visual_indexes") or ())
    return hp


def qwen3vl_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    mrope_gguf(m, hp, tensors, meta)
    hp.rope_interleaved = True  # llama.cpp's LLAMA_ROPE_TYPE_IMROPE for qwen3vl
    hp.n_deepstack = int(m("n_deepstack_layers", 0))


def _rename(name: str) -> str:
    return re.sub(r"^model\.language_model\.", "model.", name)


FAMILY = Family(
    name="qwen3vl",
    kind="text",
    decoder=DecoderTraits(),
    gguf_arch=gguf.MODEL_ARCH.QWEN3VL,
    gguf_names=("qwen3vl",),
    hf_classes=("Qwen3VLForConditionalGeneration",),
    model_types=("qwen3_vl",),
    drop=re.compile(r"rotary_emb\.inv_freq$|^(model\.)?visual\."),
    rename=_rename,
    from_config=qwen3vl_config,
    from_gguf=qwen3vl_gguf,
    required=QWEN3.required,
    output_required=True,
    shapes=QWEN3.shapes,
    lora_slots=QWEN3.lora_slots,
    lora_modules=QWEN3.lora_modules,
)
