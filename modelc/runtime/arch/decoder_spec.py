"""What a decoder model computes, as data: :data:`FEATURES` (every optional part a
:class:`DecoderSpec` may use, and how a refusal names it), the spec itself, and the one
refusal (:func:`refuse_unsupported`) every backend makes of what it does not run.

:class:`~modelc.runtime.arch.decoder.Decoder` builds the spec from a family's
:class:`~modelc.families.contract.DecoderTraits` and hyper-parameters; the CPU backends run
it there, CUDA in :mod:`modelc.runtime.backends.cuda_llama` (``CUDA_RUNS``), ``modelc
compile`` in :mod:`modelc.compile.spec` (``COMPILE_RUNS``), each naming what it runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from modelc.errors import UnsupportedError

__all__ = ["FEATURES", "GQA_FEATURES", "DecoderSpec", "lacks", "refuse_unsupported"]

# every feature a DecoderSpec may use, and how a refusal names it; a backend names the
# subset it runs
FEATURES: dict[str, str] = {
    "qkv_bias": "Q/K/V biases",  # qwen2
    "qk_norm": "per-head Q/K norms",  # qwen3, gemma3
    "qkv_bias+qk_norm": "Q/K/V biases together with Q/K norms",
    "post_norms": "norms after attention and FFN",  # gemma
    "gelu_tanh": "a GELU FFN",  # gemma
    "embd_scale": "scaled embeddings",  # gemma
    "windows": "sliding-window attention",  # mistral, gemma
    "local_rope": "a RoPE base of its own on windowed layers",  # gemma3
    "yarn_full_only": "YaRN on the full-attention layers only",  # olmo3
    "attn_softcap": "soft-capped attention scores",  # gemma2
    "final_softcap": "soft-capped logits",  # gemma2
    "long_rope": "LongRoPE long factors",  # phi3
    "partial_rope": "partial RoPE (rotary dimensions below the head size)",
    "moe": "mixtures of experts",  # mixtral, qwen3moe
    "attn_sinks": "attention sinks",  # gpt-oss
    "attn_out_bias": "attention output biases",  # gpt-oss
    "moe_oai": "gpt-oss's experts (router and expert biases, a clamped SwiGLU)",
    "nope": "layers without RoPE (NoPE)",  # smollm3
    "no_pre_norms": "post-norms without pre-norms",  # olmo2
    "qk_norm_whole": "Q/K norms over the whole projection",  # olmo2
    "attn_temp": "attention temperature tuning by position",  # mistral3, llama4
    "mla": "multi-head latent attention",  # deepseek2
    "moe_routing": "grouped or sigmoid expert routing with shared experts",  # deepseek2
    # gemma4 (runtime/arch/gemma4.py)
    "head_shapes": "global layers with their own head size or KV head count",
    "kv_sharing": "layers reusing the keys and values of earlier ones",
    "v_norm": "normed values",
    "values_from_keys": "values from the key projection",
    "proportional_rope": "proportional RoPE",
    "per_layer_embd": "per-layer input embeddings",
    "layer_scale": "per-layer output scales",
    "side_experts": "mixtures of experts beside the FFN",
    "qk_l2_norm": "Q/K L2 norms",  # llama4
    "moe_sigmoid_shared": "sigmoid-routed experts with a shared expert",  # llama4
    "attn_gate": "gated attention outputs",  # qwen35
    "gated_deltanet": "Gated DeltaNet linear attention (a recurrent state per sequence)",
    "chunked_attn": "chunked attention",  # llama4 (runtime/arch/chunked.py)
    "short_conv": "short-convolution layers (a recurrent state per sequence)",  # lfm2
    "mamba2": "Mamba-2 layers (a recurrent state per sequence)",  # granitehybrid
    "residual_scale": "scaled residual branches",  # granitehybrid
    "logit_scale": "scaled logits",  # granitehybrid
    "mrope": "M-RoPE (image positions by rows and columns)",  # qwen2vl (arch/mrope.py)
    "imrope": "interleaved M-RoPE",  # qwen3vl (arch/mrope.py)
    "deepstack": "DeepStack image features added into the first layers",  # qwen3vl
}


# the parts of the GQA decoder every compiled backend runs (CUDA, ``modelc compile``); each
# backend names its set from these, so a feature added to FEATURES is refused until a backend
# claims it
GQA_FEATURES = frozenset(
    {
        "qkv_bias",
        "qk_norm",
        "post_norms",
        "gelu_tanh",
        "embd_scale",
        "windows",
        "local_rope",
        "attn_softcap",
        "final_softcap",
        "long_rope",
    }
)


@dataclass(frozen=True, slots=True)
class DecoderSpec:
    """What one decoder model computes, as numbers: every backend runs this."""

    architecture: str
    n_layer: int
    d: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ctx: int
    eps: float
    scale: float  # Q·K scale, YaRN's attention factor squared included
    neox: bool  # rotate-half RoPE; else GGUF's interleaved pairs
    rot_dim: int  # rotated dimensions of a head (head_dim unless partial)
    act: str  # "silu" | "gelu_tanh"
    embd_scale: float  # embeddings times this; 0: not scaled
    post_norms: bool
    windows: tuple[int, ...]  # per layer: the sliding window, 0 for global attention
    local_rope: tuple[bool, ...]  # per layer: rotates with the local (windowed) base
    attn_softcap: float  # 0: none
    final_softcap: float  # 0: none
    long_rope_after: int  # LongRoPE: past this many positions the long factors; 0: never
    qkv_bias: tuple[bool, ...]  # per layer
    qk_norm: tuple[bool, ...]  # per layer
    moe: tuple[bool, ...]  # per layer: a mixture of experts
    n_expert_used: int
    attn_sinks: tuple[bool, ...] = ()  # per layer: a sink logit per head (gpt-oss)
    attn_out_bias: tuple[bool, ...] = ()  # per layer: attn_output has a bias
    moe_oai: bool = False  # gpt-oss's experts (moe_oai)
    nope: tuple[bool, ...] = ()  # per layer: no RoPE (smollm3); (): RoPE on every layer
    pre_norms: bool = True  # False: the layer input goes to attention / FFN unnormed (olmo2)
    qk_norm_whole: bool = False  # Q/K norms over all heads at once, not per head (olmo2)
    attn_temp: float = 0.0  # llama-4 temperature tuning's beta (mistral3); 0: none
    attn_temp_floor: int = 0  # ... its floor scale (positions a step)
    mla: bool = False  # multi-head latent attention (runtime/arch/mla.py)
    moe_routing: bool = False  # a mixture routed by HParams.routing (runtime/arch/moe.py)
    # gemma4: per layer, when a model has them (runtime/arch/gemma4.py)
    head_dims: tuple[int, ...] = ()  # each layer's head size; (): head_dim
    kv_heads: tuple[int, ...] = ()  # each layer's KV heads; (): n_head_kv
    kv_source: tuple[int, ...] = ()  # the cache layer each layer writes or reads; (): its own
    v_norm: bool = False
    values_from_keys: bool = False
    rope_dims_global: int = 0  # proportional RoPE: pairs turning on global layers, x2; 0: none
    per_layer_embd: int = 0  # per-layer inputs' width; 0: none
    layer_scale: bool = False
    side_experts: tuple[bool, ...] = ()  # per layer: a mixture beside the FFN
    attn_temp_offset: float = 0.0  # ... added to each position (llama4: 1)
    attn_temp_layers: tuple[bool, ...] = ()  # per layer: tuned (llama4: the NoPE layers)
    qk_l2_norm: tuple[bool, ...] = ()  # per layer: Q/K RMS-normed after RoPE (llama4)
    moe_sigmoid_shared: bool = False  # llama4's mixture (runtime/arch/llama4_moe.py)
    attn_gate: bool = False  # attention outputs times sigmoid(gate rows of attn_q)
    recurrent: tuple[bool, ...] = ()  # per layer: a recurrent layer in place of attention
    # per layer: the recurrent layer's FEATURES name ("gated_deltanet", "short_conv",
    # "mamba2"), "" for attention; (): Gated DeltaNet wherever recurrent
    mixers: tuple[str, ...] = ()
    residual_scale: float = 0.0  # each residual branch times this (granite); 0: none
    logit_scale: float = 0.0  # the logits divided by this (granite); 0: none
    chunks: tuple[int, ...] = ()  # per layer: attends within chunks of this; 0: not
    mrope_sections: tuple[int, ...] = ()  # M-RoPE's t/h/w pairs (qwen2vl); (): plain RoPE
    mrope_interleaved: bool = False  # the sections interleaved (qwen3vl)
    deepstack: int = 0  # layers after which images' DeepStack features are added (qwen3vl)
    # YaRN's cos/sin factor on the layers without local_rope only (olmo3: the windowed
    # layers rotate unscaled), then not in ``scale``; 0: none
    full_rope_mscale: float = 0.0

    def features(self) -> frozenset[str]:
        """The parts of :data:`FEATURES` this model uses."""
        used = {
            "qkv_bias": any(self.qkv_bias),
            "qk_norm": any(self.qk_norm),
            "qkv_bias+qk_norm": any(
                b and n for b, n in zip(self.qkv_bias, self.qk_norm, strict=True)
            ),
            "post_norms": self.post_norms,
            "gelu_tanh": self.act == "gelu_tanh",
            "embd_scale": bool(self.embd_scale),
            "windows": any(self.windows),
            "local_rope": any(self.local_rope),
            "yarn_full_only": bool(self.full_rope_mscale),
            "attn_softcap": bool(self.attn_softcap),
            "final_softcap": bool(self.final_softcap),
            "long_rope": bool(self.long_rope_after),
            "partial_rope": self.rot_dim != max(self.head_dims or (self.head_dim,)),
            "moe": any(self.moe),
            "attn_sinks": any(self.attn_sinks),
            "attn_out_bias": any(self.attn_out_bias),
            "moe_oai": self.moe_oai,
            "nope": any(self.nope),
            "no_pre_norms": not self.pre_norms,
            "qk_norm_whole": self.qk_norm_whole,
            "attn_temp": bool(self.attn_temp),
            "mla": self.mla,
            "moe_routing": self.moe_routing,
            "head_shapes": len(set(self.head_dims)) > 1 or len(set(self.kv_heads)) > 1,
            "kv_sharing": self.kv_source != tuple(range(len(self.kv_source))),
            "v_norm": self.v_norm,
            "values_from_keys": self.values_from_keys,
            "proportional_rope": bool(self.rope_dims_global),
            "per_layer_embd": bool(self.per_layer_embd),
            "layer_scale": self.layer_scale,
            "side_experts": any(self.side_experts),
            "qk_l2_norm": any(self.qk_l2_norm),
            "moe_sigmoid_shared": self.moe_sigmoid_shared,
            "attn_gate": self.attn_gate,
            "chunked_attn": any(self.chunks),
            "gated_deltanet": "gated_deltanet" in self.mixers
            or (any(self.recurrent) and not self.mixers),
            "short_conv": "short_conv" in self.mixers,
            "mamba2": "mamba2" in self.mixers,
            "residual_scale": bool(self.residual_scale),
            "logit_scale": bool(self.logit_scale),
            "mrope": bool(self.mrope_sections),
            "imrope": self.mrope_interleaved,
            "deepstack": bool(self.deepstack),
        }
        return frozenset(k for k, v in used.items() if v)


def lacks(spec: DecoderSpec, runs: Iterable[str]) -> str:
    """What ``spec`` uses that a forward running ``runs`` (names of :data:`FEATURES`) does
    not, as :data:`FEATURES` words them, comma-separated; "" when it runs every part."""
    return ", ".join(FEATURES[m] for m in sorted(spec.features() - set(runs)))


def refuse_unsupported(spec: DecoderSpec, where: str, runs: Iterable[str], hint: str) -> None:
    """The one refusal: UnsupportedError naming what ``spec`` uses that ``where`` does not
    run (``runs``: names of :data:`FEATURES`)."""
    what = lacks(spec, runs)
    if what:
        raise UnsupportedError(
            f"this {spec.architecture} model uses {what}, which {where} does not run yet; {hint}"
        )
