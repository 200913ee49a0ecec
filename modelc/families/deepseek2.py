"""DeepSeek V2 / V3 (``deepseek2``: DeepSeek-V2(-Lite), V3, R1, Kimi-K2 and their kin):
multi-head latent attention and mixtures with shared experts and grouped routing.

Attention (:mod:`modelc.runtime.arch.mla`): Q from ``attn_q`` or through a low-rank pair
(``attn_q_a``, its norm, ``attn_q_b``); ``attn_kv_a_mqa`` gives each token a latent of
``kv_rank`` (normed by ``attn_kv_a_norm``) and a RoPE key part of ``rope_dim`` shared by
every head; ``attn_k_b`` / ``attn_v_b`` (what llama.cpp's converter splits HF's
``kv_b_proj`` into; an HF directory's ``attn_kv_b`` is split at load) expand the latent
into the heads' keys and values.  The cache keeps only the latent and the rotated key
part, as llama.cpp does.  RoPE: interleaved pairs (the converter permutes nothing);
YaRN's ``mscale_all_dim`` scales Q·K by its mscale squared.

FFN: the first ``first_k_dense_replace`` layers dense, then mixtures with
``n_shared_experts`` always-on experts and the router of
:class:`~modelc.formats.ir.Routing` (V2: softmax, greedy top-k; V3: sigmoid scores plus
``e_score_correction_bias`` for the choice, the best ``topk_group`` of ``n_group``
groups by their two best scores, renormalised, times ``routed_scaling_factor``).  V2's
``group_limited_greedy`` (the 236B model) scores a group by its best expert in
transformers; llama.cpp, and modelc with it, by its best two.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import gguf

from modelc.errors import UnsupportedError
from modelc.families.contract import DecoderTraits, Family, GGUFMeta, hf_rope
from modelc.families.llama import gguf_hparams
from modelc.formats.ir import HParams, LatentAttention, Routing, Tensor


def _mscale(factor: float, m: float) -> float:
    """YaRN's magnitude correction, as DeepSeek's ``yarn_get_mscale``."""
    return 0.1 * m * math.log(factor) + 1.0 if factor > 1 else 1.0


def _scale(hp: HParams, mscale_all: float) -> None:
    """Q·K scale 1/sqrt(nope + rope) times YaRN's mscale squared; cos/sin unscaled."""
    rs = hp.rope_scaling
    m = _mscale(rs.factor, mscale_all) if rs.type == "yarn" and mscale_all else 1.0
    hp.attn_scale = m * m / math.sqrt(hp.head_dim)
    if rs.type == "yarn":
        rs.attn_factor = 1.0


def hf_routing(cfg: Mapping[str, Any], gating: str) -> Routing:
    """A DeepSeek-style mixture's routing from ``config.json`` (deepseek2, glm4moe)."""
    if gating not in ("softmax", "sigmoid"):
        raise UnsupportedError(f"expert scoring {gating!r} is not supported (softmax, sigmoid)")
    return Routing(
        gating=gating,
        norm=bool(cfg.get("norm_topk_prob", False)),
        scale=float(cfg.get("routed_scaling_factor") or 1.0),
        n_group=int(cfg.get("n_group") or 0),
        n_group_used=int(cfg.get("topk_group") or 0),
        n_shared=int(cfg.get("n_shared_experts") or 0),
        n_dense_lead=int(cfg.get("first_k_dense_replace") or 0),
    )


