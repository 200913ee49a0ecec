"""The one decoder: every decoder-only family (llama, mistral, mixtral, qwen2, qwen3,
qwen3moe, phi3, gemma2, gemma3, gpt-oss) is this forward, driven by a :class:`DecoderSpec`.

A family says how its layers differ from LLaMA's once, as data
(:class:`~modelc.families.contract.DecoderTraits` in its module under
:mod:`modelc.families`); with the hyper-parameters that gives the model's
:class:`DecoderSpec`: the numbers, the per-layer windows and RoPE bases, and the features it
uses.  Every backend runs that description: the CPU/numpy/WebGPU backends through
:meth:`Decoder.forward` here, CUDA through
:class:`~modelc.runtime.backends.cuda_llama.CudaLlama`, ``modelc compile`` through
:mod:`modelc.compile.spec`; each answers which features it runs (:data:`FEATURES`) and
refuses the rest in one place (:func:`refuse_unsupported`).

A layer, with the optional parts in brackets::

    h = attn_norm(x); q, k, v = h Wq [+ bq], h Wk [+ bk], h Wv [+ bv]
    [q, k = q_norm(q), k_norm(k)]            per head, before RoPE (qwen3, gemma3)
    rope(q, k)                               interleaved pairs or NeoX; [local base] on
                                             windowed layers (gemma3); [LongRoPE] (phi3)
    o = attention(q, k, v) Wo [+ bo]         [window], [soft-capped scores] (gemma2),
                                             [sinks] (gpt-oss: arch/sinks.py)
    x += o  |  x += post_attn_norm(o)        [post norms] (gemma)
    h = ffn_norm(x); f = act(h Wgate) * (h Wup) Wdown  |  experts(h)   [moe]
                                             [biased, clamped SwiGLU] (gpt-oss: arch/moe_oai.py)
    x += f  |  x += post_ffw_norm(f)

with the embeddings [times sqrt(d)] (gemma) and the logits [soft-capped] (gemma2).  Tensors
have GGUF names (``blk.{i}.attn_q.weight`` ...); a family whose file fuses Q/K/V or gate/up
(phi3) is split into row views here (no copy, quantized or not).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from modelc.errors import UnsupportedError
from modelc.families.contract import DecoderTraits, rope_attention_factor, rope_inv_freq
from modelc.families.registry import FAMILIES
from modelc.formats.ir import HParams, ModelIR
from modelc.runtime.arch.longrope import LongRope, long_rope_after
from modelc.runtime.arch.moe import Experts, load_experts, moe_ffn
from modelc.runtime.arch.sinks import apply_sinks
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
)

__all__ = ["FEATURES", "Decoder", "DecoderBlock", "DecoderSpec", "refuse_unsupported"]

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
    "attn_softcap": "soft-capped attention scores",  # gemma2
    "final_softcap": "soft-capped logits",  # gemma2
    "long_rope": "LongRoPE long factors",  # phi3
    "partial_rope": "partial RoPE (rotary dimensions below the head size)",
    "moe": "mixtures of experts",  # mixtral, qwen3moe
    "attn_sinks": "attention sinks",  # gpt-oss
    "attn_out_bias": "attention output biases",  # gpt-oss
    "moe_oai": "gpt-oss's experts (router and expert biases, a clamped SwiGLU)",
}


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
            "attn_softcap": bool(self.attn_softcap),
            "final_softcap": bool(self.final_softcap),
            "long_rope": bool(self.long_rope_after),
            "partial_rope": self.rot_dim != self.head_dim,
            "moe": any(self.moe),
            "attn_sinks": any(self.attn_sinks),
            "attn_out_bias": any(self.attn_out_bias),
            "moe_oai": self.moe_oai,
        }
        return frozenset(k for k, v in used.items() if v)


def refuse_unsupported(spec: DecoderSpec, where: str, runs: Iterable[str], hint: str) -> None:
    """The one refusal: UnsupportedError naming what ``spec`` uses that ``where`` does not
    run (``runs``: names of :data:`FEATURES`)."""
    missing = sorted(spec.features() - set(runs))
    if missing:
        what = ", ".join(FEATURES[m] for m in missing)
        raise UnsupportedError(
            f"this {spec.architecture} model uses {what}, which {where} does not run yet; {hint}"
        )


@dataclass(slots=True)
class DecoderBlock:
    """One layer's weights (views into the model file); optional parts are None."""

    attn_norm: F32Array  # (d,)
    wq: Weight  # (n_head*hd, d)
    wk: Weight  # (n_head_kv*hd, d)
    wv: Weight  # (n_head_kv*hd, d)
    wo: Weight  # (d, n_head*hd)
    ffn_norm: F32Array  # (d,)
    w_gate: Weight | None  # (ff, d); None in a mixture of experts
    w_up: Weight | None  # (ff, d)
    w_down: Weight | None  # (d, ff)
    experts: Experts | None = None
    bq: F32Array | None = None  # (n_head*hd,)
    bk: F32Array | None = None  # (n_head_kv*hd,)
    bv: F32Array | None = None  # (n_head_kv*hd,)
    q_norm: F32Array | None = None  # (hd,)
    k_norm: F32Array | None = None  # (hd,)
    post_attn_norm: F32Array | None = None  # (d,)
    post_ffw_norm: F32Array | None = None  # (d,)
    bo: F32Array | None = None  # (d,)
    sinks: F32Array | None = None  # (n_head,)


