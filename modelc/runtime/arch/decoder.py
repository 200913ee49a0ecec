"""The one decoder: every decoder-only family is this forward, driven by a
:class:`DecoderSpec` made from its :class:`~modelc.families.contract.DecoderTraits` (its
module under :mod:`modelc.families`) and hyper-parameters.  Every backend runs that
description: CPU/numpy/WebGPU through :meth:`Decoder.forward` here, CUDA through
:class:`~modelc.runtime.backends.cuda_llama.CudaLlama`, ``modelc compile`` through
:mod:`modelc.compile.spec`; each names the :data:`FEATURES` it runs and refuses the rest in
one place (:func:`refuse_unsupported`).

A layer, with the optional parts in brackets::

    h = attn_norm(x) | x [no pre-norms] (olmo2); q, k, v = h Wq [+ bq], h Wk [+ bk], h Wv [+ bv]
    [q, k = q_norm(q), k_norm(k)]            per head, before RoPE (qwen3, gemma3); over
                                             the whole projection (olmo2)
    rope(q, k)                               interleaved pairs or NeoX; [local base] on
                                             windowed layers (gemma3); [LongRoPE] (phi3);
                                             [none on NoPE layers] (smollm3)
    [q, k = rms(q), rms(k)]                  after RoPE, no weights (llama4)
    [q *= temperature(position)]             past the original context (mistral3; llama4's
                                             NoPE layers)
    o = attention(q, k, v) Wo [+ bo]  |  recurrent(h)   [window | chunks (llama4:
                                             arch/chunked.py)], [soft-capped scores] (gemma2),
                                             [sinks] (gpt-oss); [arch/recurrent.py]
    x += [r] o  |  x += post_attn_norm(o)    [post norms] (gemma); [r: granite]
    h = ffn_norm(x); f = act(h Wgate) * (h Wup) Wdown  |  experts(h)   [moe]; [sigmoid
                                             routing on the input + a shared expert] (llama4);
                                             [biased, clamped SwiGLU] (gpt-oss: arch/moe_oai.py)
    x += [r] f  |  x += post_ffw_norm(f)

with the embeddings [scaled] (gemma, granite), the logits [soft-capped] (gemma2) or [divided]
(granite).  Tensors have GGUF names; fused Q/K/V or gate/up (phi3) become row views.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

import modelc.runtime.arch.decoder_block as blk
from modelc.errors import UnsupportedError, UsageError
from modelc.families.contract import DecoderTraits, rope_attention_factor, rope_inv_freq
from modelc.families.registry import FAMILIES
from modelc.formats.ir import DType, HParams, ModelIR
from modelc.runtime.arch.attn_temp import attn_temperature
from modelc.runtime.arch.chunked import chunked_attend, layer_chunks
from modelc.runtime.arch.decoder_block import (
    DecoderBlock,
    layer_inv_freqs,
    layer_windows,
    opt_vec,
    shift_keys,
    split_rows,
)
from modelc.runtime.arch.decoder_spec import FEATURES, DecoderSpec, refuse_unsupported
from modelc.runtime.arch.deepstack import add_deepstack
from modelc.runtime.arch.gemma4 import Gemma4Layers, gemma4_layers, proportional_inv_freq
from modelc.runtime.arch.llama4_moe import llama4_moe_ffn
from modelc.runtime.arch.longrope import LongRope, long_rope_after
from modelc.runtime.arch.mla import latent_attention, latent_kv_shape, load_latent
from modelc.runtime.arch.moe import load_experts, moe_ffn
from modelc.runtime.arch.mrope import MRope
from modelc.runtime.arch.recurrent import load_mixer, mixer_forward
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.kv_cache import KVCache, KVShape
from modelc.runtime.model import (
    CausalLM,
    Scratch,
    SeqChunk,
    TensorSource,
    attend,
    begin_step,
    check_heads,
    check_rows,
    end_step,
    place_images,
)

# the spec's names are re-exported: every backend imports them from here
__all__ = ["FEATURES", "Decoder", "DecoderBlock", "DecoderSpec", "refuse_unsupported"]


class Decoder(CausalLM):
    """A decoder-only transformer described by its family's traits and hyper-parameters."""

    def __init__(self, ir: ModelIR, backend: Backend) -> None:
        traits = FAMILIES[ir.architecture].decoder
        if traits is None:
            raise UnsupportedError(f"{ir.architecture} is not a decoder-only family")
        hp = ir.hparams
        self.architecture = ir.architecture
        self.hparams: HParams = hp
        self.be = backend
        self.traits: DecoderTraits = traits
        src = TensorSource(ir)
        self.tok_embd = src.weight("token_embd.weight")  # (vocab, d)
        self.n_vocab = hp.n_vocab or self.tok_embd.shape[0]
        self.d = hp.n_embd or self.tok_embd.shape[1]
        self.n_head = hp.n_head
        self.n_head_kv = hp.n_head_kv or hp.n_head
        check_heads(ir, self.n_head, self.n_head_kv, self.n_head * (hp.head_dim or 1))
        self.head_dim = hp.head_dim or self.d // self.n_head
        self.n_ctx = hp.n_ctx or traits.default_ctx
        self.eps = hp.norm_eps
        windows = layer_windows(hp)
        g4 = gemma4_layers(ir, src, windows) if traits.gemma4_layers else None
        self.g4: Gemma4Layers | None = g4
        self.blocks = [self._block(ir, src, i) for i in range(hp.n_layer)]
        self.output_norm = src.vec(f"{traits.output_norm}.weight")
        self.output = src.weight("output.weight") if src.has("output.weight") else self.tok_embd
        self.neox = hp.rope_style == "neox"
        rot = hp.mla.rope_dim if hp.mla else (hp.rope_dim or self.head_dim)  # partial RoPE
        self.inv_freq = rope_inv_freq(rot, hp.rope_theta, hp.rope_scaling)
        self.inv_freq_local = (  # the windowed layers' own base (gemma3), unscaled
            rope_inv_freq(rot, hp.rope_theta_local, type(hp.rope_scaling)())
            if hp.rope_theta_local
            else self.inv_freq
        )
        if g4 is not None:  # the global layers' head size; proportional RoPE
            hd_g = hp.head_dim_global or self.head_dim
            rot = hp.rope_dims_global or hd_g
            self.inv_freq = proportional_inv_freq(hd_g, rot, hp.rope_theta)
        after = long_rope_after(hp)
        self.long_rope = LongRope(hp, rot, after) if after else None
        secs, inter = hp.rope_sections, hp.rope_interleaved  # M-RoPE (qwen2vl, qwen3vl)
        self.mrope = MRope(secs, self.inv_freq, inter) if secs else None
        # YaRN / LongRoPE scale cos and sin: each Q·K by the factor squared, unless only part
        # of each head rotates or the windowed layers rotate unscaled (olmo3): then the
        # (global) angle tables carry it, to the rotated dims alone
        mscale = rope_attention_factor(hp.rope_scaling)
        partial = (rot != self.head_dim or hp.rope_theta_local > 0) and mscale != 1.0
        self.rope_mscale = np.float32(mscale) if partial else None
        factor = 1.0 if partial else mscale**2
        self.scale = factor * hp.attn_scale if hp.attn_scale else factor / math.sqrt(self.head_dim)
        scale = math.sqrt(self.d) if traits.embd_scale else hp.embedding_scale  # gemma, granite
        self.embd_scale = np.float32(scale) if scale else None
        if hp.mla:
            self.kv_shape = latent_kv_shape(len(self.blocks), hp.mla)
        else:
            self.kv_shape = KVShape(len(self.blocks), self.n_head_kv, self.head_dim)
        self.rope_from = hp.mla.kv_rank if hp.mla else 0  # where a cached key's RoPE part starts
        chunks = layer_chunks(hp)  # a chunk's keys lie within a window of its size
        cache_windows = tuple(map(max, windows, chunks))  # one per cache layer
        if g4 is not None:  # a cache layer per layer writing K/V, of the largest head shape
            self.kv_shape = KVShape(g4.n_cache_layers, g4.cache_kv_heads, g4.cache_head_dim)
            cache_windows = windows[: g4.n_cache_layers]
        # a recurrent layer attends to nothing: a one-position window bounds its KV rows
        kv = tuple(1 if b.mixer else w for b, w in zip(self.blocks, cache_windows, strict=False))
        self.kv_windows = kv if any(kv) else ()
        local = self.inv_freq_local is not self.inv_freq
        n_layer = len(self.blocks)
        self.spec = DecoderSpec(
            architecture=ir.architecture,
            n_layer=len(self.blocks),
            d=self.d,
            n_head=self.n_head,
            n_head_kv=self.n_head_kv,
            head_dim=self.head_dim,
            n_vocab=self.n_vocab,
            n_ctx=self.n_ctx,
            eps=float(self.eps),
            scale=float(self.scale),
            neox=self.neox,
            rot_dim=2 * len(self.inv_freq),
            act=traits.act,
            embd_scale=float(self.embd_scale or 0.0),
            post_norms=traits.post_norms,
            windows=windows,
            local_rope=tuple(local and w > 0 for w in windows),
            attn_softcap=float(hp.attn_softcap),
            final_softcap=float(hp.final_softcap),
            long_rope_after=after,
            n_expert_used=hp.n_expert_used,
            nope=tuple(i in hp.nope_layers for i in range(len(self.blocks))),
            pre_norms=traits.pre_norms,
            attn_temp=float(hp.attn_temp_scale),
            attn_temp_floor=hp.attn_temp_floor,
            attn_temp_offset=hp.attn_temp_offset,
            attn_temp_layers=tuple(
                not traits.attn_temp_nope_only or i in hp.nope_layers for i in range(n_layer)
            ),
            qk_l2_norm=tuple(hp.qk_l2_norm and i not in hp.nope_layers for i in range(n_layer)),
            mla=hp.mla is not None,
            moe_routing=hp.routing is not None,
            **(g4.spec_fields(hp) if g4 is not None else {}),
            attn_gate=traits.attn_gate,
            chunks=chunks,
            residual_scale=hp.residual_scale,
            logit_scale=hp.logit_scale,
            mrope_sections=tuple(hp.rope_sections),
            mrope_interleaved=hp.rope_interleaved,
            deepstack=hp.n_deepstack,
            full_rope_mscale=mscale if partial and local else 0.0,
            **blk.block_fields(self.blocks, self.head_dim, traits.moe_sigmoid_shared),
        )
        self.state_shapes = {
            i: b.mixer.state_shapes() for i, b in enumerate(self.blocks) if b.mixer is not None
        }
        self.scratch = Scratch()
        self.ones_hd = np.ones(self.head_dim, np.float32)  # the weight of a plain RMS norm
        self.first, self.stop = 0, n_layer  # the layers this model runs (keep_layers)
        self.head = True  # it computes the logits (keep_layers)

    def keep_layers(self, first: int, stop: int, head: bool | None = None) -> None:
        """Run layers ``first .. stop-1`` only, as one part of a split model
        (:mod:`modelc.runtime.split`): :meth:`forward_part` takes and gives the hidden state
        where the part does not start / end the model; caches hold these layers only.
        ``head`` (default: where they end the model): this part computes the logits
        (:meth:`head_logits`); a part ending the model without it gives the hidden state of
        the rows whose logits are wanted."""
        n = len(self.blocks)
        if not 0 <= first < stop <= n or (self.first, self.stop) != (0, n):
            raise UsageError(f"cannot run layers {first}..{stop - 1} of {n} (a model splits once)")
        self.head = stop == n if head is None else head
        if (first, stop) == (0, n):
            return
        if self.g4 is not None or self.state_shapes:
            raise UnsupportedError(
                f"{self.architecture} models (shared KV or recurrent layers) cannot be split "
                "between devices; use --n-gpu-layers 0 or all"
            )
        self.kv_shape = dataclasses.replace(self.kv_shape, n_layer=stop - first)
        if self.long_rope is not None:  # no recomputing across parts: the short factors only
            self.n_ctx = min(self.n_ctx, self.long_rope.after)
        kv = self.kv_windows[first:stop]
        self.kv_windows = kv if any(kv) else ()
        self.first, self.stop = first, stop

    def forward_part(self, batch: Sequence[SeqChunk], hidden: F32Array | None) -> F32Array:
        """One step of this model's layers (:meth:`keep_layers`), from the token ids
        (``hidden`` None) or the hidden state (rows, d) of the part before; the hidden
        state (rows, d) after them (this step's scratch: copy it to keep it), or the
        logits if they end the model."""
        if (hidden is None) != (self.first == 0):
            raise UsageError(f"layers {self.first}.. take the hidden state, not token ids")
        return self._forward(batch, hidden)

    def _block(self, ir: ModelIR, src: TensorSource, i: int) -> DecoderBlock:
        """Block ``i``'s weights, fused tensors split into row views."""
        t, p = self.traits, f"blk.{i}."
        nq, nkv = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        nq *= 2 if t.attn_gate else 1  # each head's query, then its gate
        mla = load_latent(ir, src, i, self.hparams) if self.hparams.mla else None
        mixer = load_mixer(src, i, self.hparams, t)
        if mixer is not None:  # a recurrent layer has no attention weights
            wq = wk = wv = Weight(DType.F32, (0, self.d), np.zeros((0, self.d), np.float32))
        elif mla is not None:
            wq, wk, wv = mla.wq, mla.wkv_a, mla.wkv_a
        elif self.g4 is not None:  # its attention weights are in self.g4 (unused here)
            wq = wk = wv = self.g4.attn[i].wq
        elif t.fused_qkv:
            wq, wk, wv = split_rows(
                ir, src.weight(p + "attn_qkv.weight"), p + "attn_qkv.weight", (nq, nkv, nkv)
            )
        else:
            wq, wk, wv = (src.weight(p + f"attn_{n}.weight") for n in "qkv")
            for name, w, rows in (("q", wq, nq), ("k", wk, nkv), ("v", wv, nkv)):
                check_rows(ir, f"{p}attn_{name}.weight", w, rows)
        wo = wq if mixer is not None else src.weight(p + "attn_output.weight")
        g4 = self.g4 is not None  # gemma4's mixture is beside the FFN (self.g4.side)
        routing = self.hparams.routing
        experts = None if g4 else load_experts(src, i, self.hparams.n_expert_used, routing)
        gate = up = down = None
        if experts is None:
            if t.fused_gate_up:
                fused = src.weight(p + "ffn_up.weight")
                half = fused.shape[0] // 2
                gate, up = split_rows(ir, fused, p + "ffn_up.weight", (half, fused.shape[0] - half))
                if gate.shape != up.shape:
                    raise UnsupportedError(
                        f"{ir.architecture} block {i}: ffn_up has {fused.shape[0]} rows, "
                        "gate and up need an even count"
                    )
            else:
                gate, up = src.weight(p + "ffn_gate.weight"), src.weight(p + "ffn_up.weight")
            down = src.weight(p + "ffn_down.weight")
        post, pre = t.post_norms, t.pre_norms
        return DecoderBlock(
            attn_norm=src.vec(p + "attn_norm.weight") if pre else None,
            wq=wq,
            wk=wk,
            wv=wv,
            wo=wo,
            ffn_norm=src.vec(f"{p}{t.ffn_norm}.weight") if pre else None,
            w_gate=gate,
            w_up=up,
            w_down=down,
            experts=experts,
            bq=opt_vec(src, p + "attn_q.bias"),
            bk=opt_vec(src, p + "attn_k.bias"),
            bv=opt_vec(src, p + "attn_v.bias"),
            q_norm=opt_vec(src, p + "attn_q_norm.weight") if self.g4 is None else None,
            k_norm=opt_vec(src, p + "attn_k_norm.weight") if self.g4 is None else None,
            post_attn_norm=src.vec(p + "post_attention_norm.weight") if post else None,
            post_ffw_norm=src.vec(p + "post_ffw_norm.weight") if post else None,
            mla=mla,
            mixer=mixer,
            bo=opt_vec(src, p + "attn_output.bias"),
            sinks=opt_vec(src, p + "attn_sinks.weight"),
        )

    def forward(self, batch: Sequence[SeqChunk]) -> F32Array:
        """One step; with LongRoPE, a sequence whose step crosses the original context is
        recomputed from its first token with the long factors (as transformers' ``generate``)."""
        lr = self.long_rope
        if lr is None:
            return self._forward(batch)
        batch = lr.restart_crossing(batch)
        starts = [c.cache.n for c in batch]
        logits = self._forward(batch)
        lr.remember(batch, starts)
        return logits

    def _forward(self, batch: Sequence[SeqChunk], hidden: F32Array | None = None) -> F32Array:
        be, hd, nh, nkv, sp = self.be, self.head_dim, self.n_head, self.n_head_kv, self.spec
        ids, pos, slices = begin_step(batch, self.n_vocab)
        n = len(ids)
        x = self.scratch.get("x", (n, self.d))  # (n, d)
        if hidden is not None:  # layers first.. of a split model
            x[...] = hidden
        else:
            x = be.get_rows(self.tok_embd, ids, out=x)
            if self.embd_scale is not None:
                x *= self.embd_scale
            place_images(batch, slices, x)  # image embeddings in place of their tokens'
        g4 = self.g4
        per_layer = g4.inputs(be, ids, x) if g4 is not None else None  # (n, layers, p)
        h = self.scratch.get("h", (n, self.d))  # (n, d)
        attn = self.scratch.get("attn", (n, nh, hd))  # (n, n_head, hd)
        attn2 = attn.reshape(n, nh * hd)
        # every buffer fetched once per step, not once per layer (Scratch.get costs ~2 us)
        qb = self.scratch.get("q", (n, nh * hd * (2 if sp.attn_gate else 1)))
        kb = self.scratch.get("k", (n, nkv * hd))
        vb = self.scratch.get("v", (n, nkv * hd))
        ob = self.scratch.get("o", (n, self.d))
        ff = 0
        gb = ub = ob  # the FFN's buffers, fetched at the first dense block
        mr = self.mrope  # M-RoPE: image rows and columns; else the same for every global layer
        angles = mr.angles(be, batch, pos, slices) if mr else be.rope_angles(pos, self.inv_freq)
        if self.long_rope is not None:
            angles = self.long_rope.angles(be, batch, pos, angles)
        local = be.rope_angles(pos, self.inv_freq_local) if any(sp.local_rope) else angles
        if self.rope_mscale is not None:  # the local tables stay unscaled
            angles = (angles[0] * self.rope_mscale, angles[1] * self.rope_mscale)
        gelu = sp.act == "gelu_tanh"
        hp_mla = self.hparams.mla
        temp = (
            attn_temperature(pos, sp.attn_temp, sp.attn_temp_floor, sp.attn_temp_offset)
            if sp.attn_temp
            else None
        )
        res = np.float32(sp.residual_scale)  # the residual branches scaled (granite)
        for li in range(self.first, self.stop):
            if self.first < li <= sp.deepstack:  # images' features after the layer before
                add_deepstack(batch, slices, x, li - 1)
            b, ci = self.blocks[li], li - self.first  # ci: its layer in this model's caches
            hin = x if b.attn_norm is None else be.rms_norm(x, b.attn_norm, self.eps, out=h)
            rot = local if sp.local_rope[li] else angles
            if b.mixer is not None:  # a recurrent layer in place of attention
                o = mixer_forward(be, b.mixer, batch, slices, li, hin, self.eps)
            else:
                if b.mla is not None:  # multi-head latent attention (deepseek2)
                    assert hp_mla is not None
                    lat = latent_attention(
                        be, b.mla, hp_mla, hin, batch, slices, ci, angles, self.scale, self.eps
                    )
                    o = be.matmul(b.wo, lat, out=ob)
                elif g4 is not None:  # per-layer head shapes, KV sharing, V norms
                    a = g4.attention(be, li, hin, batch, slices, rot, self.neox, sp.windows[li])
                    o = be.matmul(b.wo, a, out=ob)
                else:
                    self._attention(li, ci, b, batch, slices, hin, (qb, kb, vb), rot, temp, attn)
                    o = be.matmul(b.wo, attn2, out=ob)
                    if b.bo is not None:
                        o += b.bo
                post = b.post_attn_norm
                o = o if post is None else be.rms_norm(o, post, self.eps, out=h)
            x += o * res if res else o
            hin = x if b.ffn_norm is None else be.rms_norm(x, b.ffn_norm, self.eps, out=h)
            if b.experts is not None:
                moe = llama4_moe_ffn if sp.moe_sigmoid_shared else moe_ffn
                ebe = be if b.experts.backend is None else b.experts.backend  # --n-cpu-moe
                o = moe(ebe, b.experts, hin, ob)
                x += o * res if res else o
                continue
            assert b.w_gate is not None and b.w_up is not None and b.w_down is not None
            if b.w_gate.shape[0] != ff:  # the first dense block, or layers of other widths
                ff = b.w_gate.shape[0]
                gb, ub = self.scratch.get("gate", (n, ff)), self.scratch.get("up", (n, ff))
            g, u = be.matmul_many((b.w_gate, b.w_up), hin, (gb, ub))  # (n, ff) each
            if gelu:
                g = be.gelu(g, out=g)
                g *= u
            else:
                g = be.silu_mul(g, u, out=g)
            o = be.matmul(b.w_down, g, out=ob)
            if g4 is not None:  # a mixture beside the FFN
                o = g4.beside_ffn(be, li, x, o)
            o = o if b.post_ffw_norm is None else be.rms_norm(o, b.post_ffw_norm, self.eps, out=h)
            x += o * res if res else o
            if g4 is not None:  # per-layer inputs, output scales
                g4.after_layer(be, li, x, per_layer)
        if self.stop <= sp.deepstack:
            add_deepstack(batch, slices, x, self.stop - 1)
        rows = end_step(batch, slices)
        if self.stop < len(self.blocks):
            return x  # the next part's input
        hidden = x[rows]  # (r, d), a fresh array: the part with the head takes it
        return self.head_logits(hidden) if self.head else hidden

    def head_logits(self, hidden: F32Array) -> F32Array:
        """The logits (r, vocab) of ``hidden`` (r, d), the state after the last layer."""
        return blk.output_logits(
            self.be, self.spec, self.output_norm, self.output, self.eps, hidden
        )

    def _attention(
        self,
        li: int,
        ci: int,
        b: DecoderBlock,
        batch: Sequence[SeqChunk],
        slices: list[slice],
        h: F32Array,
        bufs: tuple[F32Array, F32Array, F32Array],
        rot: tuple[F32Array, F32Array],
        temp: F32Array | None,
        attn: F32Array,
    ) -> None:
        """Layer ``li``'s attention of ``h`` (n, d) into ``attn`` (n, n_head, hd), its keys
        and values in the caches' layer ``ci``: the GQA layer with every optional part of :class:`DecoderSpec` (``rot``: its RoPE angles,
        ``temp``: the attention temperature by row)."""
        be, hd, nh, nkv, sp = self.be, self.head_dim, self.n_head, self.n_head_kv, self.spec
        n = len(h)
        q, k, v = be.matmul_many((b.wq, b.wk, b.wv), h, bufs)
        if b.bq is not None and b.bk is not None and b.bv is not None:
            q += b.bq
            k += b.bk
            v += b.bv
        gate = None
        if sp.attn_gate:  # each head's query, then its output gate (qwen35)
            qg = q.reshape(n, nh, 2, hd)
            q, gate = np.ascontiguousarray(qg[:, :, 0]), qg[:, :, 1]
        whole = sp.qk_norm_whole and b.q_norm is not None and b.k_norm is not None
        if whole:  # over the whole projection (olmo2)
            assert b.q_norm is not None and b.k_norm is not None
            q, k = be.rms_norm(q, b.q_norm, self.eps), be.rms_norm(k, b.k_norm, self.eps)
        q, k, v = q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)
        if not whole and b.q_norm is not None and b.k_norm is not None:  # per head
            q = be.rms_norm(q.reshape(n * nh, hd), b.q_norm, self.eps).reshape(n, nh, hd)
            k = be.rms_norm(k.reshape(n * nkv, hd), b.k_norm, self.eps).reshape(n, nkv, hd)
        if not (sp.nope and sp.nope[li]):
            be.rope(q, rot, self.neox)
            be.rope(k, rot, self.neox)
        if sp.qk_l2_norm and sp.qk_l2_norm[li]:  # RMS norms without weights (llama4)
            q = be.rms_norm(q.reshape(n * nh, hd), self.ones_hd, self.eps).reshape(n, nh, hd)
            k = be.rms_norm(k.reshape(n * nkv, hd), self.ones_hd, self.eps).reshape(n, nkv, hd)
        if temp is not None and sp.attn_temp_layers[li]:  # sharper past the original context
            q *= temp
        win = sp.windows[li]
        if sp.chunks and sp.chunks[li]:  # within chunks of positions (llama4)
            chunked_attend(be, batch, slices, ci, q, k, v, self.scale, attn, sp.chunks[li])
        else:
            # b.sinks: a logit per head in the softmax's denominator (gpt-oss)
            attend(be, batch, slices, ci, q, k, v, self.scale, attn, win, sp.attn_softcap, b.sinks)
        if gate is not None:
            attn *= 1.0 / (1.0 + np.exp(-gate))

    def shift_context(self, cache: KVCache, n_keep: int, n_discard: int) -> None:
        """Drop tokens after the anchors; re-rotate the moved keys by ``-n_discard``, each
        layer with its own RoPE base."""
        # a cache layer per layer producing K/V (gemma4), of layers first.. (a split model)
        a, z = self.first, self.first + cache.shape.n_layer
        invs = layer_inv_freqs(self.spec, self.inv_freq, self.inv_freq_local, a, z)

        g4 = self.g4

        def rotate(k: F32Array, angles: tuple[F32Array, F32Array], layer: int) -> None:
            assert g4 is not None  # each layer's own head size of the padded rows
            g4.rerotate(self.be, k, layer, angles, self.neox)

        # latent attention: only each row's RoPE tail rotates (rope_from)
        shift_keys(
            cache, n_keep, n_discard, self.be, invs, self.neox,
            rotate if g4 is not None else None, self.rope_from,
        )  # fmt: skip