def gguf_routing(m: GGUFMeta, default_gating: int) -> Routing:
    """The same from the ``{arch}.expert_*`` keys (gating 1 softmax, 2 sigmoid; absent:
    ``default_gating``, as llama.cpp defaults per architecture)."""
    gating = int(m("expert_gating_func", 0)) or default_gating
    if gating not in (1, 2):
        raise UnsupportedError(f"expert gating function {gating} is not supported (1, 2)")
    return Routing(
        gating="sigmoid" if gating == 2 else "softmax",
        norm=bool(m("expert_weights_norm", False)),
        scale=float(m("expert_weights_scale", 0.0)) or 1.0,
        n_group=int(m("expert_group_count", 0)),
        n_group_used=int(m("expert_group_used_count", 0)),
        n_shared=int(m("expert_shared_count", 0)),
        n_dense_lead=int(m("leading_dense_block_count", 0)),
    )


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    n_head = int(cfg["num_attention_heads"])
    nope, rope = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"])
    theta, scaling = hf_rope(cfg)
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if scaling.type == "yarn" and _mscale(scaling.factor, float(rs.get("mscale") or 1)) != (
        _mscale(scaling.factor, float(rs.get("mscale_all_dim") or 1))
    ):
        raise UnsupportedError(
            "this DeepSeek config's YaRN has mscale != mscale_all_dim (cos/sin scaled on the "
            "RoPE part only), which modelc does not run; the released models have them equal"
        )
    n_expert = int(cfg.get("n_routed_experts") or 0)
    hp = HParams(
        n_vocab=int(cfg["vocab_size"]),
        n_ctx=int(cfg.get("max_position_embeddings", 4096)),
        n_embd=int(cfg["hidden_size"]),
        n_layer=int(cfg["num_hidden_layers"]),
        n_head=n_head,
        n_head_kv=1,  # MQA over the latent, as llama.cpp runs it
        n_ff=int(cfg["intermediate_size"]),
        head_dim=nope + rope,
        n_expert=n_expert,
        n_expert_used=int(cfg.get("num_experts_per_tok") or 0),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_style="interleaved",
        rope_scaling=scaling,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        activation="silu",
        mla=LatentAttention(
            q_rank=int(cfg.get("q_lora_rank") or 0),
            kv_rank=int(cfg["kv_lora_rank"]),
            nope_dim=nope,
            rope_dim=rope,
            v_dim=int(cfg["v_head_dim"]),
        ),
        routing=hf_routing(cfg, str(cfg.get("scoring_func") or "softmax")) if n_expert else None,
    )
    _scale(hp, float(rs.get("mscale_all_dim") or 0))
    return hp


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    """The ``deepseek2.*`` keys the converter writes (``key_length`` is the latent's)."""
    gguf_hparams(m, hp, tensors, meta)
    rank, rope = int(m("attention.kv_lora_rank", 0)), int(m("rope.dimension_count", 0))
    k_mla = int(m("attention.key_length_mla", 0)) or int(m("attention.key_length", 0))
    if not rank or not rope or not k_mla:
        raise UnsupportedError(
            "this deepseek2 GGUF has no MLA keys (attention.kv_lora_rank, key_length_mla, "
            "rope.dimension_count); re-convert it with a current convert_hf_to_gguf.py"
        )
    hp.head_dim = k_mla
    hp.n_head_kv = 1
    hp.mla = LatentAttention(
        q_rank=int(m("attention.q_lora_rank", 0)),
        kv_rank=rank,
        nope_dim=k_mla - rope,
        rope_dim=rope,
        v_dim=int(m("attention.value_length_mla", 0)) or k_mla - rope,
    )
    if hp.n_expert:
        hp.routing = gguf_routing(m, default_gating=1)
    # the converter writes 0.1 * mscale_all_dim (llama.cpp divides it back)
    _scale(hp, float(m("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1)


def _rename(name: str) -> str:
    return name.replace("e_score_correction_bias", "e_score_correction.bias")


def _shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    assert hp.mla is not None
    return {"blk.0.attn_kv_a_mqa.weight": (hp.mla.kv_rank + hp.mla.rope_dim, hp.n_embd)}


FAMILY = Family(
    name="deepseek2",
    kind="text",
    decoder=DecoderTraits(default_ctx=4096),
    gguf_arch=gguf.MODEL_ARCH.DEEPSEEK2,
    gguf_names=("deepseek2",),
    hf_classes=("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
    model_types=("deepseek_v2", "deepseek_v3"),
    drop=re.compile(r"rotary_emb\.inv_freq$|(^|\.)layers\.\d+\.(embed_tokens|enorm|hnorm|eh_proj)"),
    from_config=_from_config,
    from_gguf=_from_gguf,
    rename=_rename,
    required=(
        "attn_norm.weight",
        "attn_kv_a_mqa.weight",
        "attn_kv_a_norm.weight",
        "attn_output.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
    ),
    output_required=True,
    shapes=_shapes,
)
