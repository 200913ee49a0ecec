"""Qwen3-VL's vision tower, merger and DeepStack mergers (``qwen3vl_merger`` projector;
llama.cpp's ``models/qwen3vl.cpp`` and transformers' ``Qwen3VLVisionModel``)::

    x = patches Wpatch + b + pos              (gh*gw, width); Wpatch: both frames' kernels;
                                              pos: the learned (s x s) table resampled to
                                              gh x gw (bilinear, corners aligned)
    per block: x += attn(ln1(x)); x += fc2(gelu_tanh(fc1(ln2(x))))   (layer norms, biases)
        after a DeepStack block k:  deep_k = fc2(gelu(fc1(ln_k(x as (gh*gw/4, 4*width)))))
    y = ln(x) (post_ln, per patch) as (gh*gw/4, 4*width); out = fc2(gelu(fc1(y)))

Attention is bidirectional over the whole image with Qwen2.5-VL's 2-D RoPE
(:func:`~modelc.vision.qwen25vl.rope_tables`); the mergers' GELU is exact (erf).  An image's
embeddings come as llama.cpp's ``clip_n_mmproj_embd``: (gh/2, gw/2, n_embd * (1 + layers)),
the merger's output then each DeepStack layer's, which :class:`~modelc.vision.VisionModel`
places as an :class:`~modelc.runtime.model.ImageSpan` with its ``deep`` features.
Pixels as ``Qwen2VLImageProcessor`` with the release's limits (:data:`PIXELS`).
numpy f32 throughout.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from modelc.errors import FormatError
from modelc.vision.blocks import VisionBlock
from modelc.vision.encoder import _gelu_tanh, layer_norm
from modelc.vision.qwen25vl import _erf, _grid, attention, rope_tables

if TYPE_CHECKING:
    from modelc.vision.mmproj import VisionConfig

F32 = np.ndarray[Any, np.dtype[np.float32]]
# Qwen3-VL's processor: at least 65536 pixels; at most llama.cpp's 4096 tokens (the
# processor's own 16777216 would be 16384 tokens, past what one attention over the image takes)
PIXELS = (65536, 4096 * 32 * 32)


@dataclass(frozen=True, slots=True)
class Merger:
    norm_w: F32  # (width,) the main merger (per patch); (4 * width,) a DeepStack one
    norm_b: F32
    w1: F32  # (4 * width, 4 * width)
    b1: F32
    w2: F32  # (n_embd, 4 * width)
    b2: F32


@dataclass(frozen=True, slots=True)
class Qwen3Weights:
    patch: F32  # (width, 3 * 2 * p * p): (channel, frame, row, column) as the pixel values
    patch_b: F32  # (width,)
    pos: F32  # (s * s, width) the learned position table
    blocks: tuple[VisionBlock, ...]
    merger: Merger
    deep: dict[int, Merger]  # block index -> its DeepStack merger, in block order


def load_qwen3vl(cfg: VisionConfig, get: Callable[..., F32]) -> Qwen3Weights:
    """The tower's weights by their mmproj names (``get(name, shape)``)."""
    w, ps, m = cfg.width, cfg.patch_size, 4 * cfg.width
    frames = [get(f"v.patch_embd.weight{s}", (w, 3, ps, ps)) for s in ("", ".1")]
    pos = get("v.position_embd.weight")
    side = math.isqrt(len(pos))
    if side * side != len(pos) or pos.shape[1:] != (w,):
        raise FormatError(f"v.position_embd has shape {pos.shape}: a square table is needed")

    def block(i: int) -> VisionBlock:
        b = f"v.blk.{i}."
        ff = get(b + "ffn_up.weight").shape[0]
        qkv, bqkv = get(b + "attn_qkv.weight", (3 * w, w)), get(b + "attn_qkv.bias", (3 * w,))
        return VisionBlock(
            ln1_w=get(b + "ln1.weight", (w,)),
            ln1_b=get(b + "ln1.bias", (w,)),
            ln2_w=get(b + "ln2.weight", (w,)),
            ln2_b=get(b + "ln2.bias", (w,)),
            wq=qkv[:w],
            bq=bqkv[:w],
            wk=qkv[w : 2 * w],
            bk=bqkv[w : 2 * w],
            wv=qkv[2 * w :],
            bv=bqkv[2 * w :],
            wo=get(b + "attn_out.weight", (w, w)),
            bo=get(b + "attn_out.bias", (w,)),
            w_up=get(b + "ffn_up.weight", (ff, w)),
            b_up=get(b + "ffn_up.bias", (ff,)),
            w_down=get(b + "ffn_down.weight", (w, ff)),
            b_down=get(b + "ffn_down.bias", (w,)),
        )

    def merger(norm: str, fc1: str, fc2: str, width: int) -> Merger:
        return Merger(
            norm_w=get(norm + ".weight", (width,)),
            norm_b=get(norm + ".bias", (width,)),
            w1=get(fc1 + ".weight", (m, m)),
            b1=get(fc1 + ".bias", (m,)),
            w2=get(fc2 + ".weight", (cfg.n_embd, m)),
            b2=get(fc2 + ".bias", (cfg.n_embd,)),
        )

    deep = {
        i: merger(f"v.deepstack.{i}.norm", f"v.deepstack.{i}.fc1", f"v.deepstack.{i}.fc2", m)
        for i in cfg.deepstack
    }
    return Qwen3Weights(
        patch=np.ascontiguousarray(np.stack(frames, axis=2).reshape(w, -1)),
        patch_b=get("v.patch_embd.bias", (w,)),
        pos=pos,
        blocks=tuple(block(i) for i in range(cfg.n_layer)),
        merger=merger("v.post_ln", "mm.0", "mm.2", w),
        deep=deep,
    )


