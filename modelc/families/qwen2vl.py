"""Qwen2-VL / Qwen2.5-VL (text): Qwen2's forward with M-RoPE (:mod:`modelc.runtime.arch.mrope`).

Each head's rotary pairs are cut into three sections (``mrope_section``, e.g. 16/24/24 of
64 pairs) rotating by a token's temporal, height and width positions; a text token's three
positions are equal, so a prompt without images runs as Qwen2.  GGUF (``qwen2vl``, as
``convert_hf_to_gguf.py``'s ``Qwen2VLModel`` writes it): Qwen2's tensors and keys plus
``qwen2vl.rope.dimension_sections`` (the sections, padded to four with 0).  The HF
directory of a ``Qwen2_5_VLForConditionalGeneration`` (``text_config`` over the top level;
the ``visual.`` weights left to the ``--mmproj`` file) loads too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import gguf

from modelc.errors import UnsupportedError
from modelc.families.contract import DecoderTraits, Family, GGUFMeta
from modelc.families.qwen2 import FAMILY as QWEN2
from modelc.families.qwen2 import neox_config, neox_gguf
from modelc.formats.ir import HParams, Tensor


def sections(raw: Any) -> list[int]:
    """The t/h/w M-RoPE sections of a config or GGUF value (a fourth, if any, must be 0)."""
    if raw is not None and any(int(s) for s in list(raw)[3:]):
        raise UnsupportedError(f"M-RoPE with a fourth section {list(raw)!r} is not supported")
    secs = [int(s) for s in (raw or [])][:3]
    if len(secs) != 3 or min(secs) < 0:
        raise UnsupportedError(f"M-RoPE sections {raw!r}: three (t, h, w) are needed")
    return secs


def mrope_config(config: Mapping[str, Any]) -> HParams:
    """Qwen2's config reading of a VL model's ``text_config``, with its M-RoPE sections
    (``mrope_interleaved``: Qwen3-VL's layout)."""
    cfg = {**config, **(config.get("text_config") or {})}
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    secs = sections(params.pop("mrope_section", None))
    interleaved = bool(params.pop("mrope_interleaved", False))
    if params.get("rope_type") == "mrope" or params.get("type") == "mrope":
        params = {k: v for k, v in params.items() if k not in ("rope_type", "type")}
    hp = neox_config({**cfg, "rope_parameters": params, "rope_scaling": None})
    hp.rope_sections, hp.rope_interleaved = secs, interleaved
    return hp


def mrope_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    neox_gguf(m, hp, tensors, meta)
    hp.rope_sections = sections(m("rope.dimension_sections", None))


FAMILY = Family(
    name="qwen2vl",
    kind="text",
    decoder=DecoderTraits(),
    gguf_arch=gguf.MODEL_ARCH.QWEN2VL,
    gguf_names=("qwen2vl",),
    hf_classes=("Qwen2_5_VLForConditionalGeneration", "Qwen2VLForConditionalGeneration"),
    model_types=("qwen2_5_vl", "qwen2_vl"),
    drop=re.compile(r"rotary_emb\.inv_freq$|^(model\.)?visual\."),
    from_config=mrope_config,
    from_gguf=mrope_gguf,
    required=QWEN2.required,
    output_required=True,
    shapes=QWEN2.shapes,
    lora_slots=QWEN2.lora_slots,
    lora_modules=QWEN2.lora_modules,
)
