"""LLaMA family: RMSNorm, RoPE, grouped-query attention, SiLU-gated MLP, tied or untied head.

Tensors (GGUF names): token_embd, output_norm, output (absent when tied), and per block
attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down.
Q/K rows are in the GGUF interleaved-pair RoPE layout unless ``hparams.rope_style`` is
``neox``.  Optional per block, for the families built on this forward (qwen2, qwen3):
attn_q/k/v biases and attn_q_norm/attn_k_norm (a per-head RMSNorm before RoPE).
Mistral's ``sliding_window`` limits what each query sees (a mask; the cache keeps
every position).  The ``llama`` family here also reads Mistral checkpoints.

A mixture of experts (Mixtral as ``llama``, ``qwen3moe``) has, in place of ffn_gate /
ffn_up / ffn_down, a router ffn_gate_inp (n_expert, d) and the experts stacked in
ffn_gate_exps / ffn_up_exps (n_expert, ff, d) and ffn_down_exps (n_expert, d, ff): each
token goes through its ``n_expert_used`` most probable experts (softmax over all), their
outputs weighted by those probabilities renormalised to sum to 1 (llama.cpp's
``build_moe_ffn`` for both).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelc.errors import FormatError
from modelc.families.contract import rope_attention_factor, rope_inv_freq
from modelc.formats.ir import HParams, ModelIR
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

__all__ = ["Block", "Experts", "Llama", "moe_ffn", "rope_inv_freq"]


@dataclass(slots=True)
class Experts:
    """A mixture-of-experts FFN: the router and each expert's matrices (row views)."""

    router: Weight  # (n_expert, d)
    gate: list[Weight]  # n_expert x (ff, d)
    up: list[Weight]  # n_expert x (ff, d)
    down: list[Weight]  # n_expert x (d, ff)
    n_used: int  # experts a token goes through


@dataclass(slots=True)
class Block:
    attn_norm: F32Array  # (d,)
    wq: Weight  # (n_head*hd, d)
    wk: Weight  # (n_head_kv*hd, d)
    wv: Weight  # (n_head_kv*hd, d)
    wo: Weight  # (d, n_head*hd)
    ffn_norm: F32Array  # (d,)
    w_gate: Weight | None  # (ff, d); None in a mixture of experts
    w_up: Weight | None  # (ff, d)
    w_down: Weight | None  # (d, ff)
    experts: Experts | None = None  # mixtral, qwen3moe
    bq: F32Array | None = None  # (n_head*hd,) qwen2
    bk: F32Array | None = None  # (n_head_kv*hd,)
    bv: F32Array | None = None  # (n_head_kv*hd,)
    q_norm: F32Array | None = None  # (hd,) qwen3: RMSNorm of each head before RoPE
    k_norm: F32Array | None = None  # (hd,)


def _opt(src: TensorSource, name: str) -> F32Array | None:
    return src.vec(name) if src.has(name) else None


