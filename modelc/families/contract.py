"""The architecture contract: everything modelc knows about one model family, in one place.

Each family's metadata is a module of :mod:`modelc.families` exporting a :class:`Family`
(``FAMILY``), listed once in :mod:`modelc.families.registry`; its forward pass is a class
under ``modelc/runtime/arch/``, named by ``runtime`` (``"module:Class"``) and imported
only when a model is built, so :mod:`modelc.formats` reads files without the runtime.
Adding a family adds those two files and one registry line, nothing else.  A family says:

* how to **recognise** it: Hugging Face ``architectures`` classes and ``model_type``
  values of ``config.json``, GGUF ``general.architecture`` values, and a tensor name
  only it has (for a bare weights file);
* its **config**: :class:`~modelc.formats.ir.HParams` from ``config.json``
  (``from_config``), from tensor shapes (``from_shapes``), or the family-specific keys
  of the GGUF metadata (``from_gguf``; the keys every family shares are read by
  :mod:`modelc.formats.gguf`);
* the **HF -> GGUF tensor mapping**: the ``gguf.TensorNameMap`` of ``gguf_arch``, buffers
  to ``drop``, a ``rename`` for names the map does not know (``own_names`` for tensors
  GGUF has no name for), and lazy ``transform``\\ s
  of tensors whose layout differs from what llama.cpp's ``convert_hf_to_gguf.py`` writes
  (LLaMA's Q/K permutation, GPT-2's ``Conv1D`` transpose); a ``regroup`` for tensors it
  maps many to many (gpt-oss's fused gate/up experts, MXFP4 blocks + scales);
* what a complete model has (``required`` per block, ``output`` when untied) and the
  ``shapes`` the hyper-parameters imply (a wrong config fails at load, not mid-forward);
* the **runtime**: ``model`` (the class ``runtime`` names) builds the forward on a
  :class:`~modelc.runtime.backend.Backend` from ``(ir, backend)``; its cache layout is
  the model's ``kv_shape`` (:class:`~modelc.runtime.kv_cache.KVShape`: layers, KV heads,
  head size, and whether the values are read from the keys, as DeepSeek's latent is);
* **LoRA**: which canonical block weights an adapter may patch (``lora_slots``, the
  runtime block attribute of each), how to recognise its PEFT module names
  (``lora_modules``) and whether Q/K deltas need the GGUF RoPE permutation.

This module holds the contract and the helpers families share; nothing under
:mod:`modelc.families` imports the runtime.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import gguf
import numpy as np

from modelc.errors import UnsupportedError
from modelc.formats.ir import HParams, ModelIR, RopeScaling, Tensor

Shapes = Mapping[str, Sequence[int]]
# a GGUF metadata getter for this family's keys: m("rope.freq_base", 10000.0)
GGUFMeta = Callable[[str, Any], Any]
Kind = Literal["text", "embed", "tensor"]


def _same(name: str) -> str:
    return name


@dataclass(frozen=True, slots=True)
class DecoderTraits:
    """How a decoder-only family's layers differ from LLaMA's, as data.

    The one decoder (:class:`modelc.runtime.arch.decoder.Decoder`) builds every such family
    from its traits and hyper-parameters into a :class:`~modelc.runtime.arch.decoder.DecoderSpec`
    that every backend and ``modelc compile`` run; a family that fits these traits needs no
    forward code of its own.  The numbers (windows, soft-caps, RoPE bases, experts) come from
    :class:`~modelc.formats.ir.HParams`; what is here is what the file format does not say.
    """

    act: Literal["silu", "gelu_tanh"] = "silu"  # the gated FFN's activation
    post_norms: bool = False  # RMSNorm of the attention / FFN outputs before the add (gemma)
    pre_norms: bool = True  # RMSNorm of the layer's input before attention / FFN (not olmo2)
    moe_sigmoid_shared: bool = False  # experts fed sigmoid-scored input + a shared expert (llama4)
    attn_temp_nope_only: bool = False  # attention temperature on NoPE layers only (llama4)
    embd_scale: bool = False  # embeddings times sqrt(n_embd) (gemma)
    fused_qkv: bool = False  # blk.{i}.attn_qkv holds the Q, K and V rows (phi3)
    fused_gate_up: bool = False  # blk.{i}.ffn_up holds the gate rows, then the up rows (phi3)
    # per-layer head shapes, KV sharing, V norms, per-layer inputs (gemma4: runtime/arch/gemma4)
    gemma4_layers: bool = False
    default_ctx: int = 2048  # the context when the file names none
    attn_gate: bool = False  # attn_q holds each head's query, then its output gate (qwen35)
    ffn_norm: str = (
        "ffn_norm"  # the pre-FFN norm's GGUF name (glm4moe, qwen35: post_attention_norm)
    )
    grouped_heads: bool = False  # Gated DeltaNet value heads grouped by key head (qwen3next)
    short_conv: bool = False  # the recurrent layers are short convolutions (lfm2)
    mamba2: bool = False  # the recurrent layers are Mamba-2 (granitehybrid)
    output_norm: str = "output_norm"  # the final norm's GGUF name (lfm2: token_embd_norm)


DECODER = "modelc.runtime.arch.decoder:Decoder"  # the runtime of every DecoderTraits family


@dataclass(frozen=True, slots=True)
class Family:
    """One architecture: recognition, config, tensor mapping, runtime and LoRA slots."""

    name: str  # modelc's architecture name (ModelIR.architecture), also its GGUF name
    kind: Kind  # "text": a causal LM; "embed": an encoder; "tensor": arrays in, arrays out
    # "module:Class" of the forward; every DecoderTraits family runs the one decoder
    runtime: str = DECODER
    gguf_arch: gguf.MODEL_ARCH | None = None  # tensor-name map; None: no GGUF form
    gguf_names: tuple[str, ...] = ()  # general.architecture values read as this family
    hf_classes: tuple[str, ...] = ()  # config.json "architectures"
    model_types: tuple[str, ...] = ()  # config.json "model_type"
    signature: re.Pattern[str] | None = None  # an HF tensor name only this family has
    drop: re.Pattern[str] | None = None  # HF buffers that are not weights
    from_config: Callable[[Mapping[str, Any]], HParams] | None = None
    from_shapes: Callable[[Sequence[str], Shapes], HParams] | None = None
    # (m, hparams, tensors, all metadata): fill the family's fields of hparams in place
    from_gguf: (
        Callable[[GGUFMeta, HParams, Mapping[str, Tensor], Mapping[str, Any]], None] | None
    ) = None
    rename: Callable[[str], str] = _same  # HF name fix-ups before the TensorNameMap
    own_names: Mapping[str, str] = field(default_factory=dict)  # (renamed) names GGUF lacks
    # (hf_name, canonical_name, tensor, hparams) -> the tensor in GGUF layout
    transform: Callable[[str, str, Tensor, HParams], Tensor] | None = None
    # (source tensors, hparams) -> (canonical tensors, source names consumed): tensors the
    # family maps many to many itself (gpt-oss's fused experts and MXFP4 blocks + scales,
    # Qwen3-Next's fused in_proj_qkvz)
    regroup: (
        Callable[[Mapping[str, Tensor], HParams], tuple[dict[str, Tensor], set[str]]] | None
    ) = None
    required: tuple[str, ...] = ()  # per block, e.g. "attn_q.weight"
    output_required: bool = False  # an untied head must have output.weight
    shapes: Callable[[HParams], dict[str, tuple[int, ...]]] | None = None
    lora_slots: Mapping[str, str] = field(default_factory=dict)  # "attn_q" -> "wq"
    lora_modules: re.Pattern[str] | None = None  # PEFT module names of this family
    lora_permute_qk: bool = False  # Q/K deltas need the GGUF interleaved-pair layout
    decoder: DecoderTraits | None = None  # a decoder-only family: its layers, as data

    @property
    def model(self) -> Callable[[ModelIR, Any], Any]:
        """The runtime class, ``(ir, backend) -> model`` (imported on first use)."""
        module, _, cls = self.runtime.partition(":")
        return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]

    def required_tensors(self, hp: HParams) -> list[str]:
        """Every tensor a complete model of this family has, canonical names."""
        names = moe = list(self.required)
        if hp.n_expert:  # a mixture of experts: a router and stacked experts for the FFN
            moe = [n for n in names if not n.startswith("ffn_")] + list(MOE_REQUIRED)
        dense = hp.routing.n_dense_lead if hp.routing else 0  # the first layers stay dense
        req = ["token_embd.weight"]
        req += [f"blk.{i}.{n}" for i in range(hp.n_layer) for n in (names if i < dense else moe)]
        if self.output_required and not hp.tie_embeddings:
            req.append("output.weight")
        return req


# --- helpers shared by the families --------------------------------------------------------

# a mixture-of-experts layer's FFN, as llama.cpp names it: the router (n_expert, d) and the
# experts' matrices stacked (n_expert, ff, d) / (n_expert, d, ff)
MOE_REQUIRED = (
    "ffn_gate_inp.weight",
    "ffn_gate_exps.weight",
    "ffn_up_exps.weight",
    "ffn_down_exps.weight",
)

_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def activation(name: str) -> str:
    """modelc's name for a Hugging Face ``hidden_act``."""
    if name not in _ACTIVATIONS:
        raise UnsupportedError(
            f"activation function {name!r} is not supported ({sorted(_ACTIVATIONS)})"
        )
    return _ACTIVATIONS[name]


