"""The family contract, now :mod:`modelc.families.contract` (kept for the runtime's callers)."""

from __future__ import annotations

from modelc.families.contract import (
    Family,
    GGUFMeta,
    Kind,
    Shapes,
    activation,
    find_shape,
    gguf_rope,
    guess_heads,
    hf_rope,
    llama_permute,
    longrope_inv_freq,
    n_blocks,
    permuted,
    renamed,
    rope_attention_factor,
    rope_inv_freq,
    transposed,
)

__all__ = [
    "Family",
    "GGUFMeta",
    "Kind",
    "Shapes",
    "activation",
    "find_shape",
    "gguf_rope",
    "guess_heads",
    "hf_rope",
    "llama_permute",
    "longrope_inv_freq",
    "n_blocks",
    "permuted",
    "renamed",
    "rope_attention_factor",
    "rope_inv_freq",
    "transposed",
]
