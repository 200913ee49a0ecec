"""LFM2-MoE (Liquid AI, GGUF ``lfm2moe``: LFM2-8B-A1B): LFM2 (:mod:`modelc.families.lfm2`)
whose FFNs after the first ``num_dense_layers`` are mixtures of experts.

A token goes through the ``num_experts_per_tok`` experts of highest sigmoid score plus
``expert_bias`` (the bias for the choice only), weighted by their scores renormalised
(llama.cpp's ``build_moe_ffn`` with sigmoid gating, ``exp_probs_b`` and ``norm_w``).
Tensors as ``convert_hf_to_gguf.py``'s ``LFM2MoeModel`` writes them: the release's
per-expert ``feed_forward.experts.{e}.w1/w3/w2`` stacked as ``ffn_{gate,up,down}_exps``,
the router ``ffn_gate_inp``, ``expert_bias`` as ``exp_probs_b.bias``; the FFN width of
the dense layers as it is (no adjustment).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gguf

from modelc.families.contract import Family, GGUFMeta
from modelc.families.deepseek2 import gguf_routing
from modelc.families.lfm2 import FAMILY as LFM2
from modelc.families.lfm2 import lfm2_config, lfm2_gguf, lfm2_transform
from modelc.formats.ir import HParams, Routing, Tensor


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    hp = lfm2_config({**cfg, "block_auto_adjust_ff_dim": False})
    hp.n_expert = int(cfg["num_experts"])
    hp.n_expert_used = int(cfg["num_experts_per_tok"])
    hp.routing = Routing(
        gating="sigmoid",
        norm=bool(cfg.get("norm_topk_prob", True)),
        scale=float(cfg.get("routed_scaling_factor") or 1.0),
        n_dense_lead=int(cfg.get("num_dense_layers", 0)),
    )
    return hp


def _from_gguf(m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Any) -> None:
    lfm2_gguf(m, hp, tensors, meta)
    hp.routing = gguf_routing(m, 2)
    hp.routing.norm = True  # llama.cpp's lfm2 graph always renormalises


def _rename(name: str) -> str:
    return name + ".bias" if name.endswith(".expert_bias") else name


FAMILY = Family(
    name="lfm2moe",
    kind="text",
    decoder=LFM2.decoder,
    gguf_arch=gguf.MODEL_ARCH.LFM2MOE,
    gguf_names=("lfm2moe",),
    hf_classes=("Lfm2MoeForCausalLM",),
    model_types=("lfm2_moe",),
    from_config=_from_config,
    from_gguf=_from_gguf,
    rename=_rename,
    transform=lfm2_transform,
    required=LFM2.required,
)
