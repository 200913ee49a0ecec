"""Nomic BERT encoder (nomic-embed-text v1 / v1.5), as llama.cpp's ``nomic-bert`` graph.

BERT's post-norm blocks with, in their place: rotary positions on Q and K (NeoX halves,
no position table), one Q/K/V matrix, a SwiGLU MLP (``down(silu(gate x) * up x)``) and no
biases.  Token types, the embedding LayerNorm, attention within each sequence, pooling
and normalisation are :class:`~modelc.runtime.arch.bert.Bert`'s.

Tensors (GGUF names): token_embd, token_types, token_embd_norm(.bias), per block
attn_qkv, attn_output, attn_output_norm(.bias), ffn_up, ffn_gate, ffn_down,
layer_output_norm(.bias).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from modelc.errors import UsageError
from modelc.families.contract import rope_inv_freq
from modelc.formats.ir import ModelIR
from modelc.runtime.arch.bert import Bert, encoder_attention
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.model import Scratch, TensorSource, check_heads


@dataclass(slots=True)
class Block:
    wqkv: Weight  # (3d, d)
    wo: Weight  # (d, d)
    ln1_w: F32Array  # attn_output_norm (d,)
    ln1_b: F32Array
    w_up: Weight  # (ff, d)
    w_gate: Weight  # (ff, d)
    w_down: Weight  # (d, ff)
    ln2_w: F32Array  # layer_output_norm (d,)
    ln2_b: F32Array


class NomicBert(Bert):
    architecture = "nomic-bert"

    def __init__(self, ir: ModelIR, backend: Backend) -> None:
        hp = ir.hparams
        self.hparams = hp
        self.be = backend
        src = TensorSource(ir)
        self.tok_embd = src.weight("token_embd.weight")  # (vocab, d)
        self.type_embd = src.array("token_types.weight") if src.has("token_types.weight") else None
        self.emb_ln_w = src.vec("token_embd_norm.weight")
        self.emb_ln_b = src.vec("token_embd_norm.bias")
        self.d = hp.n_embd or self.tok_embd.shape[1]
        self.n_vocab = hp.n_vocab or self.tok_embd.shape[0]
        self.n_head = hp.n_head
        check_heads(ir, self.n_head, self.n_head, self.d)
        self.head_dim = self.d // self.n_head
        self.n_ctx = hp.n_ctx or 2048
        self.eps = hp.norm_eps
        self.pooling = hp.pooling or "mean"
        if self.pooling not in ("mean", "cls"):
            raise UsageError(f"unknown pooling {self.pooling!r} (mean or cls)")
        self.inv_freq = rope_inv_freq(self.head_dim, hp.rope_theta, hp.rope_scaling)
        self.nomic = [
            Block(
                wqkv=src.weight(f"blk.{i}.attn_qkv.weight"),
                wo=src.weight(f"blk.{i}.attn_output.weight"),
                ln1_w=src.vec(f"blk.{i}.attn_output_norm.weight"),
                ln1_b=src.vec(f"blk.{i}.attn_output_norm.bias"),
                w_up=src.weight(f"blk.{i}.ffn_up.weight"),
                w_gate=src.weight(f"blk.{i}.ffn_gate.weight"),
                w_down=src.weight(f"blk.{i}.ffn_down.weight"),
                ln2_w=src.vec(f"blk.{i}.layer_output_norm.weight"),
                ln2_b=src.vec(f"blk.{i}.layer_output_norm.bias"),
            )
            for i in range(hp.n_layer)
        ]
        self.blocks = []  # BERT's blocks: none here (the forward below reads self.nomic)
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.scratch = Scratch()

    def hidden_states(
        self,
        batch: Sequence[Sequence[int]],
        token_types: Sequence[Sequence[int]] | None = None,
    ) -> tuple[F32Array, list[slice]]:
        """Last hidden states of all tokens (N, d) and each sequence's row slice."""
        be, d, nh, hd = self.be, self.d, self.n_head, self.head_dim
        ids, pos, slices = self._flatten(batch)
        n = len(ids)
        x = be.get_rows(self.tok_embd, ids, out=self.scratch.get("x", (n, d)))  # (n, d)
        if self.type_embd is not None:
            types = (
                np.concatenate([np.asarray(t, np.int64) for t in token_types])
                if token_types is not None
                else np.zeros(n, np.int64)
            )
            x += self.type_embd[types]
        x = be.layer_norm(x, self.emb_ln_w, self.emb_ln_b, self.eps, out=x)
        angles = be.rope_angles(pos, self.inv_freq)
        attn = self.scratch.get("attn", (n, nh, hd))  # (n, n_head, hd)
        for b in self.nomic:
            qkv = be.matmul(b.wqkv, x, out=self.scratch.get("qkv", (n, 3 * d)))
            q, k, v = (np.ascontiguousarray(qkv[:, i * d : (i + 1) * d]) for i in range(3))
            q3, k3, v3 = (t.reshape(n, nh, hd) for t in (q, k, v))
            be.rope(q3, angles, True)
            be.rope(k3, angles, True)
            encoder_attention(be, q3, k3, v3, slices, self.scale, attn)
            x += be.matmul(b.wo, attn.reshape(n, d), out=self.scratch.get("o", (n, d)))
            x = be.layer_norm(x, b.ln1_w, b.ln1_b, self.eps, out=x)
            ff = b.w_up.shape[0]
            g, u = be.matmul_many(
                (b.w_gate, b.w_up),
                x,
                (self.scratch.get("gate", (n, ff)), self.scratch.get("up", (n, ff))),
            )
            g = be.silu_mul(g, u, out=g)
            x += be.matmul(b.w_down, g, out=self.scratch.get("o", (n, d)))
            x = be.layer_norm(x, b.ln2_w, b.ln2_b, self.eps, out=x)
        return x, slices