def _gelu(x: F32) -> F32:
    out: F32 = np.float32(0.5) * x * (1 + _erf(x * np.float32(1 / math.sqrt(2))))
    return out


def _merge(mg: Merger, x: F32, eps: float, width: int, per_patch: bool) -> F32:
    """A merger: (patches, width) -> (patches / 4, n_embd)."""
    if per_patch:  # the main merger norms each patch, then joins each 2x2 block
        y = layer_norm(x, mg.norm_w, mg.norm_b, eps).reshape(-1, 4 * width)
    else:  # a DeepStack merger joins first
        y = layer_norm(x.reshape(-1, 4 * width), mg.norm_w, mg.norm_b, eps)
    out: F32 = _gelu(y @ mg.w1.T + mg.b1) @ mg.w2.T + mg.b2
    return out


def position_embeddings(pos: F32, gh: int, gw: int, merge: int) -> F32:
    """The learned (s*s, width) table resampled to gh x gw patches (bilinear, corners
    aligned, as transformers' ``get_vision_interpolation_indices_and_weights``), in
    merge-block order: (gh*gw, width)."""
    side = math.isqrt(len(pos))
    rows, cols = _grid(gh, gw, merge)

    def taps(idx: np.ndarray[Any, Any], size: int) -> tuple[list[Any], list[F32]]:
        src = idx.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
        lo = np.floor(src)
        out_t, out_w = [], []
        for off in (0, 1):
            out_t.append(np.clip(lo.astype(np.int64) + off, 0, side - 1))
            out_w.append(np.maximum(np.float32(1) - np.abs(src - lo - off), 0).astype(np.float32))
        return out_t, out_w

    (r0, r1), (wr0, wr1) = taps(rows, gh)
    (c0, c1), (wc0, wc1) = taps(cols, gw)
    out = np.zeros((len(rows), pos.shape[1]), np.float32)
    for r, wr in ((r0, wr0), (r1, wr1)):
        for c, wc in ((c0, wc0), (c1, wc1)):
            out += pos[r * side + c] * (wr * wc)[:, None]
    return out


def encode_qwen3vl(cfg: VisionConfig, wt: Qwen3Weights, patches: F32, gh: int, gw: int) -> F32:
    """One image's embeddings (gh/2, gw/2, n_embd * (1 + DeepStack layers)) from its pixel
    values (gh*gw, 3*2*p*p)."""
    m, w = cfg.n_merge, cfg.width
    cos, sin = rope_tables(gh, gw, m, w // cfg.n_head)
    whole = [np.arange(gh * gw)]
    x = patches @ wt.patch.T + wt.patch_b  # (n, width)
    x += position_embeddings(wt.pos, gh, gw, m)
    outs = []
    for i, b in enumerate(wt.blocks):
        h = layer_norm(x, b.ln1_w, b.ln1_b, cfg.eps)
        x = x + attention(h, b, cfg.n_head, cos, sin, whole)
        h = _gelu_tanh(layer_norm(x, b.ln2_w, b.ln2_b, cfg.eps) @ b.w_up.T + b.b_up)
        x = x + (h @ b.w_down.T + b.b_down)
        if i in wt.deep:
            outs.append(_merge(wt.deep[i], x, cfg.eps, w, per_patch=False))
    outs.insert(0, _merge(wt.merger, x, cfg.eps, w, per_patch=True))
    out: F32 = np.ascontiguousarray(
        np.concatenate(outs, axis=1).reshape(gh // m, gw // m, -1), dtype=np.float32
    )
    return out
