"""gpt-oss (gpt-oss-20b, gpt-oss-120b): OpenAI's mixture of experts.

Tensors as llama.cpp's ``convert_hf_to_gguf.py`` writes them for ``gpt-oss``: Q/K/V and
the output projection with biases, NeoX RoPE (HF's rows), ``blk.{i}.attn_sinks.weight``
(n_head,) a learned logit per head in each softmax's denominator,
``blk.{i}.post_attention_norm`` the FFN's norm, a router with a bias
``ffn_gate_inp.{weight,bias}``, and the experts stacked with biases,
``ffn_{gate,up}_exps`` (n_expert, ff, d) and ``ffn_down_exps`` (n_expert, d, ff): F32, or
MXFP4 as the release ships them.  Windowed layers: ``layer_types`` of config.json, else
every even layer (llama.cpp's ``set_swa_pattern(2)``).  YaRN RoPE from the
``rope.scaling.*`` keys, with the release's ``truncate: false`` (the ramp's ends not
rounded to whole dimensions, as transformers computes it): GGUF has no key for it, and
llama.cpp rounds them, which moves a tiny model's log-probabilities by ~2e-3.

From an HF directory the fused ``mlp.experts.gate_up_proj`` (gate and up columns
interleaved) is split and stacked as the converter does (:func:`regroup`): the float
form (E, d, 2ff) transposed, or the release's ``*_blocks`` / ``*_scales`` (MXFP4 with
the two codes of a byte in order) repacked into GGML's MXFP4 blocks without a float copy.
The experts' clamped SwiGLU (limit 7, alpha 1.702) and their softmax over the chosen
logits: :mod:`modelc.runtime.arch.moe_oai`; the sinks: the backends' ``attention(sinks=)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import gguf
import numpy as np

from modelc.errors import UnsupportedError
from modelc.families.contract import DecoderTraits, Family, GGUFMeta, hf_rope
from modelc.families.gemma2 import windowed_layers
from modelc.families.llama import gguf_hparams
from modelc.formats.ir import DType, HParams, Tensor

SWIGLU_LIMIT = 7.0  # llama.cpp's constant; config.json's swiglu_limit
_EXPERTS = re.compile(
    r"(?:^|\.)layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias|_blocks|_scales)?$"
)


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    n_embd, n_head = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    n_layer = int(cfg["num_hidden_layers"])
    window = int(cfg.get("sliding_window") or 0)
    layers = windowed_layers(cfg, n_layer, 2) if window else []
    theta, scaling = hf_rope(cfg)
    if not cfg.get("attention_bias", True):
        raise UnsupportedError("a gpt-oss config without attention biases is not supported")
    return HParams(
        n_vocab=int(cfg["vocab_size"]),
        n_ctx=int(cfg.get("max_position_embeddings", 131072)),
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=int(cfg.get("num_key_value_heads") or n_head),
        n_ff=int(cfg["intermediate_size"]),
        head_dim=int(cfg.get("head_dim") or n_embd // n_head),
        n_expert=int(cfg["num_local_experts"]),
        n_expert_used=int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 4),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        rope_theta=theta,
        rope_style="neox",
        rope_scaling=scaling,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        sliding_window=window if layers else 0,
        window_layers=layers if len(layers) < n_layer else [],
        activation="silu",
        swiglu_limit=float(cfg.get("swiglu_limit") or SWIGLU_LIMIT),
    )


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    gguf_hparams(m, hp, tensors, meta)
    hp.rope_style = "neox"
    hp.n_ff = int(m("expert_feed_forward_length", hp.n_ff))
    if hp.sliding_window:  # llama.cpp: every even layer windowed
        hp.window_layers = list(range(0, hp.n_layer, 2))
    hp.swiglu_limit = SWIGLU_LIMIT
    hp.rope_scaling.truncate = False  # the release's config (GGUF has no key for it)


def _rename(name: str) -> str:
    return name + ".weight" if name.endswith(".self_attn.sinks") else name


def _mxfp4_rows(blocks: Tensor, scales: Tensor, name: str, part: slice) -> Tensor:
    """Rows ``part`` of HF MXFP4 ``blocks`` (E, rows, cols/32, 16) and ``scales`` (E, rows,
    cols/32) as GGML MXFP4 (E, rows', cols): per block the E8M0 byte, then value j in the
    low nibble and value j + 16 in the high nibble of byte j (HF keeps values 2j, 2j + 1)."""
    n_e, rows, nb, _ = blocks.shape
    n_rows = len(range(rows)[part])

    def load() -> np.ndarray[Any, Any]:
        b = np.asarray(blocks.data(), np.uint8)[:, part]  # (E, rows', nb, 16)
        s = np.asarray(scales.data(), np.uint8)[:, part]
        codes = np.stack([b & 0xF, b >> 4], axis=-1).reshape(*b.shape[:-1], 32)
        packed = codes[..., :16] | (codes[..., 16:] << 4)
        out = np.concatenate([s[..., None], packed], axis=-1)  # (E, rows', nb, 17)
        return np.ascontiguousarray(out.reshape(n_e * n_rows, nb * 17))

    return Tensor(name, DType.MXFP4, (n_e, n_rows, nb * 32), load)


def _float_rows(t: Tensor, name: str, part: slice) -> Tensor:
    """HF's float experts (E, in, out): output columns ``part`` as (E, out', in)."""
    n_e, cols, rows = t.shape
    n_rows = len(range(rows)[part])

    def load() -> np.ndarray[Any, Any]:
        return np.ascontiguousarray(np.asarray(t.data(), np.float32).swapaxes(1, 2)[:, part])

    return Tensor(name, DType.F32, (n_e, n_rows, cols), load)


def _bias_cols(t: Tensor, name: str, part: slice) -> Tensor:
    n_e, n = t.shape
    n_cols = len(range(n)[part])

    def load() -> np.ndarray[Any, Any]:
        return np.ascontiguousarray(np.asarray(t.data(), np.float32)[:, part])

    return Tensor(name, DType.F32, (n_e, n_cols), load)


_PARTS = {"gate_up_proj": (("gate", slice(0, None, 2)), ("up", slice(1, None, 2)))}
_DOWN = (("down", slice(None)),)


def regroup(raw: Mapping[str, Tensor], hp: HParams) -> tuple[dict[str, Tensor], set[str]]:
    """The fused HF experts as the converter splits (gate rows ::2, up rows 1::2) and
    names them; MXFP4 blocks and scales repacked, float ones transposed."""
    found: dict[tuple[str, str, str], str] = {}
    for name in raw:
        m = _EXPERTS.search(name)
        if m is not None:
            found[(m.group(1), m.group(2), m.group(3) or "")] = name
    out: dict[str, Tensor] = {}
    for (i, proj, kind), name in found.items():
        for part, rows in _PARTS.get(proj, _DOWN):
            new = f"blk.{i}.ffn_{part}_exps."
            if kind == "_bias":
                out[new + "bias"] = _bias_cols(raw[name], new + "bias", rows)
            elif kind == "":
                out[new + "weight"] = _float_rows(raw[name], new + "weight", rows)
            elif kind == "_blocks":
                scales = found.get((i, proj, "_scales"))
                if scales is None:
                    raise UnsupportedError(f"{name} has no {proj}_scales beside it")
                out[new + "weight"] = _mxfp4_rows(raw[name], raw[scales], new + "weight", rows)
    return out, set(found.values())


def _shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    return {
        "blk.0.attn_q.weight": (hp.n_head * hp.head_dim, hp.n_embd),
        "blk.0.attn_k.weight": (hp.n_head_kv * hp.head_dim, hp.n_embd),
        "blk.0.attn_sinks.weight": (hp.n_head,),
        "blk.0.ffn_gate_exps.weight": (hp.n_expert, hp.n_ff, hp.n_embd),
        "blk.0.ffn_down_exps.weight": (hp.n_expert, hp.n_embd, hp.n_ff),
    }


FAMILY = Family(
    name="gpt-oss",
    kind="text",
    decoder=DecoderTraits(ffn_norm="post_attention_norm", default_ctx=4096),
    gguf_arch=gguf.MODEL_ARCH.GPT_OSS,
    gguf_names=("gpt-oss",),
    hf_classes=("GptOssForCausalLM",),
    model_types=("gpt_oss",),
    drop=re.compile(r"rotary_emb\.inv_freq$"),
    from_config=_from_config,
    from_gguf=_from_gguf,
    rename=_rename,
    regroup=regroup,
    required=(
        "attn_norm.weight",
        *(f"attn_{p}.{k}" for p in ("q", "k", "v", "output") for k in ("weight", "bias")),
        "attn_sinks.weight",
        "post_attention_norm.weight",
    ),
    output_required=True,
    shapes=_shapes,
)