def n_blocks(names: Sequence[str], pattern: str) -> int:
    """1 + the largest block index that ``pattern`` (one group) finds in ``names``."""
    pat = re.compile(pattern)
    ids = {int(m.group(1)) for n in names if (m := pat.search(n))}
    return max(ids) + 1 if ids else 0


def find_shape(shapes: Shapes, suffix: str) -> Sequence[int]:
    """The shape of the first tensor whose name ends with ``suffix`` (KeyError if none)."""
    for name, shape in shapes.items():
        if name.endswith(suffix):
            return shape
    raise KeyError(suffix)


def guess_heads(n_embd: int) -> int:
    return max(1, n_embd // 64) if n_embd % 64 == 0 else 1


def hf_rope(cfg: Mapping[str, Any]) -> tuple[float, RopeScaling]:
    """``rope_theta`` and the scaling of a HF config (``rope_scaling`` or ``rope_parameters``)."""
    params = cfg.get("rope_parameters") or {}
    theta = float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)
    rs = cfg.get("rope_scaling") or params
    kind = str(rs.get("rope_type") or rs.get("type") or "default")
    if kind in ("default", "none"):
        return theta, RopeScaling()
    if kind in ("longrope", "su"):
        return theta, _hf_longrope(cfg, rs)
    if kind not in ("linear", "llama3", "yarn"):
        raise UnsupportedError(
            f"rope scaling type {kind!r} is not supported (linear, llama3, yarn, longrope)"
        )
    factor = float(rs.get("factor", 1.0))
    attn = float(rs.get("attention_factor") or 0.0)
    if kind == "yarn" and not attn and rs.get("mscale") and rs.get("mscale_all_dim"):
        # transformers' _compute_yarn_parameters (DeepSeek, Mistral 3)
        attn = yarn_mscale(factor, rs["mscale"]) / yarn_mscale(factor, rs["mscale_all_dim"])
    return theta, RopeScaling(
        type=kind,
        factor=factor,
        original_max_position=int(rs.get("original_max_position_embeddings") or 0),
        low_freq_factor=float(rs.get("low_freq_factor", 1.0)),
        high_freq_factor=float(rs.get("high_freq_factor", 4.0)),
        attn_factor=attn,
        truncate=bool(rs.get("truncate", True)),
    )


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's cos/sin factor for a context ``factor`` times longer, ``mscale`` times the log."""
    return 0.1 * float(mscale) * math.log(factor) + 1.0 if factor > 1 else 1.0


