"""OLMo 2: LLaMA's layer with post-norms only and Q/K norms over the whole projection.

A layer is ``x += post_attention_norm(attn(x)); x += post_ffw_norm(ffn(x))`` (no norm of
the input), and Q and K are RMS-normed over all heads at once (``blk.{i}.attn_q_norm`` of
``n_head * head_dim``, ``attn_k_norm`` of ``n_head_kv * head_dim``) before NeoX RoPE.
Tensors as ``convert_hf_to_gguf.py``'s ``Olmo2Model`` writes them: HF's rows unpermuted,
``post_attention_layernorm`` / ``post_feedforward_layernorm`` as ``post_attention_norm`` /
``post_ffw_norm``.

OLMo 3 (``Olmo3ForCausalLM``) is the same layer with a sliding window on most layers:
config.json's ``sliding_window`` on its ``layer_types``' ``"sliding_attention"`` layers
(transformers' default: all but every 4th), which the converter writes as the same
``olmo2`` GGUF architecture with ``olmo2.attention.sliding_window`` and a bool per layer in
``olmo2.attention.sliding_window_pattern`` (llama.cpp's default: every 4th layer full).
The releases' YaRN is on the full layers only: the windowed ones rotate unscaled
(``rope_theta_local``, the same base), as in transformers and llama.cpp.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gguf

from modelc.errors import UnsupportedError
from modelc.families.contract import DecoderTraits, Family, GGUFMeta, hf_rope
from modelc.families.gemma2 import windowed_layers
from modelc.families.llama import FAMILY as LLAMA
from modelc.families.llama import (
    HF_LLAMA_MODULES,
    LLAMA_LORA_SLOTS,
    LLAMA_REQUIRED,
    llama_shapes,
)
from modelc.families.qwen2 import neox_config, neox_gguf
from modelc.formats.ir import HParams, Tensor

FULL_EVERY = 4  # OLMo 3's default pattern: every 4th layer unwindowed


def _windows(hp: HParams, windowed: list[int], theta_swa: float) -> None:
    """The windowed layers (OLMo 3); none: no window at all (``[]`` would mean every
    layer).  They rotate without the full layers' RoPE scaling (YaRN), at the same base."""
    hp.window_layers = windowed
    if not windowed:
        hp.sliding_window = 0
        return
    if theta_swa != hp.rope_theta:
        raise UnsupportedError(
            f"OLMo 3 with a RoPE base of {theta_swa:g} on its windowed layers and "
            f"{hp.rope_theta:g} on its full layers is not supported yet"
        )
    if hp.rope_scaling.type != "none":
        hp.rope_theta_local = theta_swa


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    """OLMo 2's config, or OLMo 3's: its RoPE as transformers 4 writes it (``rope_theta``,
    ``rope_scaling``) or as transformers 5 does (``rope_parameters`` per layer type)."""
    hp = neox_config(cfg)
    params = cfg.get("rope_parameters")
    local: Mapping[str, Any] = {}
    if isinstance(params, Mapping) and isinstance(params.get("full_attention"), Mapping):
        hp.rope_theta, hp.rope_scaling = hf_rope({"rope_parameters": params["full_attention"]})
        local = params.get("sliding_attention") or {}
    if hp.sliding_window:
        theta = float(local.get("rope_theta") or hp.rope_theta)
        _windows(hp, windowed_layers(cfg, hp.n_layer, FULL_EVERY), theta)
    return hp


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    neox_gguf(m, hp, tensors, meta)
    if hp.sliding_window:
        pattern = m("attention.sliding_window_pattern", None)
        if not isinstance(pattern, list):
            pattern = [(i + 1) % FULL_EVERY != 0 for i in range(hp.n_layer)]
        theta = float(m("rope.freq_base_swa", hp.rope_theta))
        _windows(hp, [i for i, s in enumerate(pattern) if s], theta)


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
    hf_classes=("Olmo2ForCausalLM", "Olmo3ForCausalLM"),
    model_types=("olmo2", "olmo3"),
    drop=LLAMA.drop,
    from_config=_from_config,
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