class Llama(CausalLM):
    architecture = "llama"

    def __init__(self, ir: ModelIR, backend: Backend) -> None:
        hp = ir.hparams
        self.architecture = ir.architecture  # the families sharing this forward
        self.hparams: HParams = hp
        self.be = backend
        src = TensorSource(ir)
        self.tok_embd = src.weight("token_embd.weight")  # (vocab, d)
        self.n_vocab = hp.n_vocab or self.tok_embd.shape[0]
        self.d = hp.n_embd or self.tok_embd.shape[1]
        self.n_head = hp.n_head
        self.n_head_kv = hp.n_head_kv or hp.n_head
        check_heads(ir, self.n_head, self.n_head_kv, self.n_head * (hp.head_dim or 1))
        self.head_dim = hp.head_dim or self.d // self.n_head
        self.n_ctx = hp.n_ctx or 2048
        self.eps = hp.norm_eps
        self.window = hp.sliding_window
        self.blocks = [self.make_block(src, i) for i in range(hp.n_layer)]
        for i, b in enumerate(self.blocks):
            check_rows(ir, f"blk.{i}.attn_q.weight", b.wq, self.n_head * self.head_dim)
            check_rows(ir, f"blk.{i}.attn_k.weight", b.wk, self.n_head_kv * self.head_dim)
            check_rows(ir, f"blk.{i}.attn_v.weight", b.wv, self.n_head_kv * self.head_dim)
        self.output_norm = src.vec("output_norm.weight")
        self.output = src.weight("output.weight") if src.has("output.weight") else self.tok_embd
        self.neox = hp.rope_style == "neox"
        self.inv_freq = rope_inv_freq(self.head_dim, hp.rope_theta, hp.rope_scaling)
        # YaRN scales cos and sin, so each Q·K by the factor squared
        self.scale = rope_attention_factor(hp.rope_scaling) ** 2 / math.sqrt(self.head_dim)
        self.kv_shape = KVShape(len(self.blocks), self.n_head_kv, self.head_dim)
        self.kv_windows = (self.window,) * len(self.blocks) if self.window else ()
        self.scratch = Scratch()

    def make_block(self, src: TensorSource, i: int) -> Block:
        """Block ``i``'s weights (a family whose tensors are fused splits them here)."""
        moe = src.has(f"blk.{i}.ffn_gate_inp.weight")
        experts = None
        if moe:
            used = self.hparams.n_expert_used
            experts = Experts(
                router=src.weight(f"blk.{i}.ffn_gate_inp.weight"),
                gate=src.experts(f"blk.{i}.ffn_gate_exps.weight"),
                up=src.experts(f"blk.{i}.ffn_up_exps.weight"),
                down=src.experts(f"blk.{i}.ffn_down_exps.weight"),
                n_used=used,
            )
            n = experts.router.shape[0]
            if (
                not 0 < used <= n
                or not len(experts.gate) == len(experts.up) == len(experts.down) == n
            ):
                raise FormatError(
                    f"blk.{i}: {n} router rows, {len(experts.gate)} experts and "
                    f"{used} used a token do not agree",
                    path=src.ir.source.path,
                )
        return Block(
            attn_norm=src.vec(f"blk.{i}.attn_norm.weight"),
            wq=src.weight(f"blk.{i}.attn_q.weight"),
            wk=src.weight(f"blk.{i}.attn_k.weight"),
            wv=src.weight(f"blk.{i}.attn_v.weight"),
            wo=src.weight(f"blk.{i}.attn_output.weight"),
            ffn_norm=src.vec(f"blk.{i}.ffn_norm.weight"),
            w_gate=None if moe else src.weight(f"blk.{i}.ffn_gate.weight"),
            w_up=None if moe else src.weight(f"blk.{i}.ffn_up.weight"),
            w_down=None if moe else src.weight(f"blk.{i}.ffn_down.weight"),
            experts=experts,
            bq=_opt(src, f"blk.{i}.attn_q.bias"),
            bk=_opt(src, f"blk.{i}.attn_k.bias"),
            bv=_opt(src, f"blk.{i}.attn_v.bias"),
            q_norm=_opt(src, f"blk.{i}.attn_q_norm.weight"),
            k_norm=_opt(src, f"blk.{i}.attn_k_norm.weight"),
        )

    def step_angles(
        self, batch: Sequence[SeqChunk], pos: np.ndarray[Any, Any]
    ) -> tuple[F32Array, F32Array]:
        """This step's RoPE cos and sin, the same for every layer (LongRoPE picks per step)."""
        return self.be.rope_angles(pos, self.inv_freq)

    def forward(self, batch: Sequence[SeqChunk]) -> F32Array:
        be, hd, nh, nkv = self.be, self.head_dim, self.n_head, self.n_head_kv
        ids, pos, slices = begin_step(batch, self.n_vocab)
        n = len(ids)
        x = be.get_rows(self.tok_embd, ids, out=self.scratch.get("x", (n, self.d)))  # (n, d)
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
        angles = self.step_angles(batch, pos)  # the same for every layer
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
            be.rope(q, angles, self.neox)
            be.rope(k, angles, self.neox)
            attend(be, batch, slices, li, q, k, v, self.scale, attn, window=self.window)
            x += be.matmul(b.wo, attn2, out=ob)
            h = be.rms_norm(x, b.ffn_norm, self.eps, out=h)
            if b.experts is not None:
                x += moe_ffn(be, b.experts, h, ob)
                continue
            assert b.w_gate is not None and b.w_up is not None and b.w_down is not None
            if b.w_gate.shape[0] != ff:  # the first dense block, or layers of other widths
                ff = b.w_gate.shape[0]
                gb, ub = self.scratch.get("gate", (n, ff)), self.scratch.get("up", (n, ff))
            g, u = be.matmul_many((b.w_gate, b.w_up), h, (gb, ub))  # (n, ff) each
            g = be.silu_mul(g, u, out=g)
            x += be.matmul(b.w_down, g, out=ob)
        rows = end_step(batch, slices)
        if len(rows) == 0:
            return np.zeros((0, self.n_vocab), np.float32)
        hl = be.rms_norm(np.ascontiguousarray(x[rows]), self.output_norm, self.eps)  # (r, d)
        return be.matmul(self.output, hl)  # (r, vocab), a fresh array the caller may keep

    def shift_context(self, cache: KVCache, n_keep: int, n_discard: int) -> None:
        """Drop tokens after the anchors; re-rotate the moved keys by ``-n_discard``."""
        cache.shift(n_keep, n_discard)
        delta = np.full(max(cache.n - n_keep, 0), -n_discard, np.int64)

        def rerotate(k: F32Array) -> None:
            self.be.rope(k, self.be.rope_angles(delta[: len(k)], self.inv_freq), self.neox)

        if cache.n > n_keep:
            cache.update_keys(n_keep, rerotate)


