"""llama-quantize's quantization mixes: which type each tensor gets for ``--quantize q4_k_m`` & co.

A *mix* (llama.cpp's ``llama_ftype``: Q4_K_M, Q3_K_L, Q4_0, IQ4_XS, ...) names a default block
type and rules that give some tensors more bits: the output (or tied token embedding) in Q6_K,
``attn_v``, ``ffn_down`` and ``attn_output`` of some layers in more bits for the low-bit and
``_M``/``_L`` mixes, and a fallback to a 32-weight type when a row is not a whole number of
256-weight blocks (F16 when not even of 32).  This is ``llama_tensor_get_type`` of
llama.cpp's ``src/llama-quant.cpp`` for the mixes modelc can write, with the same counters, visiting the tensors in the same order (by layer, then name),
so a packed model's types equal those of ``llama-quantize`` on the same source.  Tensor
names are GGUF's (``blk.N.attn_v.weight``), which every modelc reader produces.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from modelc.formats.ir import BLOCK_SIZES, DType, HParams

# mix -> its default block type: every ``--quantize`` method that follows llama-quantize
MIXES: dict[str, DType] = {
    "q8_0": DType.Q8_0,
    "q4_0": DType.Q4_0,
    "q4_1": DType.Q4_1,
    "q5_0": DType.Q5_0,
    "q5_1": DType.Q5_1,
    "q2_k": DType.Q2_K,
    "q3_k_s": DType.Q3_K,
    "q3_k_m": DType.Q3_K,
    "q3_k_l": DType.Q3_K,
    "q4_k_s": DType.Q4_K,
    "q4_k_m": DType.Q4_K,
    "q5_k_s": DType.Q5_K,
    "q5_k_m": DType.Q5_K,
    "q6_k": DType.Q6_K,
    "iq4_nl": DType.IQ4_NL,
    "iq4_xs": DType.IQ4_XS,
}

# the K-quant mixes, by size
K_MIXES = ("q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k")
IQ4_MIXES = ("iq4_nl", "iq4_xs")

# a 256-weight type -> the 32-weight type it falls back to (tensor_type_fallback)
_FALLBACK = {
    DType.Q2_K: DType.Q4_0, DType.Q3_K: DType.Q4_0, DType.Q4_K: DType.Q5_0,
    DType.Q5_K: DType.Q5_1, DType.Q6_K: DType.Q8_0, DType.IQ4_XS: DType.IQ4_NL,
}  # fmt: skip

# substrings of 2-D weights llama-quantize never quantizes (tensor_allows_quantization)
_KEEP = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight",
    "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight",
    "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight",
    "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight",
    ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
    ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)  # fmt: skip
_NOT_QUANTIZED = frozenset({"position_embd.weight", "token_types.weight"})
_LAYER = re.compile(r"blk\.(\d+)\.")


def _layer(name: str) -> int:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else -1


def llama_order(names: Iterable[str]) -> list[str]:
    """Tensor names in llama.cpp's loader order: by layer (others first), then by name."""
    return sorted(names, key=lambda n: (_layer(n), n))


