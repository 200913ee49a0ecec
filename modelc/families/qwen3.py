"""Qwen3 (dense): the LLaMA forward with NeoX RoPE, no QKV bias, and a per-head RMSNorm
of Q and K before RoPE (``blk.{i}.attn_q_norm`` / ``attn_k_norm``, shape ``(head_dim,)``).

``head_dim`` is its own hyper-parameter (``config.json`` ``head_dim``, GGUF
``qwen3.attention.key_length``), not ``n_embd / n_head``.  Tensors as
``convert_hf_to_gguf.py`` writes them for ``qwen3``: no Q/K permutation.
"""

from __future__ import annotations

import gguf

from modelc.families.contract import DecoderTraits, Family
from modelc.families.llama import FAMILY as LLAMA
from modelc.families.llama import (
    HF_LLAMA_MODULES,
    LLAMA_LORA_SLOTS,
    LLAMA_REQUIRED,
    llama_shapes,
)
from modelc.families.qwen2 import neox_config, neox_gguf

FAMILY = Family(
    name="qwen3",
    kind="text",
    decoder=DecoderTraits(),
    gguf_arch=gguf.MODEL_ARCH.QWEN3,
    gguf_names=("qwen3",),
    hf_classes=("Qwen3ForCausalLM", "Qwen3Model"),
    model_types=("qwen3",),
    drop=LLAMA.drop,
    from_config=neox_config,
    from_gguf=neox_gguf,
    required=(*LLAMA_REQUIRED, "attn_q_norm.weight", "attn_k_norm.weight"),
    output_required=True,
    shapes=llama_shapes,
    lora_slots=LLAMA_LORA_SLOTS,
    lora_modules=HF_LLAMA_MODULES,
)