def moe_ffn(be: Backend, e: Experts, h: F32Array, out: F32Array) -> F32Array:
    """The experts' FFN of the rows of ``h`` (n, d) into ``out``: each row through its
    ``e.n_used`` most probable experts, weighted by their renormalised probabilities."""
    p = be.softmax(be.matmul(e.router, h))  # (n, n_expert)
    top = np.argsort(-p, axis=1, kind="stable")[:, : e.n_used]  # (n, used)
    w = np.take_along_axis(p, top, axis=1)
    w /= w.sum(axis=1, keepdims=True)
    if len(h) == 1:  # a decode step: the chosen experts' gates and ups in one call
        order = np.argsort(top[0])  # experts in id order, as the loop below sums them
        ids, k = top[0, order], len(order)
        gu = np.empty((2, k, e.gate[ids[0]].shape[0]), np.float32)  # gates, then ups
        outs = [gu[0, j : j + 1] for j in range(k)] + [gu[1, j : j + 1] for j in range(k)]
        be.matmul_many([e.gate[i] for i in ids] + [e.up[i] for i in ids], h, outs)
        g = be.silu_mul(gu[0], gu[1], out=gu[0])  # (k, ff)
        ys = np.empty((k, h.shape[1]), np.float32)
        for j, i in enumerate(ids):
            be.matmul(e.down[i], g[j : j + 1], out=ys[j : j + 1])
        ys *= w[0, order][:, None]
        out[0] = ys.sum(axis=0)  # row by row in id order, as the loop below adds them
        return out
    out[...] = 0.0
    for ex in np.unique(top):  # each expert once, on the rows routed to it
        rows, slot = np.nonzero(top == ex)
        xe = np.ascontiguousarray(h[rows])
        g, u = be.matmul_many((e.gate[ex], e.up[ex]), xe)
        g = be.silu_mul(g, u, out=g)
        y = be.matmul(e.down[ex], g)
        y *= w[rows, slot][:, None]
        out[rows] += y
    return out
