"""Phi-3 / Phi-3.5 (dense): the LLaMA forward with fused QKV and gate-up tensors, NeoX RoPE
and LongRoPE.

Tensors as llama.cpp's ``convert_hf_to_gguf.py`` writes them for ``phi3``: HF's
``self_attn.qkv_proj`` is ``blk.{i}.attn_qkv`` (Q rows, then K, then V) and
``mlp.gate_up_proj`` is ``blk.{i}.ffn_up`` with ``2 * n_ff`` rows (gate, then up); nothing
is permuted (llama.cpp runs phi3 with NeoX RoPE).  The runtime splits the fused matrices
into row views (no copy, quantized or not), so the LLaMA forward runs them unchanged.

LongRoPE (``rope_scaling.type`` ``longrope`` or the older ``su``): the frequencies are
divided by ``short_factor`` while a sequence is within ``original_max_position_embeddings``
and by ``long_factor`` past it, chosen per step from the sequence's length as
transformers does (llama.cpp chooses once, from the context size); cos and sin are
multiplied by ``sqrt(1 + ln(factor) / ln(original))``.  In GGUF the factors are the
``rope_factors_long`` / ``rope_factors_short`` tensors, read into the hyper-parameters.
``sliding_window`` is honoured as transformers does (llama.cpp turns Phi's window off).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import gguf
import numpy as np

from modelc.errors import UnsupportedError
from modelc.formats.ir import HParams, ModelIR, RopeScaling, Tensor
from modelc.runtime.arch.family import Family, GGUFMeta, longrope_inv_freq
from modelc.runtime.arch.llama import FAMILY as LLAMA
from modelc.runtime.arch.llama import Block, Llama, _opt, gguf_hparams
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.model import SeqChunk, TensorSource


def _rows(w: Weight, start: int, stop: int) -> Weight:
    """Rows ``start:stop`` of ``w`` as a Weight sharing its memory (rows are independent
    in every dtype, quantized blocks included)."""
    return Weight(w.dtype, (stop - start, w.shape[1]), w.data[start:stop])


class Phi3(Llama):
    architecture = "phi3"

    def __init__(self, ir: ModelIR, backend: Backend) -> None:
        super().__init__(ir, backend)
        rs = ir.hparams.rope_scaling
        self.long_after = 0  # LongRoPE: steps whose sequence is longer use long_inv_freq
        if rs.type == "longrope" and rs.long_factor and rs.long_factor != rs.short_factor:
            self.long_after = rs.original_max_position
            self.long_inv_freq = longrope_inv_freq(self.head_dim, ir.hparams.rope_theta, rs)

    def make_block(self, src: TensorSource, i: int) -> Block:
        qkv = src.weight(f"blk.{i}.attn_qkv.weight")
        up = src.weight(f"blk.{i}.ffn_up.weight")
        nq, nkv = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        if qkv.shape[0] != nq + 2 * nkv or up.shape[0] % 2:
            raise UnsupportedError(
                f"phi3 block {i}: attn_qkv has {qkv.shape[0]} rows and ffn_up {up.shape[0]}; "
                f"the hyper-parameters need {nq + 2 * nkv} and an even count"
            )
        ff = up.shape[0] // 2
        return Block(
            attn_norm=src.vec(f"blk.{i}.attn_norm.weight"),
            wq=_rows(qkv, 0, nq),
            wk=_rows(qkv, nq, nq + nkv),
            wv=_rows(qkv, nq + nkv, nq + 2 * nkv),
            wo=src.weight(f"blk.{i}.attn_output.weight"),
            ffn_norm=src.vec(f"blk.{i}.ffn_norm.weight"),
            w_gate=_rows(up, 0, ff),
            w_up=_rows(up, ff, 2 * ff),
            w_down=src.weight(f"blk.{i}.ffn_down.weight"),
            bq=_opt(src, f"blk.{i}.attn_q.bias"),
            bk=_opt(src, f"blk.{i}.attn_k.bias"),
            bv=_opt(src, f"blk.{i}.attn_v.bias"),
        )

    def step_angles(
        self, batch: Sequence[SeqChunk], pos: np.ndarray[Any, Any]
    ) -> tuple[F32Array, F32Array]:
        short = self.be.rope_angles(pos, self.inv_freq)
        if not self.long_after:
            return short
        longer = [c.cache.n + len(c.tokens) > self.long_after for c in batch]
        if not any(longer):
            return short
        long = self.be.rope_angles(pos, self.long_inv_freq)
        if all(longer):
            return long
        rows = np.repeat(np.asarray(longer), [len(c.tokens) for c in batch])[:, None]
        cos = np.where(rows, long[0], short[0]).astype(np.float32)
        sin = np.where(rows, long[1], short[1]).astype(np.float32)
        return cos, sin


# --- the family -----------------------------------------------------------------------------


def _check_rotary(partial: float, rope_dims: int, head_dim: int) -> None:
    if partial != 1.0 or (rope_dims and rope_dims != head_dim):
        raise UnsupportedError(
            "phi3 with a partial rotary factor (RoPE on part of each head, Phi-4-mini) "
            "is not supported yet; Phi-3 and Phi-3.5 rotate whole heads"
        )


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    assert LLAMA.from_config is not None
    hp = LLAMA.from_config(cfg)
    hp.rope_style = "neox"
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    _check_rotary(float(params.get("partial_rotary_factor") or 1.0), 0, hp.head_dim)
    _check_rotary(float(cfg.get("partial_rotary_factor") or 1.0), 0, hp.head_dim)
    return hp


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    gguf_hparams(m, hp, tensors, meta)
    hp.rope_style = "neox"
    _check_rotary(1.0, int(m("rope.dimension_count", 0)), hp.head_dim)
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
    model=Phi3,
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
