"""Nomic BERT (nomic-embed-text v1 / v1.5; llama.cpp's ``nomic-bert``): how modelc
recognises and configures the family.

A BERT with rotary positions (NeoX halves, the base ``nomic-bert.rope.freq_base``) where
BERT has a position table, Q, K and V in one matrix (``attn_qkv``), a SwiGLU MLP
(``ffn_gate`` the SiLU side, ``ffn_up`` the linear one) and no biases; post-norm blocks,
token types and pooling as BERT's.  From GGUF only: the Hugging Face checkpoint needs its
own remote code.  The forward is :class:`modelc.runtime.arch.nomic_bert.NomicBert`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import gguf

from modelc.errors import UnsupportedError
from modelc.families.bert import POOLING_TYPES
from modelc.families.contract import Family, GGUFMeta
from modelc.formats.ir import HParams, Tensor


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    raise UnsupportedError(
        "a nomic-bert Hugging Face directory is not supported (its modeling code is the "
        "model's own remote code); use the model's GGUF (e.g. nomic-embed-text's)"
    )


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    hp.norm_eps = float(m("attention.layer_norm_epsilon", 1e-12))
    hp.rope_theta = float(m("rope.freq_base", 1000.0))
    hp.rope_style = "neox"  # llama.cpp: LLAMA_ROPE_TYPE_NEOX for nomic-bert
    hp.activation = "silu"
    n_types = meta.get("tokenizer.ggml.token_type_count")
    if n_types is None and "token_types.weight" in tensors:
        n_types = tensors["token_types.weight"].shape[0]
    hp.n_token_types = int(n_types or 0)
    hp.pooling = POOLING_TYPES.get(int(m("pooling_type", 1)), "mean")
    hp.normalize_embeddings = True


FAMILY = Family(
    name="nomic-bert",
    kind="embed",
    runtime="modelc.runtime.arch.nomic_bert:NomicBert",
    gguf_arch=gguf.MODEL_ARCH.NOMIC_BERT,
    gguf_names=("nomic-bert",),
    hf_classes=("NomicBertModel",),
    model_types=("nomic_bert",),
    signature=re.compile(r"(^|\.)encoder\.layers\.\d+\.attn\.Wqkv\.weight$"),
    from_config=_from_config,
    from_shapes=lambda names, shapes: _from_config({}),
    from_gguf=_from_gguf,
    required=(
        "attn_qkv.weight",
        "attn_output.weight",
        "attn_output_norm.weight",
        "ffn_up.weight",
        "ffn_gate.weight",
        "ffn_down.weight",
        "layer_output_norm.weight",
    ),
    shapes=lambda hp: {
        "blk.0.attn_qkv.weight": (3 * hp.n_embd, hp.n_embd),
        "blk.0.ffn_up.weight": (hp.n_ff, hp.n_embd),
        "blk.0.ffn_gate.weight": (hp.n_ff, hp.n_embd),
    },
)
