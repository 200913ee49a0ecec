"""Llama 4 (text): mixtures with a shared expert, NoPE layers with temperature tuning,
Q/K L2 norms, chunked attention.

From its GGUF (``llama4``, as ``convert_hf_to_gguf.py``'s ``Llama4Model`` writes it: HF's
Q/K rows, interleaved RoPE; the experts stacked as ``ffn_{gate,up,down}_exps``, the shared
expert ``ffn_{gate,up,down}_shexp``).  As llama.cpp reads it: unless the file says
``attention.sliding_window`` 0, every 4th layer is NoPE, its queries scaled by
``1 + 0.1 * ln(1 + floor((pos + 1) / 8192))``, and the RoPE layers attend within chunks of
8192 positions (:mod:`modelc.runtime.arch.chunked`; the GGUF has no key for the chunk,
llama.cpp fixes it); Q/K L2 norms unless the model has 128 experts (Maverick).  Llama 3
RoPE scaling comes as the ``rope_freqs`` tensor (per-pair divisors of the frequencies,
read into the hyper-parameters).

From a Hugging Face directory (``Llama4ForCausalLM``, or the text model of a
``Llama4ForConditionalGeneration``: its ``text_config``, the ``language_model.`` weights;
the vision tower is left out), as transformers 5 saves it: ``no_rope_layers`` (0: NoPE),
``attention_chunk_size`` on the ``chunked_attention`` layers (the RoPE ones),
``floor_scale`` / ``attn_scale``, ``use_qk_norm``; the fused experts ``gate_up_proj``
(n_expert, d, 2 ff: gate columns, then up) and ``down_proj`` (n_expert, ff, d) split and
transposed into the converter's stacks.  Dense layers among the mixtures (Maverick) are
refused.
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
from modelc.families.llama import LLAMA_REQUIRED, gguf_hparams
from modelc.formats.ir import HParams, RopeScaling, Tensor

CHUNK = 8192  # llama.cpp's n_swa for llama4 (the releases' attention_chunk_size)
NOPE_STEP = 4


def _from_config(config: Mapping[str, Any]) -> HParams:
    """The text model's config (a release's ``text_config`` over its top level)."""
    cfg = {**config, **(config.get("text_config") or {})}
    _dense_refused(int(cfg.get("interleave_moe_layer_step", 1)))
    assert LLAMA.from_config is not None
    hp = LLAMA.from_config(cfg)
    hp.n_ff = int(cfg.get("intermediate_size_mlp") or hp.n_ff)  # as the converter writes it
    n = hp.n_layer
    rope = cfg.get("no_rope_layers") or [int((i + 1) % NOPE_STEP != 0) for i in range(n)]
    hp.nope_layers = [i for i, r in enumerate(rope) if not r]
    types = list(cfg.get("layer_types") or [])
    full = bool(types) and all(t == "full_attention" for t in types)  # no chunks at all
    hp.attn_chunk = 0 if full else int(cfg.get("attention_chunk_size") or 0)
    if hp.attn_chunk and types and types != [_kind(i, hp) for i in range(n)]:
        raise UnsupportedError(
            "llama4 whose chunked_attention layers are not its RoPE layers is not supported"
        )
    if cfg.get("attn_temperature_tuning", True):
        hp.attn_temp_scale = float(cfg.get("attn_scale", 0.1))
        hp.attn_temp_floor, hp.attn_temp_offset = int(cfg.get("floor_scale", CHUNK)), 1.0
    hp.qk_l2_norm = bool(cfg.get("use_qk_norm", True))
    return hp


def _kind(i: int, hp: HParams) -> str:
    return "full_attention" if i in hp.nope_layers else "chunked_attention"


def _dense_refused(step: int) -> None:
    if step != 1:
        raise UnsupportedError(f"llama4 with dense layers among the mixtures (step {step})")


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    gguf_hparams(m, hp, tensors, meta)
    freqs = tensors.get("rope_freqs.weight")
    if freqs is not None:  # Llama 3 RoPE scaling, as per-pair divisors of the frequencies
        divisors = np.asarray(freqs.data(), np.float64).reshape(-1)
        hp.rope_scaling = RopeScaling(type="factors", short_factor=[float(f) for f in divisors])
        if isinstance(tensors, dict):  # a hyper-parameter now, not a weight of the model
            tensors.pop("rope_freqs.weight")
    _dense_refused(int(m("interleave_moe_layer_step", 1)))
    chunked = hp.sliding_window != 0 or m("attention.sliding_window", None) is None
    hp.sliding_window = 0
    if chunked:
        hp.nope_layers = [i for i in range(hp.n_layer) if (i + 1) % NOPE_STEP == 0]
        hp.attn_temp_scale, hp.attn_temp_floor, hp.attn_temp_offset = 0.1, CHUNK, 1.0
        hp.attn_chunk = CHUNK
    hp.qk_l2_norm = hp.n_expert != 128


def _rename(name: str) -> str:
    """A Llama4ForConditionalGeneration's text weights under Llama4ForCausalLM's names."""
    return re.sub(r"^language_model\.", "", re.sub(r"^model\.language_model\.", "model.", name))


_EXPERTS = re.compile(r"layers\.(\d+)\.feed_forward\.experts\.(gate_up_proj|down_proj)$")


def _expert_part(t: Tensor, name: str, cols: slice) -> Tensor:
    """Columns ``cols`` of a fused expert stack (n_expert, in, out), as (n_expert, out, in)."""
    n_out = len(range(t.shape[2])[cols])

    def load() -> np.ndarray[Any, Any]:
        return np.ascontiguousarray(t.data()[:, :, cols].transpose(0, 2, 1))

    return Tensor(name, t.dtype, (t.shape[0], n_out, t.shape[1]), load)


def _regroup(raw: Mapping[str, Tensor], hp: HParams) -> tuple[dict[str, Tensor], set[str]]:
    """The fused experts split and transposed as ``Llama4Model.modify_tensors`` does."""
    out: dict[str, Tensor] = {}
    used: set[str] = set()
    for name, t in raw.items():
        m = _EXPERTS.search(name)
        if m is None:
            continue
        i, kind = m.group(1), m.group(2)
        used.add(name)
        if kind == "down_proj":
            new = f"blk.{i}.ffn_down_exps.weight"
            out[new] = _expert_part(t, new, slice(None))
            continue
        half = t.shape[2] // 2
        for part, cols in (("gate", slice(0, half)), ("up", slice(half, None))):
            new = f"blk.{i}.ffn_{part}_exps.weight"
            out[new] = _expert_part(t, new, cols)
    return out, used


FAMILY = Family(
    name="llama4",
    kind="text",
    decoder=DecoderTraits(moe_sigmoid_shared=True, attn_temp_nope_only=True),
    gguf_arch=gguf.MODEL_ARCH.LLAMA4,
    gguf_names=("llama4",),
    hf_classes=("Llama4ForCausalLM", "Llama4ForConditionalGeneration"),
    model_types=("llama4_text", "llama4"),
    drop=re.compile(r"rotary_emb\.inv_freq$|vision_model\.|multi_modal_projector\."),
    from_config=_from_config,
    from_gguf=_from_gguf,
    rename=_rename,
    regroup=_regroup,
    required=(*LLAMA_REQUIRED, "ffn_gate_shexp.weight"),
    output_required=True,
    lora_slots={k: v for k, v in LLAMA.lora_slots.items() if k.startswith("attn_")},
    lora_modules=LLAMA.lora_modules,
)
