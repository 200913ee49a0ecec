"""BERT encoder for sentence embeddings (all-MiniLM-L6-v2 and kin).

Word + position + token-type embeddings, LayerNorm, then post-norm blocks
(``x = LN(x + attn(x)); x = LN(x + ffn(x))``) with exact (erf) GELU; mean pooling over
the tokens (or the CLS token) and optional L2 normalisation.

Tensors (GGUF names): token_embd, position_embd, token_types, token_embd_norm(.bias),
per block attn_q/k/v/output (+ bias), attn_output_norm(.bias), ffn_up/ffn_down (+ bias),
layer_output_norm(.bias).

Sequences are not padded: all tokens of the batch go through the matrix products
together, and attention runs per sequence over exactly its own tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelc.errors import UsageError
from modelc.formats.ir import HParams, ModelIR
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.model import Scratch, TensorSource, check_heads


def encoder_attention(
    be: Backend,
    q: F32Array,
    k: F32Array,
    v: F32Array,
    slices: Sequence[slice],
    scale: float,
    out: F32Array,
) -> None:
    """Bidirectional attention within each sequence: rows ``sl`` of q, k, v (n, n_head, hd)
    attend over each other, into ``out``; one backend call for the batch (a query at the
    last position of its sequence's cache sees all of it)."""
    be.attention_batch(
        [q[sl] for sl in slices],
        [k[sl] for sl in slices],
        [v[sl] for sl in slices],
        [sl.stop - sl.start - 1 for sl in slices],
        scale,
        [out[sl] for sl in slices],
    )


@dataclass(slots=True)
class Block:
    wq: Weight  # (d, d)
    bq: F32Array  # (d,)
    wk: Weight
    bk: F32Array
    wv: Weight
    bv: F32Array
    wo: Weight
    bo: F32Array
    ln1_w: F32Array  # attn_output_norm (d,)
    ln1_b: F32Array
    w_up: Weight  # (ff, d)
    b_up: F32Array
    w_down: Weight  # (d, ff)
    b_down: F32Array
    ln2_w: F32Array  # layer_output_norm (d,)
    ln2_b: F32Array


class Bert:
    architecture = "bert"

    def __init__(self, ir: ModelIR, backend: Backend) -> None:
        hp = ir.hparams
        self.hparams: HParams = hp
        self.be = backend
        src = TensorSource(ir)
        self.tok_embd = src.weight("token_embd.weight")  # (vocab, d)
        self.pos_embd = src.array("position_embd.weight")  # (n_ctx, d)
        self.type_embd = (
            src.array("token_types.weight") if src.has("token_types.weight") else None
        )  # (n_types, d)
        self.emb_ln_w = src.vec("token_embd_norm.weight")
        self.emb_ln_b = src.vec("token_embd_norm.bias")
        self.d = hp.n_embd or self.tok_embd.shape[1]
        self.n_vocab = hp.n_vocab or self.tok_embd.shape[0]
        self.n_head = hp.n_head
        check_heads(ir, self.n_head, self.n_head, self.d)
        self.head_dim = self.d // self.n_head
        self.n_ctx = len(self.pos_embd)
        self.eps = hp.norm_eps
        self.pooling = hp.pooling or "mean"
        if self.pooling not in ("mean", "cls"):
            raise UsageError(f"unknown pooling {self.pooling!r} (mean or cls)")
        self.blocks = [
            Block(
                wq=src.weight(f"blk.{i}.attn_q.weight"),
                bq=src.vec(f"blk.{i}.attn_q.bias"),
                wk=src.weight(f"blk.{i}.attn_k.weight"),
                bk=src.vec(f"blk.{i}.attn_k.bias"),
                wv=src.weight(f"blk.{i}.attn_v.weight"),
                bv=src.vec(f"blk.{i}.attn_v.bias"),
                wo=src.weight(f"blk.{i}.attn_output.weight"),
                bo=src.vec(f"blk.{i}.attn_output.bias"),
                ln1_w=src.vec(f"blk.{i}.attn_output_norm.weight"),
                ln1_b=src.vec(f"blk.{i}.attn_output_norm.bias"),
                w_up=src.weight(f"blk.{i}.ffn_up.weight"),
                b_up=src.vec(f"blk.{i}.ffn_up.bias"),
                w_down=src.weight(f"blk.{i}.ffn_down.weight"),
                b_down=src.vec(f"blk.{i}.ffn_down.bias"),
                ln2_w=src.vec(f"blk.{i}.layer_output_norm.weight"),
                ln2_b=src.vec(f"blk.{i}.layer_output_norm.bias"),
            )
            for i in range(hp.n_layer)
        ]
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.scratch = Scratch()

    def _flatten(
        self, batch: Sequence[Sequence[int]]
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], list[slice]]:
        """The batch's token ids and positions as one run of rows (checked against the
        vocabulary and the context), and each sequence's slice of it."""
        if not batch or any(len(s) == 0 for s in batch):
            raise UsageError("cannot embed an empty input")
        if max(len(s) for s in batch) > self.n_ctx:
            raise UsageError(f"input longer than the model's {self.n_ctx} token limit")
        ids = np.concatenate([np.asarray(s, np.int64) for s in batch])
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise UsageError(f"token id out of range 0..{self.n_vocab - 1}")
        pos = np.concatenate([np.arange(len(s)) for s in batch])
        slices, start = [], 0
        for s in batch:
            slices.append(slice(start, start + len(s)))
            start += len(s)
        return ids, pos, slices

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
        x += self.pos_embd[pos]
        if self.type_embd is not None:
            types = (
                np.concatenate([np.asarray(t, np.int64) for t in token_types])
                if token_types is not None
                else np.zeros(n, np.int64)
            )
            x += self.type_embd[types]
        x = be.layer_norm(x, self.emb_ln_w, self.emb_ln_b, self.eps, out=x)
        attn = self.scratch.get("attn", (n, nh, hd))  # (n, n_head, hd)
        for b in self.blocks:
            q, k, v = be.matmul_many(
                (b.wq, b.wk, b.wv),
                x,
                (
                    self.scratch.get("q", (n, d)),
                    self.scratch.get("k", (n, d)),
                    self.scratch.get("v", (n, d)),
                ),
            )
            q += b.bq
            k += b.bk
            v += b.bv
            q3, k3, v3 = (t.reshape(n, nh, hd) for t in (q, k, v))
            encoder_attention(be, q3, k3, v3, slices, self.scale, attn)
            o = be.matmul(b.wo, attn.reshape(n, d), out=self.scratch.get("o", (n, d)))
            x += o
            x += b.bo
            x = be.layer_norm(x, b.ln1_w, b.ln1_b, self.eps, out=x)
            ff = b.w_up.shape[0]
            u = be.matmul(b.w_up, x, out=self.scratch.get("up", (n, ff)))  # (n, ff)
            u += b.b_up
            u = be.gelu_erf(u, out=u)
            o = be.matmul(b.w_down, u, out=self.scratch.get("o", (n, d)))
            x += o
            x += b.b_down
            x = be.layer_norm(x, b.ln2_w, b.ln2_b, self.eps, out=x)
        return x, slices

    def embed(
        self,
        batch: Sequence[Sequence[int]],
        token_types: Sequence[Sequence[int]] | None = None,
        *,
        pooling: str | None = None,
        normalize: bool | None = None,
    ) -> F32Array:
        """Pooled embeddings (batch, d); ``pooling`` (mean | cls) and ``normalize`` (L2)
        override the model's own settings."""
        x, slices = self.hidden_states(batch, token_types)
        pooling = pooling or self.pooling
        if pooling not in ("mean", "cls"):
            raise UsageError(f"unknown pooling {pooling!r} (mean or cls)")
        if pooling == "cls":
            pooled = np.stack([x[sl.start] for sl in slices])
        else:
            pooled = np.stack([x[sl].mean(axis=0, dtype=np.float64) for sl in slices])
        pooled = pooled.astype(np.float32)  # (batch, d)
        if self.hparams.normalize_embeddings if normalize is None else normalize:
            pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled


# --- the family -----------------------------------------------------------------------------
