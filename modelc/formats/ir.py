"""The one in-memory model IR that every format reader produces and the packer consumes.

Conventions (shared by every layer above):

* Tensor names are canonical GGUF-style names (``token_embd.weight``,
  ``blk.{i}.attn_q.weight``, ``output_norm.weight``...), whatever the source format.
  ``modelc.formats.arch`` maps Hugging Face names onto them.
* Shapes are numpy (row-major, outermost first) order.  A linear weight is
  ``(out_features, in_features)``, as in ``torch.nn.Linear`` and in GGUF.
* LLaMA Q/K projection rows use the GGUF ("interleaved pairs") RoPE layout; readers
  of Hugging Face checkpoints permute them at load (``hparams.rope_style`` records
  what the runtime must do).
* A block-quantized tensor's ``data()`` is ``uint8`` of shape ``(rows, row_bytes)``
  holding the raw GGML blocks of each row; ``shape`` stays the logical shape.
* Tensors are loaded lazily (``Tensor.data()``), so the packer can stream a model
  tensor by tensor and never hold more than one in memory.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np


class DType(enum.StrEnum):
    """Element types. The block-quantized ones are GGML's, bit for bit."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    F64 = "f64"
    I8 = "i8"
    I16 = "i16"
    I32 = "i32"
    I64 = "i64"
    U8 = "u8"
    BOOL = "bool"
    Q4_0 = "q4_0"
    Q4_1 = "q4_1"
    Q5_0 = "q5_0"
    Q5_1 = "q5_1"
    Q8_0 = "q8_0"
    Q2_K = "q2_k"
    Q3_K = "q3_k"
    Q4_K = "q4_k"
    Q5_K = "q5_k"
    Q6_K = "q6_k"
    IQ4_NL = "iq4_nl"
    IQ4_XS = "iq4_xs"
    MXFP4 = "mxfp4"  # gpt-oss's experts: E2M1 values, one E8M0 scale per 32
    # modelc's own pack-time quantization: per-row symmetric int8 with an f32 scale
    # at the start of each row (row = 4 + cols bytes).
    INT8 = "int8"

    @property
    def is_block_quantized(self) -> bool:
        return self in BLOCK_SIZES

    @property
    def is_quantized(self) -> bool:
        return self in BLOCK_SIZES or self is DType.INT8


# block-quantized dtype -> (elements per block, bytes per block); equal to gguf.GGML_QUANT_SIZES
BLOCK_SIZES: dict[DType, tuple[int, int]] = {
    DType.Q4_0: (32, 18),
    DType.Q4_1: (32, 20),
    DType.Q5_0: (32, 22),
    DType.Q5_1: (32, 24),
    DType.Q8_0: (32, 34),
    DType.Q2_K: (256, 84),
    DType.Q3_K: (256, 110),
    DType.Q4_K: (256, 144),
    DType.Q5_K: (256, 176),
    DType.Q6_K: (256, 210),
    DType.IQ4_NL: (32, 18),
    DType.IQ4_XS: (256, 136),
    DType.MXFP4: (32, 17),
}

NUMPY_DTYPES: dict[DType, np.dtype[Any]] = {
    DType.F32: np.dtype(np.float32),
    DType.F16: np.dtype(np.float16),
    DType.BF16: np.dtype(np.uint16),  # raw bf16 bits; dequantize with formats.quants
    DType.F64: np.dtype(np.float64),
    DType.I8: np.dtype(np.int8),
    DType.I16: np.dtype(np.int16),
    DType.I32: np.dtype(np.int32),
    DType.I64: np.dtype(np.int64),
    DType.U8: np.dtype(np.uint8),
    DType.BOOL: np.dtype(np.bool_),
}


def row_bytes(dtype: DType, cols: int) -> int:
    """Bytes one row of ``cols`` elements occupies in ``dtype``."""
    if dtype in BLOCK_SIZES:
        bs, ts = BLOCK_SIZES[dtype]
        if cols % bs:
            raise ValueError(f"{dtype} rows need a multiple of {bs} columns, got {cols}")
        return cols // bs * ts
    if dtype is DType.INT8:
        return 4 + cols
    return cols * NUMPY_DTYPES[dtype].itemsize


