"""GPT-2: how modelc recognises, configures and maps the family.

The forward is :class:`modelc.runtime.arch.gpt2.GPT2`; HF's ``Conv1D`` weights (in, out)
are transposed to GGUF's (out, in) when loaded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import gguf

from modelc.families.contract import (
    Family,
    GGUFMeta,
    Shapes,
    activation,
    find_shape,
    guess_heads,
    n_blocks,
    renamed,
    transposed,
)
from modelc.formats.ir import HParams, Tensor

_CONV1D = re.compile(r"\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    n_embd = int(cfg["n_embd"])
    n_head = int(cfg["n_head"])
    return HParams(
        n_vocab=int(cfg["vocab_size"]),
        n_ctx=int(cfg.get("n_positions", cfg.get("n_ctx", 1024))),
        n_embd=n_embd,
        n_layer=int(cfg["n_layer"]),
        n_head=n_head,
        n_head_kv=n_head,
        n_ff=int(cfg.get("n_inner") or 4 * n_embd),
        head_dim=n_embd // n_head,
        norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)),
        activation=activation(str(cfg.get("activation_function", "gelu_new"))),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
    )


def _from_shapes(names: Sequence[str], shapes: Shapes) -> HParams:
    n_vocab, n_embd = find_shape(shapes, "wte.weight")
    n_head = guess_heads(int(n_embd))
    return HParams(
        n_vocab=int(n_vocab),
        n_ctx=int(find_shape(shapes, "wpe.weight")[0]),
        n_embd=int(n_embd),
        n_layer=n_blocks(names, r"(?:^|\.)h\.(\d+)\."),
        n_head=n_head,
        n_head_kv=n_head,
        n_ff=int(find_shape(shapes, ".mlp.c_fc.weight")[1]),
        head_dim=int(n_embd) // n_head,
        activation="gelu_tanh",
        tie_embeddings=not any(n.endswith("lm_head.weight") for n in names),
    )


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    hp.norm_eps = float(m("attention.layer_norm_epsilon", 1e-5))
    hp.activation = "gelu_tanh"


def _conv1d(src: str, name: str, t: Tensor, hp: HParams) -> Tensor:
    if _CONV1D.search(src) and len(t.shape) == 2:
        return transposed(t, name)  # Conv1D (in, out) -> (out, in)
    return renamed(t, name)


FAMILY = Family(
    name="gpt2",
    kind="text",
    runtime="modelc.runtime.arch.gpt2:GPT2",
    gguf_arch=gguf.MODEL_ARCH.GPT2,
    gguf_names=("gpt2",),
    hf_classes=("GPT2LMHeadModel", "GPT2Model"),
    model_types=("gpt2",),
    signature=re.compile(r"(^|\.)h\.\d+\.attn\.c_attn\.weight$"),
    drop=re.compile(r"\.attn\.(bias|masked_bias)$"),
    from_config=_from_config,
    from_shapes=_from_shapes,
    from_gguf=_from_gguf,
    transform=_conv1d,
    required=("attn_qkv.weight", "attn_output.weight", "ffn_up.weight", "ffn_down.weight"),
    shapes=lambda hp: {
        "blk.0.attn_qkv.weight": (3 * hp.n_embd, hp.n_embd),
        "blk.0.ffn_up.weight": (hp.n_ff, hp.n_embd),
    },
    lora_slots={"attn_qkv": "w_qkv", "attn_output": "wo", "ffn_up": "w_up", "ffn_down": "w_down"},
    lora_modules=re.compile(r"(^|\.)h\.\d+\.(attn|mlp)\."),
)
