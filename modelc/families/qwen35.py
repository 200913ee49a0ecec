"""Qwen3.5 (dense, GGUF ``qwen35``): a hybrid of Gated DeltaNet linear-attention layers and
gated full-attention layers (three of every four layers recurrent in the releases).

A recurrent layer (:mod:`modelc.runtime.arch.deltanet`) keeps per sequence a short
convolution state and a (value heads, key size, value size) state instead of keys and
values; an attention layer is Qwen3's (NeoX RoPE on the first ``rope_dim`` dimensions
only, per-head Q/K norms) whose ``attn_q`` rows hold each head's query then its output
gate, ``o = (attention * sigmoid(gate)) Wo``.  The FFN norm is ``post_attention_norm``.

Tensors as llama.cpp's ``convert_hf_to_gguf.py`` writes them (``Qwen3_5TextModel``):
``attn_qkv`` / ``attn_gate`` (z) / ``ssm_beta`` / ``ssm_alpha`` / ``ssm_conv1d``
(channels, width) / ``ssm_dt.bias`` / ``ssm_a`` (``-exp(A_log)``) / ``ssm_norm`` /
``ssm_out`` on the recurrent layers; the RMS norms stored as ``1 + w`` (HF's
zero-centred weights), the gated ``ssm_norm`` as it is; value heads reordered from
grouped-by-key-head to tiled order (value head ``j`` reads key head ``j % key heads``).
An HF directory is transformed into that layout as it is read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import gguf
import numpy as np

from modelc.errors import UnsupportedError
from modelc.families.contract import DecoderTraits, Family, GGUFMeta
from modelc.families.qwen2 import neox_config, neox_gguf
from modelc.formats.ir import DType, HParams, Tensor

Array = np.ndarray[Any, Any]


def _text(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's config (a release's ``text_config`` over its top level)."""
    return {**cfg, **(cfg.get("text_config") or {})}


def qwen35_config(config: Mapping[str, Any]) -> HParams:
    cfg = _text(config)
    hp = neox_config(cfg)
    rope = cfg.get("rope_parameters") or {}
    factor = float(rope.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 0.25)
    hp.rope_dim = int(hp.head_dim * factor)
    n = hp.n_layer
    types = cfg.get("layer_types") or [
        "linear_attention" if (i + 1) % int(cfg.get("full_attention_interval", 4)) else "full"
        for i in range(n)
    ]
    hp.recurrent_layers = [i for i, t in enumerate(types) if t == "linear_attention"]
    hp.ssm_conv = int(cfg["linear_conv_kernel_dim"])
    hp.ssm_k_heads = int(cfg["linear_num_key_heads"])
    hp.ssm_v_heads = int(cfg["linear_num_value_heads"])
    hp.ssm_head_k = int(cfg["linear_key_head_dim"])
    hp.ssm_inner = int(cfg["linear_value_head_dim"]) * hp.ssm_v_heads
    if int(cfg["linear_value_head_dim"]) != hp.ssm_head_k:
        raise UnsupportedError(
            "this Qwen3.5 config has key and value heads of different sizes in its linear "
            "attention; llama.cpp's GGUF (and modelc) keep one size (ssm.state_size)"
        )
    return hp


def qwen35_gguf(m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Any) -> None:
    neox_gguf(m, hp, tensors, meta)
    hp.norm_eps = float(m("attention.layer_norm_rms_epsilon", 1e-6))
    hp.rope_dim = int(m("rope.dimension_count", 0))
    hp.ssm_conv = int(m("ssm.conv_kernel", 0))
    hp.ssm_k_heads = int(m("ssm.group_count", 0))
    hp.ssm_v_heads = int(m("ssm.time_step_rank", 0))
    hp.ssm_head_k = int(m("ssm.state_size", 0))
    hp.ssm_inner = int(m("ssm.inner_size", 0))
    flags = m("attention.recurrent_layers", None)
    if flags is not None:
        hp.recurrent_layers = [i for i, f in enumerate(flags) if f and i < hp.n_layer]
    else:
        interval = int(m("full_attention_interval", 4))
        hp.recurrent_layers = [i for i in range(hp.n_layer) if (i + 1) % interval]


