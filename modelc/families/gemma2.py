"""Gemma 2: how modelc recognises, configures and maps the family (and what Gemma 3
shares of it).

Tensors as llama.cpp's ``convert_hf_to_gguf.py`` writes them: HF's RMSNorm multiplies by
``1 + w``, GGUF stores ``w + 1`` (every ``*norm.weight``, Q/K norms too), so an HF
directory's norm weights get the 1 added when loaded.  ``pre_feedforward_layernorm`` is
``ffn_norm``, ``post_attention_layernorm`` ``post_attention_norm`` and
``post_feedforward_layernorm`` ``post_ffw_norm``.  GGUF has no key for
``query_pre_attn_scalar``: as llama.cpp, the 27B sizes (gemma2 46 layers, gemma3 62) use
``n_embd / n_head``, the others ``head_dim``.  Windowed layers: ``layer_types`` of
``config.json``, else every layer but each ``pattern``-th (2 for gemma2, 6 for gemma3,
llama.cpp's ``set_swa_pattern``).  The forward is the one decoder
(:class:`modelc.runtime.arch.decoder.Decoder`) with :data:`GEMMA_DECODER`'s traits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import gguf
import numpy as np

from modelc.families.contract import (
    DecoderTraits,
    Family,
    GGUFMeta,
    activation,
    hf_rope,
    renamed,
)
from modelc.families.llama import HF_LLAMA_MODULES, LLAMA_LORA_SLOTS
from modelc.formats.ir import HParams, Tensor

_NORM = re.compile(r"norm\.weight$")


def add_one_to_norms(src: str, name: str, t: Tensor, hp: HParams) -> Tensor:
    """HF Gemma's RMSNorm multiplies by ``1 + w``; GGUF stores ``w + 1`` (convert_hf_to_gguf)."""
    if not _NORM.search(name):
        return renamed(t, name)

    def load() -> np.ndarray[Any, Any]:
        return np.asarray(t.data(), np.float32) + np.float32(1.0)

    return Tensor(name, t.dtype, t.shape, load)


def windowed_layers(cfg: Mapping[str, Any], n_layer: int, pattern: int) -> list[int]:
    """The windowed layers: ``layer_types`` where config.json lists them, else every layer
    but each ``pattern``-th (transformers' default, llama.cpp's ``set_swa_pattern``)."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n_layer:
        return [i for i, t in enumerate(types) if t == "sliding_attention"]
    pattern = int(cfg.get("sliding_window_pattern") or pattern)
    return [i for i in range(n_layer) if (i + 1) % pattern]


def gemma_config(cfg: Mapping[str, Any], pattern: int) -> HParams:
    """What gemma2 and gemma3 read alike from config.json."""
    n_embd = int(cfg["hidden_size"])
    n_head = int(cfg["num_attention_heads"])
    n_layer = int(cfg["num_hidden_layers"])
    head_dim = int(cfg.get("head_dim") or n_embd // n_head)
    window = int(cfg.get("sliding_window") or 0)
    layers = windowed_layers(cfg, n_layer, pattern) if window else []
    return HParams(
        n_vocab=int(cfg["vocab_size"]),
        n_ctx=int(cfg.get("max_position_embeddings", 8192)),
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=int(cfg.get("num_key_value_heads") or n_head),
        n_ff=int(cfg["intermediate_size"]),
        head_dim=head_dim,
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_style="neox",
        tie_embeddings=True,
        sliding_window=window if layers else 0,
        window_layers=layers if len(layers) < n_layer else [],
        attn_scale=float(cfg.get("query_pre_attn_scalar") or head_dim) ** -0.5,
        attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
        final_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
        activation=activation(
            str(cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh")
        ),
    )


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    hp = gemma_config(cfg, 2)
    hp.rope_theta, hp.rope_scaling = hf_rope(cfg)
    return hp


def gemma_gguf(m: GGUFMeta, hp: HParams, pattern: int, n_layer_27b: int, softcap: bool) -> None:
    """What gemma2 and gemma3 read alike from GGUF (llama.cpp's hyper-parameters)."""
    hp.norm_eps = float(m("attention.layer_norm_rms_epsilon", 1e-6))
    hp.rope_theta = float(m("rope.freq_base", 10000.0))
    hp.rope_style = "neox"
    hp.activation = "gelu_tanh"
    hp.tie_embeddings = True
    hp.sliding_window = int(m("attention.sliding_window", 0))
    if hp.sliding_window:
        hp.window_layers = [i for i in range(hp.n_layer) if (i + 1) % pattern]
    big = hp.n_layer == n_layer_27b
    hp.attn_scale = (hp.n_embd / hp.n_head if big else hp.head_dim) ** -0.5
    hp.final_softcap = float(m("final_logit_softcapping", 0.0))
    if softcap:
        hp.attn_softcap = float(m("attn_logit_softcapping", 0.0))


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    gemma_gguf(m, hp, 2, 46, softcap=True)


# Gemma's layers: GELU (tanh), norms after attention and FFN, embeddings scaled by sqrt(d)
GEMMA_DECODER = DecoderTraits(act="gelu_tanh", post_norms=True, embd_scale=True, default_ctx=8192)

GEMMA_REQUIRED = (
    "attn_norm.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "post_attention_norm.weight",
    "ffn_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
    "post_ffw_norm.weight",
)


def gemma_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    return {
        "blk.0.attn_q.weight": (hp.n_head * hp.head_dim, hp.n_embd),
        "blk.0.attn_k.weight": (hp.n_head_kv * hp.head_dim, hp.n_embd),
        "blk.0.ffn_gate.weight": (hp.n_ff, hp.n_embd),
    }


FAMILY = Family(
    name="gemma2",
    kind="text",
    decoder=GEMMA_DECODER,
    gguf_arch=gguf.MODEL_ARCH.GEMMA2,
    gguf_names=("gemma2",),
    hf_classes=("Gemma2ForCausalLM", "Gemma2Model"),
    model_types=("gemma2",),
    drop=re.compile(r"rotary_emb\.inv_freq$|^lm_head\.weight$"),
    from_config=_from_config,
    from_gguf=_from_gguf,
    transform=add_one_to_norms,
    required=GEMMA_REQUIRED,
    shapes=gemma_shapes,
    lora_slots=LLAMA_LORA_SLOTS,
    lora_modules=HF_LLAMA_MODULES,
)
