"""Qwen3-Next (GGUF ``qwen3next``: Qwen3-Next-80B-A3B): the hybrid of Qwen3.5-MoE
(:mod:`modelc.families.qwen35moe`) in the older layout.

Its Gated DeltaNet value heads stay grouped by key head (value head ``j`` reads key head
``j // (value heads / key heads)``, as transformers), and its HF projections are fused
per key head: ``in_proj_qkvz`` (q, k, v, z of each key head's group), which the reader
splits as llama.cpp's converter does into ``attn_qkv`` (every q, every k, every v) and
``attn_gate`` (z), and ``in_proj_ba`` stored as ``ssm_ba`` (each group's betas, then its
alphas), split by the runtime.  Otherwise as Qwen3.5: norms stored as ``1 + w``,
``ssm_a = -exp(A_log)``, gated attention with a quarter of each head rotated, a mixture
in every layer plus a sigmoid-gated shared expert.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import gguf
import numpy as np

from modelc.errors import UnsupportedError
from modelc.families.contract import Family
from modelc.families.qwen35 import (
    QWEN35_DROP,
    QWEN35_REQUIRED,
    QWEN35_TRAITS,
    gdn_transform,
    qwen35_config,
    qwen35_gguf,
    qwen35_rename,
)
from modelc.formats.ir import HParams, Tensor

_QKVZ = re.compile(r"(?:^|\.)layers\.(\d+)\.linear_attn\.in_proj_qkvz\.weight$")


def _from_config(config: Mapping[str, Any]) -> HParams:
    if config.get("decoder_sparse_step", 1) != 1 or config.get("mlp_only_layers"):
        raise UnsupportedError(
            "this Qwen3-Next config has dense layers among its mixtures; modelc runs the "
            "released layout, every layer a mixture"
        )
    hp = qwen35_config(config)
    hp.n_expert = int(config["num_experts"])
    hp.n_expert_used = int(config["num_experts_per_tok"])
    return hp


def _split(raw: Mapping[str, Tensor], hp: HParams) -> tuple[dict[str, Tensor], set[str]]:
    """Each ``in_proj_qkvz`` as ``attn_qkv`` and ``attn_gate`` (convert_hf_to_gguf's
    ``Qwen3NextModel.modify_tensors``)."""
    out: dict[str, Tensor] = {}
    used: set[str] = set()
    nk, dk = hp.ssm_k_heads, hp.ssm_head_k
    for name, t in raw.items():
        m = _QKVZ.search(name)
        if m is None:
            continue
        i, cols = m.group(1), t.shape[1]
        vz = t.shape[0] // nk - 2 * dk  # each group's v and z rows

        def part(which: str, t: Tensor = t, vz: int = vz) -> np.ndarray[Any, Any]:
            heads = np.asarray(t.data()).reshape(nk, -1, t.shape[1])
            q, k, v, z = np.split(heads, [dk, 2 * dk, 2 * dk + vz // 2], axis=1)
            if which == "z":
                return np.ascontiguousarray(z.reshape(-1, t.shape[1]))
            return np.concatenate([x.reshape(-1, t.shape[1]) for x in (q, k, v)])

        qkv, gate = f"blk.{i}.attn_qkv.weight", f"blk.{i}.attn_gate.weight"
        rows = 2 * nk * dk + nk * vz // 2
        out[qkv] = Tensor(qkv, t.dtype, (rows, cols), functools.partial(part, "qkv"))
        out[gate] = Tensor(gate, t.dtype, (nk * vz // 2, cols), functools.partial(part, "z"))
        used.add(name)
    return out, used


FAMILY = Family(
    name="qwen3next",
    kind="text",
    decoder=type(QWEN35_TRAITS)(
        attn_gate=True, ffn_norm="post_attention_norm", grouped_heads=True, default_ctx=4096
    ),
    gguf_arch=gguf.MODEL_ARCH.QWEN3NEXT,
    gguf_names=("qwen3next",),
    hf_classes=("Qwen3NextForCausalLM",),
    model_types=("qwen3_next",),
    drop=QWEN35_DROP,
    from_config=_from_config,
    from_gguf=qwen35_gguf,
    rename=qwen35_rename,
    transform=gdn_transform(tiled=False),
    regroup=_split,
    required=QWEN35_REQUIRED,
    output_required=True,
)
