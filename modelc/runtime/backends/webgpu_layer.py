"""What the resident WebGPU decoder (:mod:`.webgpu_llama`) runs of a decoder's one
description, and a layer's weights on the device: :func:`webgpu_host` refuses the rest in
one line before any GPU work (the engine then runs the model op by op), :class:`_Layer`
holds a block's norms, biases and matrices (a mixture's experts as
:class:`~.webgpu_moe.MoeLayer`)."""

from __future__ import annotations

import numpy as np

from modelc.errors import UnsupportedError
from modelc.formats.ir import LatentAttention, ModelIR
from modelc.runtime.arch import build
from modelc.runtime.arch.decoder import Decoder, DecoderBlock, refuse_unsupported
from modelc.runtime.arch.decoder_block import block_mats
from modelc.runtime.arch.shortconv import ShortConv
from modelc.runtime.backend import Weight
from modelc.runtime.backends.numpy_ref import NumpyBackend
from modelc.runtime.backends.webgpu import DEQ
from modelc.runtime.backends.webgpu_conv import ConvLayer
from modelc.runtime.backends.webgpu_device import Gpu, vec
from modelc.runtime.backends.webgpu_gemma4 import GEMMA4_RUNS, g4_mats, g4_widths
from modelc.runtime.backends.webgpu_mla import MlaLayer
from modelc.runtime.backends.webgpu_moe import MoeLayer, refuse_routing

# what the resident forward runs of the decoder's description (FEATURES names); the rest
# is refused (the engine then runs the model op by op)
WEBGPU_RUNS = frozenset(
    {
        "qkv_bias",
        "qk_norm",
        "gelu_tanh",
        "windows",
        "post_norms",
        "embd_scale",
        "local_rope",
        "attn_softcap",
        "final_softcap",
        "nope",
        "partial_rope",
        "no_pre_norms",
        "qk_norm_whole",
        "attn_temp",
        "yarn_full_only",
        "moe",
        "attn_sinks",
        "attn_out_bias",
        "moe_oai",
        "moe_routing",
        "qkv_bias+qk_norm",
        "chunked_attn",
        "qk_l2_norm",
        "moe_sigmoid_shared",
        # M-RoPE of text alone is RoPE (every section at the token's position); a step
        # with images is refused, and --mmproj keeps the op-level decoder
        "mrope",
        "imrope",
        "deepstack",
        "mla",
        "long_rope",  # phi3: within its original context, its short factors (as CUDA)
        "short_conv",  # lfm2 (webgpu_conv.py: the states stay the CPU's, moved each step)
    }
    | GEMMA4_RUNS  # gemma4's dense layer kinds (webgpu_gemma4.py)
)