def _hf_longrope(cfg: Mapping[str, Any], rs: Mapping[str, Any]) -> RopeScaling:
    """Phi-3's LongRoPE (``su``): the short/long factors and the cos/sin factor, as
    transformers' ``_compute_longrope_parameters`` (a top-level
    ``original_max_position_embeddings`` wins, as there)."""
    old = int(
        cfg.get("original_max_position_embeddings")
        or rs.get("original_max_position_embeddings")
        or cfg.get("max_position_embeddings")
        or 4096
    )
    factor = float(rs.get("factor") or int(cfg.get("max_position_embeddings") or old) / old)
    attn = rs.get("attention_factor")
    if attn is None:
        attn = math.sqrt(1 + math.log(factor) / math.log(old)) if factor > 1 else 1.0
    return RopeScaling(
        type="longrope",
        factor=factor,
        original_max_position=old,
        attn_factor=float(attn),
        short_factor=[float(f) for f in rs.get("short_factor") or []],
        long_factor=[float(f) for f in rs.get("long_factor") or []],
    )


def gguf_rope(m: GGUFMeta) -> RopeScaling:
    """The ``{arch}.rope.scaling.*`` keys (and the older ``rope.scale_linear``)."""
    kind = str(m("rope.scaling.type", "none"))
    factor = m("rope.scaling.factor", None)
    if factor is None and m("rope.scale_linear", None) is not None:  # older GGUF key
        kind, factor = "linear", m("rope.scale_linear", 1.0)
    if kind not in ("linear", "yarn", "llama3") or factor is None:
        return RopeScaling()
    return RopeScaling(
        type=kind,
        factor=float(factor),
        original_max_position=int(m("rope.scaling.original_context_length", 0)),
        low_freq_factor=float(m("rope.scaling.low_freq_factor", 1.0)),
        high_freq_factor=float(m("rope.scaling.high_freq_factor", 4.0)),
    )