def aligned(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``a`` itself when its elements lie at addresses of their own size's multiple, else
    an aligned copy of it (a plain array).

    A view of a file starts where the format put the bytes: a zip member's data follows a
    local header of any length (``torch.save`` pads it to 64 bytes, other zip writers do
    not), a safetensors header or an ONNX external offset need not be padded.  numpy gives
    a misaligned array no BLAS: every ``@`` copies all of it first, so a tied GPT-2 head read
    from an unpadded ``.bin`` decoded 30 times slower than from safetensors.  The readers
    pass their views through here, so a misaligned tensor is copied once, when loaded.
    """
    return a if a.flags.aligned else np.array(a)


def nbytes(dtype: DType, shape: tuple[int, ...]) -> int:
    """Bytes a tensor of this dtype and logical shape occupies."""
    if not shape:
        return row_bytes(dtype, 1)
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    return rows * row_bytes(dtype, shape[-1])


@dataclass(slots=True)
class Tensor:
    """One named tensor whose bytes are produced on demand (memory-mapped where possible)."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    loader: Callable[[], np.ndarray[Any, Any]] = field(repr=False)

    def data(self) -> np.ndarray[Any, Any]:
        """Plain dtypes: an array of ``shape`` and ``NUMPY_DTYPES[dtype]``; quantized: uint8 ``(rows, row_bytes)``."""
        return self.loader()

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return nbytes(self.dtype, self.shape)


class RopeScaling(msgspec.Struct, kw_only=True, omit_defaults=True):
    type: str = "none"  # "none" | "linear" | "llama3" | "yarn" | "longrope" | "factors"
    # ("factors": GGUF's rope_freqs, per-pair divisors in short_factor)
    factor: float = 1.0
    original_max_position: int = 0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    attn_factor: float = 0.0  # yarn, longrope: cos/sin multiplier; 0: the type's default
    # yarn: round the ramp's ends to whole dimensions (llama.cpp; transformers' "truncate")
    truncate: bool = True
    # longrope (Phi-3): per-pair divisors of the frequencies, short up to the original context
    short_factor: list[float] = msgspec.field(default_factory=list)
    long_factor: list[float] = msgspec.field(default_factory=list)


class LatentAttention(msgspec.Struct, kw_only=True, omit_defaults=True):
    """DeepSeek's multi-head latent attention (``deepseek2``): per token one compressed
    latent (``kv_rank``) and one shared RoPE key part (``rope_dim``) are cached; the per-head
    keys' ``nope_dim`` dimensions and the values (``v_dim``) come from the latent."""

    q_rank: int = 0  # Q through a low-rank pair (attn_q_a / attn_q_b); 0: one attn_q
    kv_rank: int = 0
    nope_dim: int = 0  # per head: key dimensions without RoPE
    rope_dim: int = 0  # per head (shared by all): rotated key dimensions
    v_dim: int = 0  # per head: value dimensions


class Routing(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How a mixture picks and weighs a token's experts, beyond softmax top-k renormalised
    (Mixtral, Qwen3-MoE): DeepSeek's and GLM's gating, groups, shared experts and scale."""

    gating: str = "softmax"  # "softmax" | "sigmoid" (scores before the top-k)
    norm: bool = True  # renormalise the chosen experts' weights to sum to 1
    scale: float = 1.0  # the weights times this (routed_scaling_factor)
    n_group: int = 0  # experts in n_group groups; the token's top n_group_used groups only
    n_group_used: int = 0
    n_shared: int = 0  # shared experts (ffn_*_shexp), every token through them
    n_dense_lead: int = 0  # the first layers have a dense FFN


class HParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Hyper-parameters; each architecture documents which fields it needs."""

    n_vocab: int = 0
    n_ctx: int = 0  # trained context length
    n_embd: int = 0
    n_layer: int = 0
    n_head: int = 0
    n_head_kv: int = 0
    n_ff: int = 0
    head_dim: int = 0
    n_expert: int = 0  # mixture of experts (qwen3moe, mixtral): experts a layer; 0: dense
    n_expert_used: int = 0  # experts each token goes through
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_style: str = "interleaved"  # "interleaved" (GGUF/llama.cpp NORM) | "neox"
    rope_dim: int = 0  # rotated dimensions of a head (partial RoPE: phi-4-mini, glm4moe); 0: all
    rope_scaling: RopeScaling = msgspec.field(default_factory=RopeScaling)
    tie_embeddings: bool = False
    sliding_window: int = 0  # llama/mistral: each query sees the last n positions; 0: all
    window_layers: list[int] = msgspec.field(default_factory=list)  # those windowed; []: all
    attn_chunk: int = 0  # llama4: RoPE layers attend within chunks of this many positions
    nope_layers: list[int] = msgspec.field(default_factory=list)  # smollm3: layers without RoPE
    rope_sections: list[int] = msgspec.field(default_factory=list)  # qwen2vl: M-RoPE's t/h/w
    rope_interleaved: bool = False  # qwen3vl: M-RoPE's sections interleaved (t h w t h w ..)
    n_deepstack: int = 0  # qwen3vl: layers after which DeepStack image features are added
    rope_theta_local: float = 0.0  # gemma3: the windowed layers' RoPE base, unscaled; 0: same
    attn_scale: float = 0.0  # Q·K scale (gemma: query_pre_attn_scalar^-0.5); 0: head_dim^-0.5
    attn_temp_scale: float = 0.0  # llama-4 attention temperature's beta (mistral3); 0: none
    attn_temp_floor: int = 0  # ... and its floor scale (the original context)
    attn_temp_offset: float = 0.0  # ... added to the position first (llama4: 1)
    qk_l2_norm: bool = False  # llama4: Q and K RMS-normed (no weight) after RoPE
    attn_softcap: float = 0.0  # gemma2: scores -> c * tanh(scores / c); 0: none
    final_softcap: float = 0.0  # gemma2: the same on the logits
    # gemma4: the global (unwindowed) layers' own head size and KV heads (0: as the others)
    # and the dimensions their RoPE turns, at the whole head's frequencies (0: all)
    head_dim_global: int = 0
    n_head_kv_global: int = 0
    rope_dims_global: int = 0
    n_kv_shared: int = (
        0  # gemma4: the last layers reuse the K/V of the last earlier one of their kind
    )
    n_embd_per_layer: int = 0  # gemma4: per-layer input embeddings' width; 0: none
    swiglu_limit: float = 0.0  # gpt-oss: the experts' SwiGLU clamped at this (alpha 1.702)
    activation: str = ""  # "silu" | "gelu" | "gelu_tanh" | "relu"
    n_token_types: int = 0  # bert
    pooling: str = ""  # bert: "mean" | "cls"
    normalize_embeddings: bool = False
    layer_sizes: list[int] = msgspec.field(default_factory=list)  # mlp
    mla: LatentAttention | None = None  # deepseek2
    routing: Routing | None = None  # deepseek2: mixtures routed otherwise than softmax top-k
    # hybrid recurrent layers (qwen35's Gated DeltaNet), GGUF's {arch}.ssm.* keys
    recurrent_layers: list[int] = msgspec.field(default_factory=list)  # which layers
    ssm_conv: int = 0  # the short causal convolution's width (ssm.conv_kernel)
    ssm_k_heads: int = 0  # key heads (ssm.group_count)
    ssm_v_heads: int = 0  # value heads (ssm.time_step_rank)
    ssm_head_k: int = 0  # key head size (ssm.state_size)
    ssm_inner: int = 0  # value heads x value head size (ssm.inner_size)
    # granite: the embeddings, each layer's residual branches and the logits scaled (0: not)
    embedding_scale: float = 0.0  # the embeddings times this
    residual_scale: float = 0.0  # each attention / recurrent / FFN output times this
    logit_scale: float = 0.0  # the logits divided by this


class TokenizerSpec(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Everything needed to rebuild the tokenizer, from GGUF metadata or tokenizer.json.

    ``model`` follows GGUF's ``tokenizer.ggml.model``: ``gpt2`` (byte-level BPE),
    ``llama`` (SentencePiece BPE with byte fallback), ``bert`` (WordPiece),
    ``gemma4`` (BPE by merge rank over ``▁``-escaped text, ``<0xXX>`` byte fallback),
    ``t5`` (SentencePiece Unigram), or ``hf`` when ``hf_json`` (a tokenizer.json text)
    is the whole definition.
    """

    model: str
    pre: str = ""
    tokens: list[str] = msgspec.field(default_factory=list)
    scores: list[float] = msgspec.field(default_factory=list)
    token_types: list[int] = msgspec.field(default_factory=list)
    merges: list[str] = msgspec.field(default_factory=list)
    bos_id: int | None = None
    eos_id: int | None = None
    eot_id: int | None = None
    pad_id: int | None = None
    unk_id: int | None = None
    sep_id: int | None = None
    cls_id: int | None = None
    mask_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool = False
    hf_json: str | None = None
    # ``t5`` (Unigram, llama.cpp's UGM): SentencePiece's normalization table and flag
    precompiled_charsmap: bytes = b""
    remove_extra_whitespaces: bool = False


class SourceInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    path: str
    format: str  # "gguf" | "safetensors" | "pytorch" | "onnx" | "hf-dir"
    size: int = 0
    sha256: str = ""


@dataclass
class ModelIR:
    """A model read from any format: architecture, hyper-parameters, lazy tensors, tokenizer."""

    architecture: str  # a family of modelc.families.registry, or "tokenizer"
    hparams: HParams
    tensors: dict[str, Tensor]
    source: SourceInfo
    tokenizer: TokenizerSpec | None = None
    chat_template: str | None = None
    # generation defaults (bos/eos already in tokenizer): temperature, top_p, ...
    generation: dict[str, Any] = field(default_factory=dict)
    # ONNX execution plan (see formats.onnx), stored verbatim in the manifest
    graph: dict[str, Any] | None = None
    # remaining source metadata worth keeping (msgpack-serialisable values only)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors.values())
