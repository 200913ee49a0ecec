"""BERT (embeddings): how modelc recognises, configures and maps the family.

The forward is :class:`modelc.runtime.arch.bert.Bert`; the pooler keeps as
``pooler.weight`` / ``pooler.bias`` (GGUF has no name for it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import gguf

from modelc.errors import UnsupportedError
from modelc.families.contract import (
    Family,
    GGUFMeta,
    Shapes,
    activation,
    find_shape,
    guess_heads,
    n_blocks,
)
from modelc.formats.ir import HParams, Tensor

# llama.cpp's enum llama_pooling_type (bert.pooling_type)
POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise UnsupportedError(
            f"BERT position_embedding_type {cfg['position_embedding_type']!r} is not supported (absolute)"
        )
    n_embd = int(cfg["hidden_size"])
    n_head = int(cfg["num_attention_heads"])
    return HParams(
        n_vocab=int(cfg["vocab_size"]),
        n_ctx=int(cfg.get("max_position_embeddings", 512)),
        n_embd=n_embd,
        n_layer=int(cfg["num_hidden_layers"]),
        n_head=n_head,
        n_head_kv=n_head,
        n_ff=int(cfg["intermediate_size"]),
        head_dim=n_embd // n_head,
        norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
        activation=activation(str(cfg.get("hidden_act", "gelu"))),
        n_token_types=int(cfg.get("type_vocab_size", 2)),
        pooling="cls",
    )


def _from_shapes(names: Sequence[str], shapes: Shapes) -> HParams:
    n_vocab, n_embd = find_shape(shapes, "embeddings.word_embeddings.weight")
    n_head = guess_heads(int(n_embd))
    return HParams(
        n_vocab=int(n_vocab),
        n_ctx=int(find_shape(shapes, "embeddings.position_embeddings.weight")[0]),
        n_embd=int(n_embd),
        n_layer=n_blocks(names, r"(?:^|\.)layer\.(\d+)\."),
        n_head=n_head,
        n_head_kv=n_head,
        n_ff=int(find_shape(shapes, ".intermediate.dense.weight")[0]),
        head_dim=int(n_embd) // n_head,
        norm_eps=1e-12,
        activation="gelu",
        n_token_types=int(find_shape(shapes, "embeddings.token_type_embeddings.weight")[0]),
        pooling="cls",
    )


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    hp.norm_eps = float(m("attention.layer_norm_epsilon", 1e-12))
    hp.activation = "gelu"
    n_types = meta.get("tokenizer.ggml.token_type_count")
    if n_types is None and "token_types.weight" in tensors:
        n_types = tensors["token_types.weight"].shape[0]
    hp.n_token_types = int(n_types or 0)
    hp.pooling = POOLING_TYPES.get(int(m("pooling_type", 1)), "mean")
    hp.normalize_embeddings = True


def _rename(name: str) -> str:
    name = name.removeprefix("bert.")
    name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
    return re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)


FAMILY = Family(
    name="bert",
    kind="embed",
    runtime="modelc.runtime.arch.bert:Bert",
    gguf_arch=gguf.MODEL_ARCH.BERT,
    gguf_names=("bert",),
    hf_classes=("BertModel", "BertForMaskedLM"),
    model_types=("bert",),
    signature=re.compile(r"(^|\.)encoder\.layer\.\d+\.attention\.self\.query\.weight$"),
    drop=re.compile(r"(^|\.)position_ids$|^cls\."),
    from_config=_from_config,
    from_shapes=_from_shapes,
    from_gguf=_from_gguf,
    rename=_rename,
    # GGUF has no name for the pooler: it keeps as pooler.weight / pooler.bias
    own_names={"pooler.dense.weight": "pooler.weight", "pooler.dense.bias": "pooler.bias"},
    required=(
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
        "ffn_up.weight",
    ),
    shapes=lambda hp: {
        "blk.0.attn_q.weight": (hp.n_embd, hp.n_embd),
        "blk.0.ffn_up.weight": (hp.n_ff, hp.n_embd),
    },
    lora_modules=re.compile(r"(^|\.)encoder\.layer\.\d+\."),
)
