"""Llama 4 (text): mixtures with a shared expert, NoPE layers with temperature tuning,
Q/K L2 norms, chunked attention.

From its GGUF (``llama4``, as ``convert_hf_to_gguf.py``'s ``Llama4Model`` writes it: HF's
Q/K rows, interleaved RoPE; the experts stacked as ``ffn_{gate,up,down}_exps``, the shared
expert ``ffn_{gate,up,down}_shexp``).  As llama.cpp reads it: unless the file says
``attention.sliding_window`` 0, every 4th layer is NoPE, its queries scaled by
``1 + 0.1 * ln(1 + floor((pos + 1) / 8192))``, and the RoPE layers attend within chunks of
8192 positions; Q/K L2 norms unless the model has 128 experts (Maverick).  modelc does not
chunk attention: the context is capped at the chunk size, within which chunking changes
nothing.  Llama 3 RoPE scaling comes as the ``rope_freqs`` tensor (per-pair divisors of
the frequencies, read into the hyper-parameters).  Dense layers among the mixtures
(Maverick) and Hugging Face directories (3D fused experts) are refused.
"""

from __future__ import annotations

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


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    raise UnsupportedError(
        "llama4 from a Hugging Face directory is not supported yet (fused 3D expert "
        "tensors); convert it with llama.cpp's convert_hf_to_gguf.py and load the GGUF"
    )


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
    step = int(m("interleave_moe_layer_step", 1))
    if step != 1:
        raise UnsupportedError(f"llama4 with dense layers among the mixtures (step {step})")
    chunked = hp.sliding_window != 0 or m("attention.sliding_window", None) is None
    hp.sliding_window = 0
    if chunked:
        hp.nope_layers = [i for i in range(hp.n_layer) if (i + 1) % NOPE_STEP == 0]
        hp.attn_temp_scale, hp.attn_temp_floor, hp.attn_temp_offset = 0.1, CHUNK, 1.0
        hp.n_ctx = min(hp.n_ctx or CHUNK, CHUNK)
    hp.qk_l2_norm = hp.n_expert != 128


FAMILY = Family(
    name="llama4",
    kind="text",
    decoder=DecoderTraits(moe_sigmoid_shared=True, attn_temp_nope_only=True),
    gguf_arch=gguf.MODEL_ARCH.LLAMA4,
    gguf_names=("llama4",),
    hf_classes=("Llama4ForCausalLM", "Llama4ForConditionalGeneration"),
    model_types=("llama4_text", "llama4"),
    drop=LLAMA.drop,
    from_config=_from_config,
    from_gguf=_from_gguf,
    required=(*LLAMA_REQUIRED, "ffn_gate_shexp.weight"),
    output_required=True,
    lora_slots={k: v for k, v in LLAMA.lora_slots.items() if k.startswith("attn_")},
    lora_modules=LLAMA.lora_modules,
)