def allows_quantization(name: str, shape: tuple[int, ...]) -> bool:
    """llama-quantize quantizes 2-D and 3-D ``*weight`` tensors but norms, routers and a few
    small or positional tables."""
    if len(shape) < 2 or not name.endswith("weight") or name in _NOT_QUANTIZED:
        return False
    return not any(k in name for k in _KEEP)


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, cat in (
        ("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"),
        ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
        ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
        ("ffn_down", "ffn_down"),
    ):  # fmt: skip
        if key in name:
            return cat
    return "other"


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    return (
        i_layer < n_layers // 8
        or i_layer >= 7 * n_layers // 8
        or (i_layer - n_layers // 8) % 3 == 2
    )


@dataclass
class _State:
    """quantize_state_impl: the counters the rules read, advanced tensor by tensor."""

    mix: str
    arch: str
    n_layer: int
    n_expert: int
    is_70b: bool
    has_imatrix: bool
    tied: bool
    n_attention_wv: int
    n_gqa: int
    i_attention_wv: int = 0
    i_ffn_down: int = 0

    def _layer_of(self, counter: int, name: str) -> int:
        if self.n_expert > 1:  # experts are not consecutive: read the layer from the name
            return _layer(name)
        return counter

    def rule(self, name: str, shape: tuple[int, ...], t: DType) -> DType:
        """llama_tensor_get_type_impl for the mixes of MIXES."""
        cat = _category(name)
        if cat == "output" or (self.tied and cat == "token_embd"):
            if self.arch == "falcon" or shape[-1] % BLOCK_SIZES[t][0]:
                return DType.Q8_0
            return t if t is DType.Q8_0 else DType.Q6_K
        if cat == "attn_v":  # attn_v, attn_qkv and attn_kv_b: the values' projection
            t = self._attn_v(t)
            self.i_attention_wv += 1
            return t
        if cat == "attn_k":
            return DType.Q8_0 if self.n_expert == 8 else t
        if cat == "ffn_down":
            t = self._ffn_down(self._layer_of(self.i_ffn_down, name), t)
            self.i_ffn_down += 1
            return t
        if cat == "attn_output":
            return self._attn_output(t)
        return t  # token_embd (untied), attn_q, ffn_gate, ffn_up and the rest

    def _attn_v(self, t: DType) -> DType:
        mix, i, gqa4 = self.mix, self.i_attention_wv, self.n_gqa >= 4
        if mix == "q2_k":
            t = DType.Q4_K if gqa4 else DType.Q3_K
        elif mix == "q3_k_m":
            t = DType.Q5_K if i < 2 else DType.Q4_K
        elif mix == "q3_k_l" or (mix in IQ4_MIXES and gqa4):
            t = DType.Q5_K
        elif mix in ("q4_k_m", "q5_k_m") and _use_more_bits(i, self.n_attention_wv):
            t = DType.Q6_K
        elif mix == "q4_k_s" and i < 4:
            t = DType.Q5_K
        if self.is_70b and t in (DType.Q3_K, DType.Q4_K):
            t = DType.Q5_K
        return DType.Q8_0 if self.n_expert == 8 else t

    def _ffn_down(self, i: int, t: DType) -> DType:
        mix, n, falcon = self.mix, self.n_layer, self.arch == "falcon"
        more = _use_more_bits(i, n)
        if mix == "q2_k":
            return DType.Q3_K
        if mix == "q3_k_m":
            if i < n // 16:
                return DType.Q5_K
            return DType.Q4_K if not falcon or more else DType.Q3_K
        if mix == "q3_k_l":
            return DType.Q4_K if falcon else DType.Q5_K
        if mix == "q4_k_m":
            if falcon:
                return DType.Q6_K if i < n // 16 else DType.Q5_K if more else DType.Q4_K
            return DType.Q6_K if more else t
        if i < n // 8 and mix in IQ4_MIXES and not self.has_imatrix:
            return DType.Q5_K
        if mix == "q5_k_m" and more:
            return DType.Q6_K
        if mix == "q4_k_s" and not falcon and i < n // 8:
            return DType.Q5_K
        if mix in ("q4_0", "q5_0") and self.has_imatrix and i < n // 8:
            return DType.Q4_1 if mix == "q4_0" else DType.Q5_1
        return t

    def _attn_output(self, t: DType) -> DType:
        mix = self.mix
        if self.arch == "falcon":
            return DType.Q4_K if mix == "q3_k_l" else t
        if self.n_expert == 8:
            moe8 = ("q2_k", "q3_k_s", "q3_k_m", "q4_k_s", "q4_k_m", *IQ4_MIXES)
            return DType.Q5_K if mix in moe8 else t
        return {"q2_k": DType.Q3_K, "q3_k_m": DType.Q4_K, "q3_k_l": DType.Q5_K}.get(mix, t)


def _fallback(t: DType, cols: int) -> DType:
    """tensor_type_fallback: a type whose blocks fit a row of ``cols`` weights."""
    if cols % BLOCK_SIZES[t][0] == 0:
        return t
    t = _FALLBACK.get(t, t)
    return t if cols % BLOCK_SIZES[t][0] == 0 else DType.F16


def tensor_types(
    tensors: Iterable[tuple[str, tuple[int, ...]]],
    mix: str,
    arch: str,
    hp: HParams,
    *,
    has_imatrix: bool = False,
) -> dict[str, DType]:
    """The type llama-quantize's ``mix`` gives each tensor it quantizes, by name.

    ``tensors`` are (GGUF name, numpy shape) pairs; those left out of the result keep their
    type.  ``hp`` gives the layer count, heads and experts the rules read.
    """
    shapes = dict(tensors)
    names = llama_order(shapes)
    st = _State(
        mix=mix,
        arch=arch,
        n_layer=hp.n_layer,
        n_expert=hp.n_expert,
        is_70b=arch == "llama" and hp.n_layer == 80,
        has_imatrix=has_imatrix,
        tied="output.weight" not in shapes,
        n_attention_wv=sum(_category(n) == "attn_v" for n in names),
        n_gqa=hp.n_head // n_kv if (n_kv := hp.n_head_kv or hp.n_head) else 0,
    )
    out: dict[str, DType] = {}
    for name in names:
        shape = shapes[name]
        if not allows_quantization(name, shape):
            continue
        out[name] = _fallback(st.rule(name, shape, MIXES[mix]), shape[-1])
    return out