def _opt(src: TensorSource, name: str) -> F32Array | None:
    return src.vec(name) if src.has(name) else None


def _rows(w: Weight, start: int, stop: int) -> Weight:
    """Rows ``start:stop`` of ``w`` sharing its memory (rows are independent in every
    dtype, quantized blocks included)."""
    return Weight(w.dtype, (stop - start, w.shape[1]), w.data[start:stop])


def _split(ir: ModelIR, w: Weight, name: str, sizes: Sequence[int]) -> list[Weight]:
    check_rows(ir, name, w, sum(sizes))
    edges = [int(e) for e in np.cumsum([0, *sizes])]
    return [_rows(w, a, b) for a, b in itertools.pairwise(edges)]


def _windows(hp: HParams) -> tuple[int, ...]:
    """Each layer's sliding window: ``sliding_window`` on ``window_layers`` (all if none)."""
    if not hp.sliding_window:
        return (0,) * hp.n_layer
    on = set(hp.window_layers) if hp.window_layers else set(range(hp.n_layer))
    return tuple(hp.sliding_window if i in on else 0 for i in range(hp.n_layer))


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
        windows = _windows(hp)
        self.blocks = [self._block(ir, src, i) for i in range(hp.n_layer)]
        self.output_norm = src.vec("output_norm.weight")
        self.output = src.weight("output.weight") if src.has("output.weight") else self.tok_embd
        self.neox = hp.rope_style == "neox"
        self.inv_freq = rope_inv_freq(self.head_dim, hp.rope_theta, hp.rope_scaling)
        self.inv_freq_local = (  # the windowed layers' own base (gemma3), unscaled
            rope_inv_freq(self.head_dim, hp.rope_theta_local, type(hp.rope_scaling)())
            if hp.rope_theta_local
            else self.inv_freq
        )
        after = long_rope_after(hp)
        self.long_rope = LongRope(hp, self.head_dim, after) if after else None
        # YaRN scales cos and sin, so each Q·K by the factor squared
        factor = rope_attention_factor(hp.rope_scaling) ** 2
        self.scale = factor * hp.attn_scale if hp.attn_scale else factor / math.sqrt(self.head_dim)
        self.embd_scale = np.float32(math.sqrt(self.d)) if traits.embd_scale else None
        self.kv_shape = KVShape(len(self.blocks), self.n_head_kv, self.head_dim)
        self.kv_windows = windows if any(windows) else ()
        local = self.inv_freq_local is not self.inv_freq
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
            qkv_bias=tuple(b.bq is not None for b in self.blocks),
            qk_norm=tuple(b.q_norm is not None for b in self.blocks),
            moe=tuple(b.experts is not None for b in self.blocks),
            n_expert_used=hp.n_expert_used,
            attn_sinks=tuple(b.sinks is not None for b in self.blocks),
            attn_out_bias=tuple(b.bo is not None for b in self.blocks),
            moe_oai=any(b.experts is not None and b.experts.oai is not None for b in self.blocks),
        )
        self.scratch = Scratch()

    def _block(self, ir: ModelIR, src: TensorSource, i: int) -> DecoderBlock:
        """Block ``i``'s weights, fused tensors split into row views."""
        t, p = self.traits, f"blk.{i}."
        nq, nkv = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        if t.fused_qkv:
            wq, wk, wv = _split(
                ir, src.weight(p + "attn_qkv.weight"), p + "attn_qkv.weight", (nq, nkv, nkv)
            )
        else:
            wq, wk, wv = (src.weight(p + f"attn_{n}.weight") for n in "qkv")
            for name, w, rows in (("q", wq, nq), ("k", wk, nkv), ("v", wv, nkv)):
                check_rows(ir, f"{p}attn_{name}.weight", w, rows)
        experts = load_experts(src, i, self.hparams.n_expert_used)
        gate = up = down = None
        if experts is None:
            if t.fused_gate_up:
                fused = src.weight(p + "ffn_up.weight")
                half = fused.shape[0] // 2
                gate, up = _split(ir, fused, p + "ffn_up.weight", (half, fused.shape[0] - half))
                if gate.shape != up.shape:
                    raise UnsupportedError(
                        f"{ir.architecture} block {i}: ffn_up has {fused.shape[0]} rows, "
                        "gate and up need an even count"
                    )
            else:
                gate, up = src.weight(p + "ffn_gate.weight"), src.weight(p + "ffn_up.weight")
            down = src.weight(p + "ffn_down.weight")
        post = t.post_norms
        return DecoderBlock(
            attn_norm=src.vec(p + "attn_norm.weight"),
            wq=wq,
            wk=wk,
            wv=wv,
            wo=src.weight(p + "attn_output.weight"),
            ffn_norm=src.vec(p + t.ffn_norm + ".weight"),
            w_gate=gate,
            w_up=up,
            w_down=down,
            experts=experts,
            bq=_opt(src, p + "attn_q.bias"),
            bk=_opt(src, p + "attn_k.bias"),
            bv=_opt(src, p + "attn_v.bias"),
            q_norm=_opt(src, p + "attn_q_norm.weight"),
            k_norm=_opt(src, p + "attn_k_norm.weight"),
            post_attn_norm=src.vec(p + "post_attention_norm.weight") if post else None,
            post_ffw_norm=src.vec(p + "post_ffw_norm.weight") if post else None,
            bo=_opt(src, p + "attn_output.bias"),
            sinks=_opt(src, p + "attn_sinks.weight"),
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

    def _forward(self, batch: Sequence[SeqChunk]) -> F32Array:
        be, hd, nh, nkv, sp = self.be, self.head_dim, self.n_head, self.n_head_kv, self.spec
        ids, pos, slices = begin_step(batch, self.n_vocab)
        n = len(ids)
        x = be.get_rows(self.tok_embd, ids, out=self.scratch.get("x", (n, self.d)))  # (n, d)
        if self.embd_scale is not None:
            x *= self.embd_scale
        h = self.scratch.get("h", (n, self.d))  # (n, d)
        attn = self.scratch.get("attn", (n, nh, hd))  # (n, n_head, hd)
        attn2 = attn.reshape(n, nh * hd)
        # every buffer fetched once per step, not once per layer (Scratch.get costs ~2 us)
        qb = self.scratch.get("q", (n, nh * hd))
        kb = self.scratch.get("k", (n, nkv * hd))
        vb = self.scratch.get("v", (n, nkv * hd))
        ob = self.scratch.get("o", (n, self.d))
        ff = 0
        gb = ub = ob  # the FFN's buffers, fetched at the first dense block
        angles = be.rope_angles(pos, self.inv_freq)  # the same for every global layer
        if self.long_rope is not None:
            angles = self.long_rope.angles(be, batch, pos, angles)
        local = be.rope_angles(pos, self.inv_freq_local) if any(sp.local_rope) else angles
        gelu = sp.act == "gelu_tanh"
        for li, b in enumerate(self.blocks):
            h = be.rms_norm(x, b.attn_norm, self.eps, out=h)
            q, k, v = be.matmul_many((b.wq, b.wk, b.wv), h, (qb, kb, vb))
            if b.bq is not None and b.bk is not None and b.bv is not None:
                q += b.bq
                k += b.bk
                v += b.bv
            q, k, v = q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)
            if b.q_norm is not None and b.k_norm is not None:  # per head, before RoPE
                q = be.rms_norm(q.reshape(n * nh, hd), b.q_norm, self.eps).reshape(n, nh, hd)
                k = be.rms_norm(k.reshape(n * nkv, hd), b.k_norm, self.eps).reshape(n, nkv, hd)
            rot = local if sp.local_rope[li] else angles
            be.rope(q, rot, self.neox)
            be.rope(k, rot, self.neox)
            win = sp.windows[li]
            attend(be, batch, slices, li, q, k, v, self.scale, attn, win, sp.attn_softcap)
            if b.sinks is not None:
                apply_sinks(batch, slices, li, q, b.sinks, self.scale, attn, win)
            o = be.matmul(b.wo, attn2, out=ob)
            if b.bo is not None:
                o += b.bo
            x += (
                o if b.post_attn_norm is None else be.rms_norm(o, b.post_attn_norm, self.eps, out=h)
            )
            h = be.rms_norm(x, b.ffn_norm, self.eps, out=h)
            if b.experts is not None:
                x += moe_ffn(be, b.experts, h, ob)
                continue
            assert b.w_gate is not None and b.w_up is not None and b.w_down is not None
            if b.w_gate.shape[0] != ff:  # the first dense block, or layers of other widths
                ff = b.w_gate.shape[0]
                gb, ub = self.scratch.get("gate", (n, ff)), self.scratch.get("up", (n, ff))
            g, u = be.matmul_many((b.w_gate, b.w_up), h, (gb, ub))  # (n, ff) each
            if gelu:
                g = be.gelu(g, out=g)
                g *= u
            else:
                g = be.silu_mul(g, u, out=g)
            o = be.matmul(b.w_down, g, out=ob)
            x += o if b.post_ffw_norm is None else be.rms_norm(o, b.post_ffw_norm, self.eps, out=h)
        rows = end_step(batch, slices)
        if len(rows) == 0:
            return np.zeros((0, self.n_vocab), np.float32)
        hl = be.rms_norm(np.ascontiguousarray(x[rows]), self.output_norm, self.eps)  # (r, d)
        logits = be.matmul(self.output, hl)  # (r, vocab), a fresh array the caller may keep
        if sp.final_softcap:
            cap = np.float32(sp.final_softcap)
            logits /= cap
            np.tanh(logits, out=logits)
            logits *= cap
        return logits

    def shift_context(self, cache: KVCache, n_keep: int, n_discard: int) -> None:
        """Drop tokens after the anchors; re-rotate the moved keys by ``-n_discard``, each
        layer with its own RoPE base."""
        cache.shift(n_keep, n_discard)
        if cache.n <= n_keep:
            return
        delta = np.full(cache.n - n_keep, -n_discard, np.int64)
        invs = iter([self.inv_freq_local if loc else self.inv_freq for loc in self.spec.local_rope])

        def rerotate(k: F32Array) -> None:  # called once per layer, in layer order
            self.be.rope(k, self.be.rope_angles(delta[: len(k)], next(invs)), self.neox)

        cache.update_keys(n_keep, rerotate)
