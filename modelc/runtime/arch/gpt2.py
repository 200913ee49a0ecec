"""GPT-2: LayerNorm, GELU (tanh), learned positions, fused QKV, tied head.

Tensors (GGUF names): token_embd, position_embd, output_norm(.bias), output (absent when
tied), and per block attn_norm(.bias), attn_qkv (3d, d) + bias, attn_output + bias,
ffn_norm(.bias), ffn_up + bias, ffn_down + bias.  Readers of Hugging Face checkpoints
transpose the Conv1D weights to (out, in).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from modelc.errors import UsageError
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
    end_step,
)


@dataclass(slots=True)
class Block:
    ln1_w: F32Array  # (d,)
    ln1_b: F32Array  # (d,)
    w_qkv: Weight  # (3d, d)
    b_qkv: F32Array  # (3d,)
    wo: Weight  # (d, d)
    bo: F32Array  # (d,)
    ln2_w: F32Array  # (d,)
    ln2_b: F32Array  # (d,)
    w_up: Weight  # (ff, d)
    b_up: F32Array  # (ff,)
    w_down: Weight  # (d, ff)
    b_down: F32Array  # (d,)


class GPT2(CausalLM):
    architecture = "gpt2"

    def __init__(self, ir: ModelIR, backend: Backend) -> None:
        hp = ir.hparams
        self.hparams: HParams = hp
        self.be = backend
        src = TensorSource(ir)
        self.tok_embd = src.weight("token_embd.weight")  # (vocab, d)
        self.pos_embd = src.array("position_embd.weight")  # (n_ctx, d)
        self.n_vocab = hp.n_vocab or self.tok_embd.shape[0]
        self.d = hp.n_embd or self.tok_embd.shape[1]
        self.n_head = hp.n_head
        check_heads(ir, self.n_head, self.n_head, self.d)
        self.head_dim = self.d // self.n_head
        self.n_ctx = min(hp.n_ctx or len(self.pos_embd), len(self.pos_embd))
        self.eps = hp.norm_eps
        self.blocks = [
            Block(
                ln1_w=src.vec(f"blk.{i}.attn_norm.weight"),
                ln1_b=src.vec(f"blk.{i}.attn_norm.bias"),
                w_qkv=src.weight(f"blk.{i}.attn_qkv.weight"),
                b_qkv=src.vec(f"blk.{i}.attn_qkv.bias"),
                wo=src.weight(f"blk.{i}.attn_output.weight"),
                bo=src.vec(f"blk.{i}.attn_output.bias"),
                ln2_w=src.vec(f"blk.{i}.ffn_norm.weight"),
                ln2_b=src.vec(f"blk.{i}.ffn_norm.bias"),
                w_up=src.weight(f"blk.{i}.ffn_up.weight"),
                b_up=src.vec(f"blk.{i}.ffn_up.bias"),
                w_down=src.weight(f"blk.{i}.ffn_down.weight"),
                b_down=src.vec(f"blk.{i}.ffn_down.bias"),
            )
            for i in range(hp.n_layer)
        ]
        self.out_w = src.vec("output_norm.weight")
        self.out_b = src.vec("output_norm.bias")
        self.output = src.weight("output.weight") if src.has("output.weight") else self.tok_embd
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.kv_shape = KVShape(len(self.blocks), self.n_head, self.head_dim)
        self.scratch = Scratch()

    def forward(self, batch: Sequence[SeqChunk]) -> F32Array:
        be, d, nh, hd = self.be, self.d, self.n_head, self.head_dim
        if any(c.cache.n + len(c.tokens) > len(self.pos_embd) for c in batch):
            raise UsageError(
                f"GPT-2 context is {len(self.pos_embd)} tokens; the sequence is longer"
            )
        ids, pos, slices = begin_step(batch, self.n_vocab)
        n = len(ids)
        x = be.get_rows(self.tok_embd, ids, out=self.scratch.get("x", (n, d)))  # (n, d)
        x += self.pos_embd[pos]
        h = self.scratch.get("h", (n, d))  # (n, d)
        attn = self.scratch.get("attn", (n, nh, hd))  # (n, n_head, hd)
        for li, b in enumerate(self.blocks):
            h = be.layer_norm(x, b.ln1_w, b.ln1_b, self.eps, out=h)
            qkv = be.matmul(b.w_qkv, h, out=self.scratch.get("qkv", (n, 3 * d)))  # (n, 3d)
            qkv += b.b_qkv
            q = qkv[:, :d].reshape(n, nh, hd)
            k = np.ascontiguousarray(qkv[:, d : 2 * d]).reshape(n, nh, hd)
            v = np.ascontiguousarray(qkv[:, 2 * d :]).reshape(n, nh, hd)
            attend(be, batch, slices, li, q, k, v, self.scale, attn)
            o = be.matmul(b.wo, attn.reshape(n, d), out=self.scratch.get("o", (n, d)))
            x += o
            x += b.bo
            h = be.layer_norm(x, b.ln2_w, b.ln2_b, self.eps, out=h)
            ff = b.w_up.shape[0]
            u = be.matmul(b.w_up, h, out=self.scratch.get("up", (n, ff)))  # (n, ff)
            u += b.b_up
            u = be.gelu(u, out=u)
            x += be.matmul(b.w_down, u, out=self.scratch.get("o", (n, d)))
            x += b.b_down
        rows = end_step(batch, slices)
        if len(rows) == 0:
            return np.zeros((0, self.n_vocab), np.float32)
        hl = be.layer_norm(np.ascontiguousarray(x[rows]), self.out_w, self.out_b, self.eps)
        return be.matmul(self.output, hl)  # (r, vocab)

    def shift_context(self, cache: KVCache, n_keep: int, n_discard: int) -> None:
        """Drop tokens after the anchors.  Positions are learned and baked into the
        cached keys/values, so nothing is re-rotated; new tokens continue at ``cache.n``."""
        cache.shift(n_keep, n_discard)
