"""Gemma 2, and the Gemma forward that Gemma 3 shares.

Per block: ``x += post_attention_norm(attn(attn_norm(x)))`` then
``x += post_ffw_norm(down(gelu_tanh(gate(h)) * up(h)))`` with ``h = ffn_norm(x)``; the
embeddings are scaled by ``sqrt(n_embd)``; the head is tied.  Q·K is scaled by
``query_pre_attn_scalar ** -0.5``.  Windowed layers (``hparams.window_layers``) see the last
``sliding_window`` positions; gemma2 alternates them with global ones (layer 0 windowed),
gemma3 has five windowed to one global.  gemma2 soft-caps the attention scores and the
logits (``c * tanh(s / c)``; the attention kernels cap the scores, as they apply windows).
gemma3 adds a per-head RMSNorm of Q and K before RoPE, and its windowed layers rotate with
their own base (``rope_local_base_freq``, unscaled).  RoPE is NeoX (rotate-half).

Tensors as llama.cpp's ``convert_hf_to_gguf.py`` writes them: HF's RMSNorm multiplies by
``1 + w``, GGUF stores ``w + 1`` (every ``*norm.weight``, Q/K norms too), so an HF
directory's norm weights get the 1 added when loaded.  ``pre_feedforward_layernorm`` is
``ffn_norm``, ``post_attention_layernorm`` ``post_attention_norm`` and
``post_feedforward_layernorm`` ``post_ffw_norm``.  GGUF has no key for
``query_pre_attn_scalar``: as llama.cpp, the 27B sizes (gemma2 46 layers, gemma3 62) use
``n_embd / n_head``, the others ``head_dim``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from modelc.families.contract import rope_inv_freq
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

__all__ = ["Gemma"]


@dataclass(slots=True)
class GemmaBlock:
    attn_norm: F32Array  # (d,) w + 1, as GGUF stores it
    wq: Weight  # (n_head*hd, d)
    wk: Weight  # (n_head_kv*hd, d)
    wv: Weight  # (n_head_kv*hd, d)
    wo: Weight  # (d, n_head*hd)
    post_attn_norm: F32Array  # (d,)
    ffn_norm: F32Array  # (d,)
    w_gate: Weight  # (ff, d)
    w_up: Weight  # (ff, d)
    w_down: Weight  # (d, ff)
    post_ffw_norm: F32Array  # (d,)
    window: int  # 0: global attention
    q_norm: F32Array | None = None  # (hd,) gemma3
    k_norm: F32Array | None = None


class Gemma(CausalLM):
    architecture = "gemma2"

    def __init__(self, ir: ModelIR, backend: Backend) -> None:
        hp = ir.hparams
        self.architecture = ir.architecture
        self.hparams: HParams = hp
        self.be = backend
        src = TensorSource(ir)
        self.tok_embd = src.weight("token_embd.weight")  # (vocab, d)
        self.n_vocab = hp.n_vocab or self.tok_embd.shape[0]
        self.d = hp.n_embd or self.tok_embd.shape[1]
        self.n_head = hp.n_head
        self.n_head_kv = hp.n_head_kv or hp.n_head
        self.head_dim = hp.head_dim or self.d // self.n_head
        check_heads(ir, self.n_head, self.n_head_kv, self.n_head * self.head_dim)
        self.n_ctx = hp.n_ctx or 8192
        self.eps = hp.norm_eps
        windowed = set(hp.window_layers) if hp.window_layers else set(range(hp.n_layer))
        self.blocks = [
            GemmaBlock(
                attn_norm=src.vec(f"blk.{i}.attn_norm.weight"),
                wq=src.weight(f"blk.{i}.attn_q.weight"),
                wk=src.weight(f"blk.{i}.attn_k.weight"),
                wv=src.weight(f"blk.{i}.attn_v.weight"),
                wo=src.weight(f"blk.{i}.attn_output.weight"),
                post_attn_norm=src.vec(f"blk.{i}.post_attention_norm.weight"),
                ffn_norm=src.vec(f"blk.{i}.ffn_norm.weight"),
                w_gate=src.weight(f"blk.{i}.ffn_gate.weight"),
                w_up=src.weight(f"blk.{i}.ffn_up.weight"),
                w_down=src.weight(f"blk.{i}.ffn_down.weight"),
                post_ffw_norm=src.vec(f"blk.{i}.post_ffw_norm.weight"),
                window=hp.sliding_window if i in windowed else 0,
                q_norm=src.vec(f"blk.{i}.attn_q_norm.weight")
                if src.has(f"blk.{i}.attn_q_norm.weight")
                else None,
                k_norm=src.vec(f"blk.{i}.attn_k_norm.weight")
                if src.has(f"blk.{i}.attn_k_norm.weight")
                else None,
            )
            for i in range(hp.n_layer)
        ]
        self.output_norm = src.vec("output_norm.weight")
        self.output = src.weight("output.weight") if src.has("output.weight") else self.tok_embd
        self.inv_freq = rope_inv_freq(self.head_dim, hp.rope_theta, hp.rope_scaling)
        self.inv_freq_local = (
            rope_inv_freq(self.head_dim, hp.rope_theta_local, type(hp.rope_scaling)())
            if hp.rope_theta_local
            else self.inv_freq
        )
        self.scale = hp.attn_scale or 1.0 / math.sqrt(self.head_dim)
        self.embd_scale = np.float32(math.sqrt(self.d))
        self.kv_shape = KVShape(len(self.blocks), self.n_head_kv, self.head_dim)
        self.kv_windows = tuple(b.window for b in self.blocks)
        self.scratch = Scratch()

    def forward(self, batch: Sequence[SeqChunk]) -> F32Array:
        be, hd, nh, nkv, hp = self.be, self.head_dim, self.n_head, self.n_head_kv, self.hparams
        ids, pos, slices = begin_step(batch, self.n_vocab)
        n = len(ids)
        x = be.get_rows(self.tok_embd, ids, out=self.scratch.get("x", (n, self.d)))  # (n, d)
        x *= self.embd_scale
        h = self.scratch.get("h", (n, self.d))
        attn = self.scratch.get("attn", (n, nh, hd))
        attn2 = attn.reshape(n, nh * hd)
        ob = self.scratch.get("o", (n, self.d))
        angles = be.rope_angles(pos, self.inv_freq)
        local = (
            be.rope_angles(pos, self.inv_freq_local)
            if self.inv_freq_local is not self.inv_freq
            else angles
        )
        for li, b in enumerate(self.blocks):
            h = be.rms_norm(x, b.attn_norm, self.eps, out=h)
            q, k, v = be.matmul_many((b.wq, b.wk, b.wv), h)
            q, k, v = q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)
            if b.q_norm is not None and b.k_norm is not None:  # per head, before RoPE
                q = be.rms_norm(q.reshape(n * nh, hd), b.q_norm, self.eps).reshape(n, nh, hd)
                k = be.rms_norm(k.reshape(n * nkv, hd), b.k_norm, self.eps).reshape(n, nkv, hd)
            rot = local if b.window else angles
            be.rope(q, rot, True)
            be.rope(k, rot, True)
            attend(be, batch, slices, li, q, k, v, self.scale, attn, b.window, hp.attn_softcap)
            o = be.matmul(b.wo, attn2, out=ob)
            x += be.rms_norm(o, b.post_attn_norm, self.eps, out=h)
            h = be.rms_norm(x, b.ffn_norm, self.eps, out=h)
            g, u = be.matmul_many((b.w_gate, b.w_up), h)  # (n, ff) each
            g = be.gelu(g, out=g)
            g *= u
            o = be.matmul(b.w_down, g, out=ob)
            x += be.rms_norm(o, b.post_ffw_norm, self.eps, out=h)
        rows = end_step(batch, slices)
        if len(rows) == 0:
            return np.zeros((0, self.n_vocab), np.float32)
        hl = be.rms_norm(np.ascontiguousarray(x[rows]), self.output_norm, self.eps)
        logits = be.matmul(self.output, hl)  # (r, vocab)
        if hp.final_softcap:
            cap = np.float32(hp.final_softcap)
            logits /= cap
            np.tanh(logits, out=logits)
            logits *= cap
        return logits

    def shift_context(self, cache: KVCache, n_keep: int, n_discard: int) -> None:
        """Drop tokens after the anchors; re-rotate the moved keys by ``-n_discard`` (each
        layer with its own RoPE base)."""
        cache.shift(n_keep, n_discard)
        if cache.n <= n_keep:
            return
        delta = np.full(cache.n - n_keep, -n_discard, np.int64)
        invs = iter([self.inv_freq_local if b.window else self.inv_freq for b in self.blocks])

        def rerotate(k: F32Array) -> None:  # called once per layer, in layer order
            self.be.rope(k, self.be.rope_angles(delta[: len(k)], next(invs)), True)

        cache.update_keys(n_keep, rerotate)
