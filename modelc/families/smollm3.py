"""SmolLM3: LLaMA with NoPE layers (no RoPE on every ``no_rope_layer_interval``-th layer).

``config.json`` names the layers that rotate (``no_rope_layers``: 1 rotates, 0 does not;
by default every 4th layer, counting from 1, does not).  GGUF has no key for it:
llama.cpp's ``smollm3`` fixes the step at 4 (``n_no_rope_layer_step``), so the GGUF reader
does the same.  Tensors as ``convert_hf_to_gguf.py``'s ``SmolLM3Model`` (a ``LlamaModel``)
writes them: Q/K rows permuted to interleaved pairs, the head tied to the embeddings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gguf

from modelc.errors import UnsupportedError
from modelc.families.contract import DecoderTraits, Family, GGUFMeta
from modelc.families.llama import FAMILY as LLAMA
from modelc.families.llama import gguf_hparams
from modelc.formats.ir import HParams, Tensor

GGUF_NOPE_STEP = 4  # llama.cpp's n_no_rope_layer_step for smollm3


def _every(step: int, n_layer: int) -> list[int]:
    return [i for i in range(n_layer) if (i + 1) % step == 0]


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    assert LLAMA.from_config is not None
    hp = LLAMA.from_config({**cfg, "sliding_window": None})
    if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        raise UnsupportedError("smollm3 with use_sliding_window is not supported yet")
    rotates = cfg.get("no_rope_layers")
    if rotates is None:
        hp.nope_layers = _every(int(cfg.get("no_rope_layer_interval") or 4), hp.n_layer)
    else:
        hp.nope_layers = [i for i, r in enumerate(rotates) if not r]
    hp.tie_embeddings = bool(cfg.get("tie_word_embeddings", True))
    return hp


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    gguf_hparams(m, hp, tensors, meta)
    hp.nope_layers = _every(GGUF_NOPE_STEP, hp.n_layer)


FAMILY = Family(
    name="smollm3",
    kind="text",
    decoder=DecoderTraits(),
    gguf_arch=gguf.MODEL_ARCH.SMOLLM3,
    gguf_names=("smollm3",),
    hf_classes=("SmolLM3ForCausalLM",),
    model_types=("smollm3",),
    drop=LLAMA.drop,
    from_config=_from_config,
    from_gguf=_from_gguf,
    transform=LLAMA.transform,
    required=LLAMA.required,
    output_required=True,
    shapes=LLAMA.shapes,
    lora_slots=LLAMA.lora_slots,
    lora_modules=LLAMA.lora_modules,
    lora_permute_qk=True,
)