def _f32(t: Tensor) -> Array:
    data = t.data()
    if t.dtype is DType.BF16:
        return (np.asarray(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(data, np.float32)


def _tiled(x: Array, axis: int, head: int, hp: HParams) -> Array:
    """Value heads grouped by key head -> tiled (the converter's ``_reorder_v_heads``)."""
    nk, r = hp.ssm_k_heads, hp.ssm_v_heads // hp.ssm_k_heads
    x = np.moveaxis(x, axis, 0)
    y = x.reshape(nk, r, head, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)
    return np.ascontiguousarray(np.moveaxis(y, 0, axis))


def _lazy(t: Tensor, name: str, fn: Callable[[Tensor], Array], shape: tuple[int, ...]) -> Tensor:
    def load() -> Array:
        return fn(t)

    return Tensor(name, DType.F32, shape, load)


# rotary buffers; a release's vision tower and multi-token-prediction head
QWEN35_DROP = re.compile(r"rotary_emb\.inv_freq$|^(model\.)?visual\.|^(model\.)?mtp\.")
QWEN35_REQUIRED = (
    "attn_norm.weight",
    "post_attention_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
)
QWEN35_TRAITS = DecoderTraits(attn_gate=True, ffn_norm="post_attention_norm", default_ctx=4096)
_NORM = re.compile(r"(?<!ssm_)norm\.weight$")


def _as_is(x: Array, axis: int, head: int, hp: HParams) -> Array:
    return x


def gdn_transform(tiled: bool) -> Callable[[str, str, Tensor, HParams], Tensor]:
    """The HF -> GGUF transform of a Gated DeltaNet family; ``tiled``: value heads
    reordered to tiled order (qwen35, qwen35moe; Qwen3-Next keeps them grouped)."""
    tile = _tiled if tiled else _as_is

    def transform(src: str, name: str, t: Tensor, hp: HParams) -> Tensor:
        return _transform(src, name, t, hp, tile)

    return transform


def _transform(
    src: str, name: str, t: Tensor, hp: HParams, _tiled: Callable[[Array, int, int, HParams], Array]
) -> Tensor:
    """An HF tensor in the converter's GGUF layout (see the module docstring)."""
    head = hp.ssm_inner // hp.ssm_v_heads if hp.ssm_v_heads else 0
    qk = 2 * hp.ssm_k_heads * hp.ssm_head_k

    def v_rows(x: Array) -> Array:  # the value part of the qkv rows / conv channels
        return np.concatenate([x[:qk], _tiled(x[qk:], 0, head, hp)])

    if _NORM.search(name):
        return _lazy(t, name, lambda u: _f32(u) + np.float32(1.0), t.shape)
    if name.endswith(".ssm_a"):

        def a(u: Tensor) -> Array:  # -exp(A_log), rounded to f32 once
            return (-np.exp(_tiled(_f32(u), 0, 1, hp).astype(np.float64))).astype(np.float32)

        return _lazy(t, name, a, t.shape)
    if name.endswith(".ssm_conv1d.weight"):
        shape = (t.shape[0], t.shape[-1])
        return _lazy(t, name, lambda u: v_rows(_f32(u).reshape(shape)), shape)
    fns: dict[str, Callable[[Tensor], Array]] = {
        ".attn_qkv.weight": lambda u: v_rows(_f32(u)),
        ".attn_gate.weight": lambda u: _tiled(_f32(u), 0, head, hp),
        ".ssm_alpha.weight": lambda u: _tiled(_f32(u), 0, 1, hp),
        ".ssm_beta.weight": lambda u: _tiled(_f32(u), 0, 1, hp),
        ".ssm_dt.bias": lambda u: _tiled(_f32(u), 0, 1, hp),
        ".ssm_out.weight": lambda u: _tiled(_f32(u), 1, head, hp),
    }
    for suffix, fn in fns.items():
        if name.endswith(suffix):
            return _lazy(t, name, fn, t.shape)
    return Tensor(name, t.dtype, t.shape, t.loader)


qwen35_transform = gdn_transform(tiled=True)


def qwen35_rename(name: str) -> str:
    name = name.replace("model.language_model.", "model.")  # a release's text tower
    return name.removesuffix(".dt_bias") + ".dt_proj.bias" if name.endswith(".dt_bias") else name


FAMILY = Family(
    name="qwen35",
    kind="text",
    decoder=QWEN35_TRAITS,
    gguf_arch=gguf.MODEL_ARCH.QWEN35,
    gguf_names=("qwen35",),
    hf_classes=("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"),
    model_types=("qwen3_5_text", "qwen3_5"),
    drop=QWEN35_DROP,
    from_config=qwen35_config,
    from_gguf=qwen35_gguf,
    rename=qwen35_rename,
    transform=qwen35_transform,
    required=QWEN35_REQUIRED,
    output_required=True,
)
