"""Phi-3 / Phi-3.5 (dense): how modelc recognises, configures and maps the family.

Tensors as llama.cpp's ``convert_hf_to_gguf.py`` writes them for ``phi3``: HF's
``self_attn.qkv_proj`` is ``blk.{i}.attn_qkv`` (Q rows, then K, then V) and
``mlp.gate_up_proj`` is ``blk.{i}.ffn_up`` with ``2 * n_ff`` rows (gate, then up); nothing
is permuted (NeoX RoPE).  Phi-4-mini rotates part of each head (``partial_rotary_factor``,
GGUF ``rope.dimension_count``: ``HParams.rope_dim``).  LongRoPE (``rope_scaling.type``
``longrope`` or the older ``su``): the short/long factors and cos/sin factor, from ``config.json`` or from GGUF's
``rope_factors_long`` / ``rope_factors_short`` tensors (read into the hyper-parameters,
not kept as weights).  The forward is the one decoder
(:class:`modelc.runtime.arch.decoder.Decoder`), its fused tensors split into row views.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import gguf
import numpy as np

from modelc.errors import UnsupportedError
from modelc.families.contract import DecoderTraits, Family, GGUFMeta
from modelc.families.llama import FAMILY as LLAMA
from modelc.families.llama import gguf_hparams
from modelc.formats.ir import HParams, RopeScaling, Tensor


def _rope_dim(dim: int, head_dim: int) -> int:
    """``dim`` rotated dimensions of a head as ``HParams.rope_dim`` (0: the whole head)."""
    if not 0 < dim <= head_dim or dim % 2:
        raise UnsupportedError(
            f"phi3 with {dim} rotated dimensions of {head_dim} is not supported; "
            "partial RoPE needs an even count from 2 to the head size"
        )
    return 0 if dim == head_dim else dim


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    assert LLAMA.from_config is not None
    hp = LLAMA.from_config(cfg)
    hp.rope_style = "neox"
    params = cfg.get("rope_parameters") or {}
    partial = params.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 1.0
    hp.rope_dim = _rope_dim(int(hp.head_dim * float(partial)), hp.head_dim)  # transformers' int()
    return hp


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    gguf_hparams(m, hp, tensors, meta)
    hp.rope_style = "neox"
    if hp.sliding_window >= hp.n_ctx:  # Phi-4-mini's 262144: no window, as from config.json
        hp.sliding_window = 0
    rot = int(m("rope.dimension_count", 0))
    hp.rope_dim = _rope_dim(rot, hp.head_dim) if rot else 0
    if "rope_factors_long.weight" in tensors:
        old = int(m("rope.scaling.original_context_length", 0)) or hp.n_ctx
        hp.rope_scaling = RopeScaling(
            type="longrope",
            factor=hp.n_ctx / old if old else 1.0,
            original_max_position=old,
            attn_factor=float(m("rope.scaling.attn_factor", 1.0)),
            short_factor=_factors(tensors, "rope_factors_short.weight"),
            long_factor=_factors(tensors, "rope_factors_long.weight"),
        )
        if isinstance(tensors, dict):  # hyper-parameters now; not weights of the model
            for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
                tensors.pop(name, None)


def _factors(tensors: Mapping[str, Tensor], name: str) -> list[float]:
    t = tensors.get(name)
    return [float(f) for f in np.asarray(t.data(), np.float64).reshape(-1)] if t else []


def _shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    return {
        "blk.0.attn_qkv.weight": ((hp.n_head + 2 * hp.n_head_kv) * hp.head_dim, hp.n_embd),
        "blk.0.ffn_up.weight": (2 * hp.n_ff, hp.n_embd),
    }


FAMILY = Family(
    name="phi3",
    kind="text",
    decoder=DecoderTraits(fused_qkv=True, fused_gate_up=True),
    gguf_arch=gguf.MODEL_ARCH.PHI3,
    gguf_names=("phi3",),
    hf_classes=("Phi3ForCausalLM",),
    model_types=("phi3",),
    drop=LLAMA.drop,
    from_config=_from_config,
    from_gguf=_from_gguf,
    required=("attn_norm.weight", "attn_qkv.weight", "attn_output.weight", "ffn_up.weight"),
    output_required=True,
    shapes=_shapes,
    # fused QKV and gate-up: an adapter may patch the output and down projections
    lora_slots={"attn_output": "wo", "ffn_down": "w_down"},
    lora_modules=re.compile(
        r"(^|\.)layers\.\d+\.(self_attn\.(qkv|o)_proj|mlp\.(gate_up|down)_proj)"
    ),
)
