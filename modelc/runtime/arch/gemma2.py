"""Gemma 2, and the Gemma forward that Gemma 3 shares.

Per block: ``x += post_attention_norm(attn(attn_norm(x)))`` then
``x += post_ffw_norm(down(gelu_tanh(gate(h)) * up(h)))`` with ``h = ffn_norm(x)``; the
embeddings are scaled by ``sqrt(n_embd)``; the head is tied.  Q·K is scaled by
``query_pre_attn_scalar ** -0.5``.  Windowed layers (``hparams.window_layers``) see the last
``sliding_window`` positions; gemma2 alternates them with global ones (layer 0 windowed),
gemma3 has five windowed to one global.  gemma2 soft-caps the attention scores and the
logits (``c * tanh(s / c)``; the attention then runs in numpy, the kernels have no cap).
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
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

from modelc.formats.ir import HParams, ModelIR, Tensor
from modelc.runtime.arch.family import (
    Family,
    GGUFMeta,
    activation,
    hf_rope,
    renamed,
    rope_inv_freq,
)
from modelc.runtime.arch.llama import HF_LLAMA_MODULES, LLAMA_LORA_SLOTS, attend_window
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

__all__ = ["FAMILY", "Gemma"]


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
            if hp.attn_softcap:
                attend_capped(batch, slices, li, q, k, v, self.scale, attn, b.window, hp)
            elif b.window and any(c.cache.n + len(c.tokens) > b.window for c in batch):
                attend_window(be, batch, slices, li, q, k, v, self.scale, attn, b.window)
            else:
                attend(be, batch, slices, li, q, k, v, self.scale, attn)
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


def attend_capped(
    batch: Sequence[SeqChunk],
    slices: list[slice],
    layer: int,
    q: F32Array,
    k: F32Array,
    v: F32Array,
    scale: float,
    out: F32Array,
    window: int,
    hp: HParams,
) -> None:
    """Attention with gemma2's soft-capped scores ``c * tanh(q·k * scale / c)``, causal and
    (``window`` > 0) windowed, in numpy over each sequence's cache."""
    cap = np.float32(hp.attn_softcap)
    for c, sl in zip(batch, slices, strict=True):
        p0, n = c.cache.n, len(c.tokens)
        c.cache.write(layer, p0, k[sl], v[sl])
        kk, vv = c.cache.read(layer, p0 + n)  # (m, n_head_kv, hd)
        m, nkv, hd = kk.shape
        qs = q[sl].reshape(n, nkv, -1, hd)  # (n, kv, group, hd)
        s = np.einsum("nkgd,mkd->kgnm", qs, np.asarray(kk, np.float32)) * np.float32(scale)
        s = np.tanh(s / cap) * cap
        qpos = np.arange(p0, p0 + n)[:, None]
        kpos = np.arange(m)[None, :]
        masked = kpos > qpos
        if window:
            masked |= qpos - kpos >= window
        s[..., masked] = -np.inf
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        o = np.einsum("kgnm,mkd->nkgd", s, np.asarray(vv, np.float32))
        out[sl] = o.reshape(n, -1, hd)


# --- the family -----------------------------------------------------------------------------

_NORM = re.compile(r"norm\.weight$")


def add_one_to_norms(src: str, name: str, t: Tensor, hp: HParams) -> Tensor:
    """HF Gemma's RMSNorm multiplies by ``1 + w``; GGUF stores ``w + 1`` (convert_hf_to_gguf)."""
    if not _NORM.search(name):
        return renamed(t, name)

    def load() -> np.ndarray[Any, Any]:
        return np.asarray(t.data(), np.float32) + np.float32(1.0)

    return Tensor(name, t.dtype, t.shape, load)


