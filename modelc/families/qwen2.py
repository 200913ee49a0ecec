"""Qwen2 / Qwen2.5 (dense): the LLaMA forward with Q/K/V biases and NeoX (rotate-half) RoPE.

Tensors as llama.cpp's ``convert_hf_to_gguf.py`` writes them for ``qwen2``: LLaMA's names
plus ``blk.{i}.attn_{q,k,v}.bias``; Q/K rows are **not** permuted (llama.cpp runs qwen2
with ``LLAMA_ROPE_TYPE_NEOX``), so HF and GGUF tensors are the same arrays.  The head is
tied to the embeddings when there is no ``output.weight`` (the small models).  Qwen2's
``sliding_window`` is off unless ``use_sliding_window`` says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gguf

from modelc.families.contract import DecoderTraits, Family, GGUFMeta
from modelc.families.llama import FAMILY as LLAMA
from modelc.families.llama import (
    HF_LLAMA_MODULES,
    LLAMA_LORA_SLOTS,
    LLAMA_REQUIRED,
    gguf_hparams,
    llama_shapes,
)
from modelc.formats.ir import HParams, Tensor


def neox_config(cfg: Mapping[str, Any]) -> HParams:
    """LLaMA's config reading, with NeoX RoPE (qwen2, qwen3)."""
    assert LLAMA.from_config is not None
    hp = LLAMA.from_config(cfg)
    hp.rope_style = "neox"
    return hp


def neox_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    gguf_hparams(m, hp, tensors, meta)
    hp.rope_style = "neox"


FAMILY = Family(
    name="qwen2",
    kind="text",
    decoder=DecoderTraits(),
    gguf_arch=gguf.MODEL_ARCH.QWEN2,
    gguf_names=("qwen2",),
    hf_classes=("Qwen2ForCausalLM", "Qwen2Model"),
    model_types=("qwen2",),
    drop=LLAMA.drop,
    from_config=neox_config,
    from_gguf=neox_gguf,
    required=(*LLAMA_REQUIRED, "attn_q.bias", "attn_k.bias", "attn_v.bias"),
    output_required=True,
    shapes=llama_shapes,
    lora_slots=LLAMA_LORA_SLOTS,
    lora_modules=HF_LLAMA_MODULES,
)
