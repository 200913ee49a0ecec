"""OLMo 2: LLaMA's layer with post-norms only and Q/K norms over the whole projection.

A layer is ``x += post_attention_norm(attn(x)); x += post_ffw_norm(ffn(x))`` (no norm of
the input), and Q and K are RMS-normed over all heads at once (``blk.{i}.attn_q_norm`` of
``n_head * head_dim``, ``attn_k_norm`` of ``n_head_kv * head_dim``) before NeoX RoPE.
Tensors as ``convert_hf_to_gguf.py``'s ``Olmo2Model`` writes them: HF's rows unpermuted,
``post_attention_layernorm`` / ``post_feedforward_layernorm`` as ``post_attention_norm`` /
``post_ffw_norm``.  OLMo 3 (the same GGUF architecture with sliding windows) is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gguf

from modelc.errors import UnsupportedError
from modelc.families.contract import DecoderTraits, Family, GGUFMeta
from modelc.families.llama import FAMILY as LLAMA
from modelc.families.llama import (
    HF_LLAMA_MODULES,
    LLAMA_LORA_SLOTS,
    LLAMA_REQUIRED,
    llama_shapes,
)
from modelc.families.qwen2 import neox_config, neox_gguf
from modelc.formats.ir import HParams, Tensor


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    neox_gguf(m, hp, tensors, meta)
    if hp.sliding_window:
        raise UnsupportedError("olmo2 with sliding windows (OLMo 3) is not supported yet")


def _shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    return {
        **llama_shapes(hp),
        "blk.0.attn_q_norm.weight": (hp.n_head * hp.head_dim,),
        "blk.0.attn_k_norm.weight": (hp.n_head_kv * hp.head_dim,),
    }


FAMILY = Family(
    name="olmo2",
    kind="text",
    decoder=DecoderTraits(post_norms=True, pre_norms=False),
    gguf_arch=gguf.MODEL_ARCH.OLMO2,
    gguf_names=("olmo2",),
    hf_classes=("Olmo2ForCausalLM",),
    model_types=("olmo2",),
    drop=LLAMA.drop,
    from_config=neox_config,
    from_gguf=_from_gguf,
    required=(
        *LLAMA_REQUIRED,
        "attn_q_norm.weight",
        "attn_k_norm.weight",
        "post_attention_norm.weight",
        "post_ffw_norm.weight",
    ),
    output_required=True,
    shapes=_shapes,
    lora_slots=LLAMA_LORA_SLOTS,
    lora_modules=HF_LLAMA_MODULES,
)
