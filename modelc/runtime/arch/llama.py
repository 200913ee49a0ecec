"""LLaMA family: RMSNorm, RoPE, grouped-query attention, SiLU-gated MLP, tied or untied head.

Tensors (GGUF names): token_embd, output_norm, output (absent when tied), and per block
attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down.
Q/K rows are in the GGUF interleaved-pair RoPE layout unless ``hparams.rope_style`` is
``neox``.  Optional per block, for the families built on this forward (qwen2, qwen3):
attn_q/k/v biases and attn_q_norm/attn_k_norm (a per-head RMSNorm before RoPE).
Mistral's ``sliding_window`` limits what each query sees (a mask; the cache keeps
every position).  The ``llama`` family here also reads Mistral checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

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

__all__ = ["Block", "Llama", "rope_inv_freq"]


@dataclass(slots=True)
class Block:
    attn_norm: F32Array  # (d,)
    wq: Weight  # (n_head*hd, d)
    wk: Weight  # (n_head_kv*hd, d)
    wv: Weight  # (n_head_kv*hd, d)
    wo: Weight  # (d, n_head*hd)
    ffn_norm: F32Array  # (d,)
    w_gate: Weight  # (ff, d)
    w_up: Weight  # (ff, d)
    w_down: Weight  # (d, ff)
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
        return Block(
            attn_norm=src.vec(f"blk.{i}.attn_norm.weight"),
            wq=src.weight(f"blk.{i}.attn_q.weight"),
            wk=src.weight(f"blk.{i}.attn_k.weight"),
            wv=src.weight(f"blk.{i}.attn_v.weight"),
            wo=src.weight(f"blk.{i}.attn_output.weight"),
            ffn_norm=src.vec(f"blk.{i}.ffn_norm.weight"),
            w_gate=src.weight(f"blk.{i}.ffn_gate.weight"),
            w_up=src.weight(f"blk.{i}.ffn_up.weight"),
            w_down=src.weight(f"blk.{i}.ffn_down.weight"),
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
        ff = self.blocks[0].w_gate.shape[0] if self.blocks else 0
        gb = self.scratch.get("gate", (n, ff))  # (n, ff)
        ub = self.scratch.get("up", (n, ff))  # (n, ff)
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
            if b.w_gate.shape[0] != ff:  # a model whose layers differ in FFN width
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