def rope_inv_freq(rot_dim: int, theta: float, scaling: RopeScaling) -> np.ndarray[Any, Any]:
    """Per-pair inverse frequencies (rot_dim/2,) f32, with linear or llama3 scaling applied."""
    inv = 1.0 / theta ** (np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim)
    kind = scaling.type or "none"
    if kind == "none" or (kind == "linear" and scaling.factor == 1.0):
        pass
    elif kind in ("longrope", "factors"):  # longrope: the short factors (longrope_inv_freq
        inv = inv / _factors(scaling.short_factor, rot_dim)  # the long); GGUF rope_freqs
    elif kind == "linear":
        inv = inv / scaling.factor
    elif kind == "llama3":
        old = scaling.original_max_position or 8192
        low_wl = old / scaling.low_freq_factor
        high_wl = old / scaling.high_freq_factor
        wl = 2 * math.pi / inv
        smooth = (old / wl - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        mid = (1 - smooth) * inv / scaling.factor + smooth * inv
        inv = np.where(wl > low_wl, inv / scaling.factor, np.where(wl < high_wl, inv, mid))
    elif kind == "yarn":
        inv = _yarn(inv, rot_dim, theta, scaling)
    else:
        raise UnsupportedError(f"RoPE scaling {kind!r} is not supported (linear, llama3, yarn)")
    return inv.astype(np.float32)


def _factors(f: Sequence[float], rot_dim: int) -> np.ndarray[Any, Any]:
    if len(f) != rot_dim // 2:
        raise UnsupportedError(
            f"LongRoPE needs {rot_dim // 2} factors (half the rotated dimensions), got {len(f)}"
        )
    return np.asarray(f, np.float64)


def longrope_inv_freq(rot_dim: int, theta: float, scaling: RopeScaling) -> np.ndarray[Any, Any]:
    """LongRoPE's inverse frequencies past the original context: the long factors."""
    inv: np.ndarray[Any, Any] = 1.0 / theta ** (np.arange(0, rot_dim, 2) / rot_dim)
    out: np.ndarray[Any, Any] = (inv / _factors(scaling.long_factor, rot_dim)).astype(np.float32)
    return out


def _yarn(inv: np.ndarray[Any, Any], dim: int, theta: float, s: RopeScaling) -> Any:
    """YaRN: interpolate the low frequencies by ``factor``, keep the high ones, ramp
    between (beta_fast 32, beta_slow 1 rotations over the original context), as
    transformers' ``_compute_yarn_parameters`` and llama.cpp's ``rope_yarn``."""
    old = s.original_max_position or 4096

    def corr(rot: float) -> float:
        return dim * math.log(old / (rot * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = corr(32.0), corr(1.0)
    if s.truncate:  # whole dimensions (llama.cpp always; transformers unless truncate false)
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    ramp = np.clip((np.arange(dim // 2) - lo) / ((hi - lo) or 0.001), 0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate
    return inv / s.factor * (1 - keep) + inv * keep


def rope_attention_factor(scaling: RopeScaling) -> float:
    """The factor YaRN multiplies cos and sin by (so Q·K by its square); 1 otherwise."""
    if scaling.type not in ("yarn", "longrope"):
        return 1.0
    if scaling.attn_factor:
        return scaling.attn_factor
    if scaling.type == "longrope":
        return 1.0
    return 0.1 * math.log(scaling.factor) + 1.0 if scaling.factor > 1 else 1.0


def llama_permute(w: np.ndarray[Any, Any], n_head: int) -> np.ndarray[Any, Any]:
    """HF (rotate-half) q/k rows -> GGUF interleaved pairs; ``LlamaModel.permute`` of convert_hf_to_gguf."""
    return np.ascontiguousarray(
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def transposed(t: Tensor, name: str) -> Tensor:
    """``t`` (in, out) as ``name`` (out, in), transposed when loaded."""

    def load() -> np.ndarray[Any, Any]:
        return np.ascontiguousarray(t.data().T)

    return Tensor(name, t.dtype, (t.shape[1], t.shape[0]), load)


def permuted(t: Tensor, name: str, n_head: int) -> Tensor:
    """``t`` with its rows in the GGUF RoPE layout, permuted when loaded."""

    def load() -> np.ndarray[Any, Any]:
        return llama_permute(t.data(), n_head)

    return Tensor(name, t.dtype, t.shape, load)


def renamed(t: Tensor, name: str) -> Tensor:
    return Tensor(name, t.dtype, t.shape, t.loader)