def windowed_layers(cfg: Mapping[str, Any], n_layer: int, pattern: int) -> list[int]:
    """The windowed layers: ``layer_types`` where config.json lists them, else every layer
    but each ``pattern``-th (transformers' default, llama.cpp's ``set_swa_pattern``)."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n_layer:
        return [i for i, t in enumerate(types) if t == "sliding_attention"]
    pattern = int(cfg.get("sliding_window_pattern") or pattern)
    return [i for i in range(n_layer) if (i + 1) % pattern]


def gemma_config(cfg: Mapping[str, Any], pattern: int) -> HParams:
    """What gemma2 and gemma3 read alike from config.json."""
    n_embd = int(cfg["hidden_size"])
    n_head = int(cfg["num_attention_heads"])
    n_layer = int(cfg["num_hidden_layers"])
    head_dim = int(cfg.get("head_dim") or n_embd // n_head)
    window = int(cfg.get("sliding_window") or 0)
    layers = windowed_layers(cfg, n_layer, pattern) if window else []
    return HParams(
        n_vocab=int(cfg["vocab_size"]),
        n_ctx=int(cfg.get("max_position_embeddings", 8192)),
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=int(cfg.get("num_key_value_heads") or n_head),
        n_ff=int(cfg["intermediate_size"]),
        head_dim=head_dim,
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_style="neox",
        tie_embeddings=True,
        sliding_window=window if layers else 0,
        window_layers=layers if len(layers) < n_layer else [],
        attn_scale=float(cfg.get("query_pre_attn_scalar") or head_dim) ** -0.5,
        attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
        final_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
        activation=activation(
            str(cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh")
        ),
    )


def _from_config(cfg: Mapping[str, Any]) -> HParams:
    hp = gemma_config(cfg, 2)
    hp.rope_theta, hp.rope_scaling = hf_rope(cfg)
    return hp


def gemma_gguf(m: GGUFMeta, hp: HParams, pattern: int, n_layer_27b: int, softcap: bool) -> None:
    """What gemma2 and gemma3 read alike from GGUF (llama.cpp's hyper-parameters)."""
    hp.norm_eps = float(m("attention.layer_norm_rms_epsilon", 1e-6))
    hp.rope_theta = float(m("rope.freq_base", 10000.0))
    hp.rope_style = "neox"
    hp.activation = "gelu_tanh"
    hp.tie_embeddings = True
    hp.sliding_window = int(m("attention.sliding_window", 0))
    if hp.sliding_window:
        hp.window_layers = [i for i in range(hp.n_layer) if (i + 1) % pattern]
    big = hp.n_layer == n_layer_27b
    hp.attn_scale = (hp.n_embd / hp.n_head if big else hp.head_dim) ** -0.5
    hp.final_softcap = float(m("final_logit_softcapping", 0.0))
    if softcap:
        hp.attn_softcap = float(m("attn_logit_softcapping", 0.0))


def _from_gguf(
    m: GGUFMeta, hp: HParams, tensors: Mapping[str, Tensor], meta: Mapping[str, Any]
) -> None:
    gemma_gguf(m, hp, 2, 46, softcap=True)


GEMMA_REQUIRED = (
    "attn_norm.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "post_attention_norm.weight",
    "ffn_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
    "post_ffw_norm.weight",
)


def gemma_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    return {
        "blk.0.attn_q.weight": (hp.n_head * hp.head_dim, hp.n_embd),
        "blk.0.attn_k.weight": (hp.n_head_kv * hp.head_dim, hp.n_embd),
        "blk.0.ffn_gate.weight": (hp.n_ff, hp.n_embd),
    }


FAMILY = Family(
    name="gemma2",
    kind="text",
    model=Gemma,
    gguf_arch=gguf.MODEL_ARCH.GEMMA2,
    gguf_names=("gemma2",),
    hf_classes=("Gemma2ForCausalLM", "Gemma2Model"),
    model_types=("gemma2",),
    drop=re.compile(r"rotary_emb\.inv_freq$|^lm_head\.weight$"),
    from_config=_from_config,
    from_gguf=_from_gguf,
    transform=add_one_to_norms,
    required=GEMMA_REQUIRED,
    shapes=gemma_shapes,
    lora_slots=LLAMA_LORA_SLOTS,
    lora_modules=HF_LLAMA_MODULES,
)
