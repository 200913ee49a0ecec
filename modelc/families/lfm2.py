"""LFM2 (Liquid AI, GGUF ``lfm2``): short-convolution layers and GQA attention layers.

A convolution layer (:mod:`modelc.runtime.arch.shortconv`) keeps per sequence the last
``conv_L_cache - 1`` gated inputs instead of keys and values; an attention layer is
Qwen3's (per-head Q/K norms before NeoX RoPE).  Every layer's FFN is a SwiGLU; the norm
before a layer is ``operator_norm`` (GGUF ``attn_norm``), the final one HF's
``embedding_norm``, which the converter names ``token_embd_norm``; the head is tied to the
embeddings (``tie_embedding``).  LFM2-VL's text model is this one (the HF directory of
an ``Lfm2VlForConditionalGeneration``: its ``text_config``, the ``model.language_model.``
weights; the vision tower and projector are the ``--mmproj`` file's,
:mod:`modelc.vision.lfm2vl`).

Tensors as llama.cpp's ``convert_hf_to_gguf.py`` writes them (``LFM2Model``):
``shortconv.in_proj`` / ``shortconv.conv`` (channels, width) / ``shortconv.out_proj`` on
the convolution layers, HF's Q/K rows unpermuted; ``head_count_kv`` per layer, 0 on the
convolution layers; ``feed_forward_length`` the FFN width as adjusted
(``block_auto_adjust_ff_dim``).  LFM2-MoE is :mod:`modelc.families.lfm2moe`; the
bidirectional / ColBERT models are not read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import gguf
import numpy as np

from modelc.errors import UnsupportedError
from modelc.families.contract import DecoderTraits, Family, GGUFMeta
from modelc.families.qwen2 import neox_config, neox_gguf
from modelc.formats.ir import HParams, Tensor


def _ff_dim(cfg: Mapping[str, Any]) -> int:
    """The FFN width as transformers' ``Lfm2MLP`` and the converter compute it."""
    ff = int(cfg.get("block_ff_dim") or cfg["intermediate_size"])
    if not cfg.get("block_auto_adjust_ff_dim", True):
        return ff
    ff = int(2 * ff / 3)
    mult = cfg.get("block_ffn_dim_multiplier", 1.0)
    if mult is None:  # transformers rounds only with a multiplier; so does the release
        return ff
    ff = int(float(mult) * ff)
    of = int(cfg.get("block_multiple_of", 256))
    return of * ((ff + of - 1) // of)


def lfm2_config(cfg: Mapping[str, Any]) -> HParams:
    text = cfg.get("text_config")
    cfg = {**cfg, **text} if isinstance(text, Mapping) else cfg
    if cfg.get("conv_bias"):
        raise UnsupportedError(
            "this LFM2 config has biases in its convolution layers (conv_bias); llama.cpp's "
            "GGUF (and modelc) have none"
        )
    ff = _ff_dim(cfg)
    hp = neox_config({**cfg, "intermediate_size": ff})
    hp.norm_eps = float(cfg.get("norm_eps", 1e-5))
    hp.tie_embeddings = bool(cfg.get("tie_embedding", cfg.get("tie_word_embeddings", True)))
    n = hp.n_layer
    types = cfg.get("layer_types") or [
        "full_attention" if i in (cfg.get("full_attn_idxs") or range(n)) else "conv"
        for i in range(n)
    ]
    hp.recurrent_layers = [i for i, t in enumerate(types) if t == "conv"]
    hp.ssm_conv = int(cfg.get("conv_L_cache", 3))
    return hp


def recurrent_from_kv_heads(m: GGUFMeta, hp: HParams) -> None:
    """A hybrid's ``head_count_kv`` per layer (llama.cpp: 0 on a recurrent layer): the
    recurrent layers, and the attention layers' KV heads."""
    kv = m("attention.head_count_kv", hp.n_head)
    heads = [int(k) for k in kv] if isinstance(kv, list) else [int(kv)] * hp.n_layer
    hp.n_head_kv = max(heads) or hp.n_head
    hp.recurrent_layers = [i for i, k in enumerate(heads[: hp.n_layer]) if k == 0]


def lfm2_gguf(m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Any) -> None:
    neox_gguf(m, hp, tensors, meta)
    recurrent_from_kv_heads(m, hp)
    hp.ssm_conv = int(m("shortconv.l_cache", 0))
    if hp.sliding_window:  # on the attention layers only (llama.cpp's LFM2 with SWA)
        hp.window_layers = [i for i in range(hp.n_layer) if i not in hp.recurrent_layers]


def lfm2_transform(src: str, name: str, t: Tensor, hp: HParams) -> Tensor:
    if not name.endswith(".shortconv.conv.weight"):
        return Tensor(name, t.dtype, t.shape, t.loader)
    shape = (t.shape[0], t.shape[-1])  # (channels, 1, width) -> (channels, width)

    def load() -> np.ndarray[Any, Any]:
        return np.ascontiguousarray(np.asarray(t.data()).reshape(shape))

    return Tensor(name, t.dtype, shape, load)


FAMILY = Family(
    name="lfm2",
    kind="text",
    decoder=DecoderTraits(short_conv=True, output_norm="token_embd_norm", default_ctx=4096),
    gguf_arch=gguf.MODEL_ARCH.LFM2,
    gguf_names=("lfm2",),
    hf_classes=("Lfm2ForCausalLM", "LFM2ForCausalLM", "Lfm2VlForConditionalGeneration"),
    model_types=("lfm2", "lfm2_vl"),
    drop=re.compile(r"^model\.(vision_tower|multi_modal_projector)\.|^lm_head\.weight$"),
    rename=lambda name: name.replace("model.language_model.", "model.", 1),
    from_config=lfm2_config,
    from_gguf=lfm2_gguf,
    transform=lfm2_transform,
    required=("attn_norm.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight"),
)
