"""Gemma 4 (text, dense): Gemma 3's layers (the one decoder) and what Gemma 4 adds.

What transformers 5.23's ``modeling_gemma4.py`` and llama.cpp's ``src/models/gemma4.cpp``
compute beyond Gemma 3, each a feature of the decoder (``modelc.runtime.arch.gemma4``):

* **per-layer input embeddings** (E2B / E4B): ``per_layer_token_embd`` (vocab, layers*p)
  times sqrt(p), plus the RMS-normed projection of the scaled embeddings
  (``per_layer_model_proj`` / sqrt(d), ``per_layer_proj_norm``), over sqrt(2); after its
  FFN each layer adds ``post_norm(proj(gelu(inp_gate(x)) * its slice))``;
* **KV sharing**: the last ``num_kv_shared_layers`` layers compute no K/V, they attend over
  those of the last earlier layer of their kind (windowed or global), and their FFN may
  be twice as wide (``use_double_wide_mlp``; per-layer ``feed_forward_length`` in GGUF);
* **global layers of their own shape**: ``global_head_dim`` (GGUF ``key_length``; the
  windowed layers' is ``key_length_swa``) and ``num_global_key_value_heads`` (GGUF's
  per-layer ``head_count_kv``); with ``attention_k_eq_v`` their values are the key
  projection's output (no ``attn_v``);
* **proportional RoPE** on global layers: a quarter of the head's pairs turn, at the
  frequencies of the whole head (theta 1e6); the others keep still (GGUF: ``rope_freqs``
  1 / 1e30); windowed layers turn all pairs at 10000 (``rope_freq_base_swa``);
* **V norms** (RMS, no weight), Q·K scale 1 (the Q/K norms carry it), a per-layer output
  scalar (``layer_output_scale``), final logit soft-capping;
* norms that multiply by ``w`` itself, not ``1 + w`` (the converter adds nothing).

* **the 26B-A4B's mixture**: beside each layer's FFN (normed after by
  ``post_ffw_norm_1``) a mixture of experts on the same residual (``pre_ffw_norm_2``
  before, ``post_ffw_norm_2`` after), the sum normed by ``post_ffw_norm``; its router
  (``ffn_gate_inp``) sees the residual RMS-normed, times ``ffn_gate_inp.scale`` and
  1/sqrt(d); softmax, top-k renormalised, times each expert's ``ffn_down_exps.scale``;
  experts GELU with gate and up fused (``ffn_gate_up_exps``).  ``n_expert`` stays 0 (the
  dense FFN is still required), ``n_expert_used`` is the top-k.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import gguf
import numpy as np

from modelc.errors import UnsupportedError
from modelc.families.contract import DecoderTraits, Family, GGUFMeta
from modelc.families.gemma2 import gemma_config
from modelc.families.llama import HF_LLAMA_MODULES, LLAMA_LORA_SLOTS
from modelc.formats.ir import HParams, Tensor

GEMMA4_DECODER = DecoderTraits(
    act="gelu_tanh", post_norms=True, embd_scale=True, gemma4_layers=True, default_ctx=8192
)
LOCAL_THETA = 10000.0
GLOBAL_THETA = 1_000_000.0


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    text = cfg.get("text_config")
    cfg = {**cfg, **text} if isinstance(text, Mapping) else cfg
    if (
        cfg.get("use_bidirectional_attention") == "all"
    ):  # an encoder (transformers halves the window)
        raise UnsupportedError("a Gemma 4 with bidirectional attention is not supported")
    hp = gemma_config(cfg, 6)
    if cfg.get("enable_moe_block"):  # n_expert stays 0: the mixture is beside the dense FFN
        hp.n_expert_used = int(cfg.get("top_k_experts") or 0)
    hp.attn_scale = 1.0
    params = cfg.get("rope_parameters") or {}
    glob = params.get("full_attention") or {}
    loc = params.get("sliding_attention") or {}
    hp.rope_theta = float(glob.get("rope_theta") or GLOBAL_THETA)
    hp.rope_theta_local = float(loc.get("rope_theta") or LOCAL_THETA)
    hd_global = int(cfg.get("global_head_dim") or hp.head_dim)
    hp.head_dim_global = hd_global if hd_global != hp.head_dim else 0
    kv_global = cfg.get("num_global_key_value_heads")
    if cfg.get("attention_k_eq_v") and kv_global and int(kv_global) != hp.n_head_kv:
        hp.n_head_kv_global = int(kv_global)
    kind = str(glob.get("rope_type") or "default")
    if kind == "proportional":
        part = float(glob.get("partial_rotary_factor", 1.0))
        hp.rope_dims_global = 2 * int(part * hd_global // 2)
    elif kind != "default":
        raise UnsupportedError(f"Gemma 4 RoPE type {kind!r} is not supported")
    hp.n_kv_shared = int(cfg.get("num_kv_shared_layers") or 0)
    hp.n_embd_per_layer = int(cfg.get("hidden_size_per_layer_input") or 0)
    return hp


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    if "blk.0.ffn_gate_inp.weight" in tensors:  # as from_config: n_expert stays 0
        hp.n_expert_used = int(m("expert_used_count", 0))
        hp.n_expert = 0
    swa = m("attention.sliding_window_pattern", None)
    hp.norm_eps = float(m("attention.layer_norm_rms_epsilon", 1e-6))
    hp.rope_style = "neox"
    hp.activation = "gelu_tanh"
    hp.tie_embeddings = "output.weight" not in tensors
    hp.attn_scale = 1.0
    hp.final_softcap = float(m("final_logit_softcapping", 0.0))
    hp.sliding_window = int(m("attention.sliding_window", 0))
    windowed = [bool(s) for s in swa] if isinstance(swa, list) else [True] * hp.n_layer
    hp.window_layers = [i for i, s in enumerate(windowed) if s] if hp.sliding_window else []
    hp.rope_theta = float(m("rope.freq_base", GLOBAL_THETA))
    hp.rope_theta_local = float(m("rope.freq_base_swa", LOCAL_THETA))
    hd_global = int(m("attention.key_length", hp.head_dim))
    hp.head_dim = int(m("attention.key_length_swa", hd_global))
    hp.head_dim_global = hd_global if hd_global != hp.head_dim else 0
    kv = m("attention.head_count_kv", hp.n_head)
    if isinstance(kv, list):
        local = [int(k) for k, s in zip(kv, windowed, strict=True) if s]
        glob = [int(k) for k, s in zip(kv, windowed, strict=True) if not s]
        hp.n_head_kv = local[0] if local else glob[0]
        hp.n_head_kv_global = glob[0] if glob and glob[0] != hp.n_head_kv else 0
    else:
        hp.n_head_kv = int(kv)
    if "rope_freqs.weight" in tensors:  # 1: the pair turns, 1e30: it keeps still
        factors = np.asarray(tensors["rope_freqs.weight"].data(), np.float32)
        hp.rope_dims_global = 2 * int(np.count_nonzero(factors < 1e20))
    hp.n_kv_shared = int(m("attention.shared_kv_layers", 0))
    hp.n_embd_per_layer = int(m("embedding_length_per_layer_input", 0))


def _rename(name: str) -> str:
    """A Gemma4ForConditionalGeneration's text weights under Gemma4ForCausalLM's names;
    ``layer_scalar`` as a ``.weight``, as the converter names it."""
    name = re.sub(r"^(model\.)?language_model\.(model\.)?", "model.", name)
    if name.endswith(("layer_scalar", "experts.gate_up_proj", "experts.down_proj")):
        return name + ".weight"
    return name


# the router's scales, which GGUF names as ``.scale`` of the router and the experts' down
_ROUTER_SCALES = {
    f"model.layers.{i}.router.{hf}": f"blk.{i}.{gg}"
    for i in range(256)
    for hf, gg in (("scale", "ffn_gate_inp.scale"), ("per_expert_scale", "ffn_down_exps.scale"))
}


def _shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    hd0 = hp.head_dim if 0 in hp.window_layers else hp.head_dim_global or hp.head_dim
    return {"blk.0.attn_q.weight": (hp.n_head * hd0, hp.n_embd)}


FAMILY = Family(
    name="gemma4",
    kind="text",
    decoder=GEMMA4_DECODER,
    gguf_arch=gguf.MODEL_ARCH.GEMMA4,
    gguf_names=("gemma4",),
    hf_classes=("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"),
    model_types=("gemma4_text", "gemma4"),
    drop=re.compile(
        r"rotary_emb\.|^lm_head\.weight$|vision_tower|audio_tower|embed_vision|embed_audio"
        r"|multi_modal_projector"
    ),
    from_config=_from_config,
    from_gguf=_from_gguf,
    rename=_rename,
    own_names=_ROUTER_SCALES,
    required=(
        "attn_norm.weight",
        "attn_q.weight",
        "attn_q_norm.weight",
        "attn_output.weight",
        "post_attention_norm.weight",
        "ffn_norm.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
        "post_ffw_norm.weight",
    ),
    shapes=_shapes,
    # Q/K/V live in the gemma4 layers' own attention (runtime/arch/gemma4.py), not patched yet
    lora_slots={
        k: v for k, v in LLAMA_LORA_SLOTS.items() if k not in ("attn_q", "attn_k", "attn_v")
    },
    lora_modules=HF_LLAMA_MODULES,
)