class Layer:
    def __init__(
        self,
        gpu: Gpu,
        b: DecoderBlock,
        scaled_input: bool = False,
        mla: LatentAttention | None = None,
        eps: float = 0.0,
    ) -> None:
        # a mixture's experts in place of the FFN (webgpu_moe.py)
        self.moe = None if b.experts is None else MoeLayer(gpu, b.experts, scaled_input)
        # a short convolution in place of attention (lfm2: webgpu_conv.py)
        self.conv = None
        if b.mixer is not None:
            assert isinstance(b.mixer, ShortConv)  # webgpu_host refuses the other mixers
            self.conv = ConvLayer(gpu, b.mixer)
        # latent attention in place of Q/K/V (webgpu_mla.py)
        self.mla = None
        if b.mla is not None:
            assert mla is not None
            self.mla = MlaLayer(gpu, b.mla, mla, eps)
        # gpt-oss: each head's sink logit, the attention output's bias
        self.sinks = None if b.sinks is None else vec(gpu, b.sinks, "sinks")
        self.bo = None if b.bo is None else vec(gpu, b.bo, "bo")
        # None: no pre-norm (olmo2: the branch reads the residual stream as it is)
        self.attn_norm = None if b.attn_norm is None else vec(gpu, b.attn_norm, "attn_norm")
        self.ffn_norm = None if b.ffn_norm is None else vec(gpu, b.ffn_norm, "ffn_norm")
        self.wq, self.wk, self.wv, self.wo = b.wq, b.wk, b.wv, b.wo
        self.gate, self.up, self.down = b.w_gate, b.w_up, b.w_down
        self.ff = 0 if b.w_gate is None else int(b.w_gate.shape[0])
        # gate and up as one weight (one product a step, each row of the output gate then
        # up), where they share a type and width; else two products into those halves
        self.gate_up: Weight | None = None
        g, u = b.w_gate, b.w_up
        if g is not None and u is not None and g.dtype == u.dtype and g.shape == u.shape:
            data = np.concatenate([g.data, u.data])
            self.gate_up = Weight(g.dtype, (2 * self.ff, g.shape[1]), data)
        # per-head Q/K norms (qwen3): each head's row of q and of k RMS-normed in place (or
        # the whole projection's row, olmo2: Decoder's qk_norm_whole)
        self.qk_norm = None
        if b.q_norm is not None and b.k_norm is not None:
            self.qk_norm = (vec(gpu, b.q_norm, "q_norm"), vec(gpu, b.k_norm, "k_norm"))
        # norms of the attention's and the FFN's outputs before the residual adds them (gemma)
        self.post = tuple(
            None if w is None else vec(gpu, w, label)
            for w, label in ((b.post_attn_norm, "post_attn"), (b.post_ffw_norm, "post_ffw"))
        )
        bias = (b.bq, b.bk, b.bv)
        self.bias = (
            tuple(vec(gpu, x, "bias") for x in bias) if all(x is not None for x in bias) else None
        )

    def mats(self) -> list[Weight]:
        mixer: list[Weight | None]
        ffn: list[Weight | None]
        if self.conv is not None:  # its in- and out-projections (no W_o of its own)
            mixer = [*self.conv.mats()]
        elif self.mla is not None:
            mixer = [*self.mla.mats(), self.wo]
        else:
            mixer = [self.wq, self.wk, self.wv, self.wo]
        if self.moe is not None:
            ffn = [*self.moe.mats()]
        else:
            ffn = [self.gate, self.up] if self.gate_up is None else [self.gate_up]
            ffn.append(self.down)
        out = [w for w in (*mixer, *ffn) if w is not None]
        assert len(out) == len(mixer) + len(ffn), "a block lacks a matrix the step reads"
        return out


def webgpu_host(ir: ModelIR) -> Decoder:
    """The host model of ``ir`` (numpy: no GPU work), after refusing in one line what the
    resident forward does not run."""
    host = build(ir, NumpyBackend())
    if not isinstance(host, Decoder):
        raise UnsupportedError(f"{ir.architecture} models are not the one decoder")
    sp = host.spec
    refuse_unsupported(sp, "the resident WebGPU decoder", WEBGPU_RUNS, "it runs op by op")
    mats = [w for b in host.blocks for w in block_mats(b)] + [host.tok_embd, host.output]
    widths = {sp.d, sp.n_head * sp.head_dim, sp.n_head_kv * sp.head_dim}
    if host.g4 is not None:  # its attention's and per-layer inputs' matrices and widths
        mats += g4_mats(host.g4)
        widths |= g4_widths(host.g4, sp.n_head)
    widths |= {int(b.w_gate.shape[0]) for b in host.blocks if b.w_gate is not None}
    for b in host.blocks:  # latent attention's and experts' matrices, the experts' routing
        if b.mixer is not None:
            if not isinstance(b.mixer, ShortConv):  # the feature check names it first
                raise UnsupportedError(f"{type(b.mixer).__name__} layers are not run here")
            mats += [b.mixer.w_in, b.mixer.w_out]
        if b.mla is not None:
            mats += [b.mla.wq, b.mla.wkv_a, *([b.mla.wq_a] if b.mla.wq_a is not None else [])]
        if b.bo is not None and b.post_attn_norm is not None:
            raise UnsupportedError("an attention output bias before a post-norm is not run here")
        if b.experts is not None:
            refuse_routing(b.experts)
            if b.post_ffw_norm is not None:
                raise UnsupportedError("a mixture with a post-FFN norm is not run here")
            e = b.experts
            mats += [e.router, e.gate[0], e.up[0], e.down[0], *(e.shared or ())]
            widths |= {int(w.shape[0]) for w in (e.gate[0], *(e.shared or ()))}
    odd = sorted({w.dtype.name for w in mats if w.dtype not in DEQ})
    if odd:
        raise UnsupportedError(f"this model has {', '.join(odd)} weights, which have no shader")
    if any(w % 4 for w in widths) or sp.head_dim % 2:
        raise UnsupportedError(f"widths {sorted(widths)} are not all multiples of 4")
    return host
