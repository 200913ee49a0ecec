"""Granite 4.0-H (IBM, GGUF ``granitehybrid``): Mamba-2 layers and GQA attention layers;
the FFN the ``shared_mlp`` (Micro, 1B, 350M), or a mixture of experts beside it as a
shared expert (Tiny, Small: softmax top-k renormalised).

A Mamba-2 layer (:mod:`modelc.runtime.arch.mamba2`) keeps per sequence a convolution state
and a (heads, head size, state) state instead of keys and values; an attention layer is
LLaMA's without RoPE (``position_embedding_type`` ``nope``; llama.cpp:
``rope.scaling.finetuned`` false) and with Granite's multipliers: the embeddings times
``embedding_multiplier``, each attention / Mamba / FFN output times
``residual_multiplier`` before its residual add, Q·K times ``attention_multiplier``, the
logits divided by ``logits_scaling``.

Tensors as llama.cpp's ``convert_hf_to_gguf.py`` writes them (``GraniteHybridModel``):
``ssm_in`` (z, x B C, dt rows) / ``ssm_conv1d`` (channels, width) and its bias /
``ssm_dt.bias`` / ``ssm_a`` (``-exp(A_log)``, (heads, 1)) / ``ssm_d`` (heads, 1) /
``ssm_norm`` (groups, channels / groups) / ``ssm_out``; Q/K rows permuted to interleaved
pairs (as LLaMA's); ``shared_mlp.input_linear`` split into ``ffn_gate`` and ``ffn_up``,
``output_linear`` as ``ffn_down`` (``ffn_*_shexp`` beside experts); the experts'
``block_sparse_moe.input_linear`` (experts, 2 ff, d) split into ``ffn_gate_exps`` and
``ffn_up_exps``; ``head_count_kv`` per layer, 0 on the Mamba layers.  An HF directory is
transformed into that layout as it is read.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import gguf
import numpy as np

from modelc.errors import UnsupportedError
from modelc.families.contract import DecoderTraits, Family, GGUFMeta, permuted, renamed
from modelc.families.lfm2 import recurrent_from_kv_heads
from modelc.families.llama import FAMILY as LLAMA
from modelc.families.llama import gguf_hparams
from modelc.formats.ir import HParams, Tensor

_MLP = re.compile(
    r"(?:^|\.)layers\.(\d+)\.(shared_mlp|block_sparse_moe)\.(input|output)_linear\.weight$"
)
_QK = re.compile(r"\.attn_([qk])\.weight$")


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    if cfg.get("mamba_proj_bias"):
        raise UnsupportedError("a Granite 4.0-H with Mamba projection biases is not supported")
    assert LLAMA.from_config is not None
    hp = LLAMA.from_config({**cfg, "intermediate_size": cfg["shared_intermediate_size"]})
    types = cfg.get("layer_types") or cfg.get("layers_block_type") or []
    hp.recurrent_layers = [i for i, t in enumerate(types) if t in ("mamba", "linear_attention")]
    if cfg.get("position_embedding_type") != "rope":
        hp.nope_layers = list(range(hp.n_layer))
    d = hp.n_embd
    hp.attn_scale = float(cfg.get("attention_multiplier") or 0.0)
    hp.embedding_scale = float(cfg.get("embedding_multiplier") or 0.0)
    hp.residual_scale = float(cfg.get("residual_multiplier") or 0.0)
    hp.logit_scale = float(cfg.get("logits_scaling") or 0.0)
    hp.ssm_conv = int(cfg.get("mamba_d_conv", 4))
    hp.ssm_inner = int(cfg.get("mamba_expand", 2)) * d
    hp.ssm_v_heads = int(cfg.get("mamba_n_heads", 128))
    hp.ssm_k_heads = int(cfg.get("mamba_n_groups", 1))
    hp.ssm_head_k = int(cfg.get("mamba_d_state", 256))
    return hp


def _from_gguf(m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Any) -> None:
    gguf_hparams(m, hp, tensors, meta)
    recurrent_from_kv_heads(m, hp)
    if not m("rope.scaling.finetuned", True):  # granite's switch: no RoPE at all
        hp.nope_layers = list(range(hp.n_layer))
    hp.attn_scale = float(m("attention.scale", 0.0))
    hp.embedding_scale = float(m("embedding_scale", 0.0))
    hp.residual_scale = float(m("residual_scale", 0.0))
    hp.logit_scale = float(m("logit_scale", 0.0))
    hp.ssm_conv = int(m("ssm.conv_kernel", 0))
    hp.ssm_inner = int(m("ssm.inner_size", 0))
    hp.ssm_v_heads = int(m("ssm.time_step_rank", 0))
    hp.ssm_k_heads = int(m("ssm.group_count", 0))
    hp.ssm_head_k = int(m("ssm.state_size", 0))


def _rename(name: str) -> str:
    return name.removesuffix(".dt_bias") + ".dt_proj.bias" if name.endswith(".dt_bias") else name


def _regroup(raw: Mapping[str, Tensor], hp: HParams) -> tuple[dict[str, Tensor], set[str]]:
    """The fused gate + up matrices split, the shared MLP named as the converter's
    ``GraniteMoeModel.modify_tensors`` names it (``_shexp`` beside experts)."""
    out: dict[str, Tensor] = {}
    used: set[str] = set()
    for name, t in raw.items():
        m = _MLP.search(name)
        if m is None:
            continue
        i, used = m.group(1), used | {name}
        suffix = "_exps" if m.group(2) == "block_sparse_moe" else "_shexp" if hp.n_expert else ""
        if m.group(3) == "output":
            new = f"blk.{i}.ffn_down{suffix}.weight"
            out[new] = renamed(t, new)
            continue
        half = t.shape[-2] // 2  # (2 ff, d), or (experts, 2 ff, d)

        def part(j: int, t: Tensor = t, half: int = half) -> np.ndarray[Any, Any]:
            return np.ascontiguousarray(np.asarray(t.data())[..., j * half : (j + 1) * half, :])

        for j, kind in enumerate(("gate", "up")):
            new = f"blk.{i}.ffn_{kind}{suffix}.weight"
            shape = (*t.shape[:-2], half, t.shape[-1])
            out[new] = Tensor(new, t.dtype, shape, functools.partial(part, j))
    return out, used


def _lazy(t: Tensor, name: str, shape: tuple[int, ...], fn: Any) -> Tensor:
    def load() -> np.ndarray[Any, Any]:
        return np.ascontiguousarray(fn(np.asarray(t.data())).reshape(shape))

    return Tensor(name, t.dtype, shape, load)


def _transform(src: str, name: str, t: Tensor, hp: HParams) -> Tensor:
    """An HF tensor in the converter's GGUF layout (see the module docstring)."""
    if m := _QK.search(name):
        return permuted(t, name, hp.n_head if m.group(1) == "q" else hp.n_head_kv)
    if name.endswith(".ssm_a"):  # -exp(A_log), rounded to f32 once, as torch computes it
        a = t.shape[0]
        return _lazy(t, name, (a, 1), lambda x: -np.exp(x.astype(np.float64)).astype(x.dtype))
    if name.endswith(".ssm_d"):
        return _lazy(t, name, (t.shape[0], 1), lambda x: x)
    if name.endswith(".ssm_conv1d.weight"):
        return _lazy(t, name, (t.shape[0], t.shape[-1]), lambda x: x)
    if name.endswith(".ssm_norm.weight"):
        g = max(hp.ssm_k_heads, 1)
        return _lazy(t, name, (g, t.shape[0] // g), lambda x: x)
    return renamed(t, name)


FAMILY = Family(
    name="granitehybrid",
    kind="text",
    decoder=DecoderTraits(mamba2=True, default_ctx=4096),
    gguf_arch=gguf.MODEL_ARCH.GRANITE_HYBRID,
    gguf_names=("granitehybrid",),
    hf_classes=("GraniteMoeHybridForCausalLM",),
    model_types=("granitemoehybrid",),
    from_config=_from_config,
    from_gguf=_from_gguf,
    rename=_rename,
    transform=_transform,
    regroup=_regroup,
    required=("attn_norm.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight"),
)
