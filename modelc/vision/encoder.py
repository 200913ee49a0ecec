"""The vision tower and projector: pixels in, one embedding per image token out.

Gemma 3 (``gemma3`` projector; llama.cpp's ``clip.cpp`` ``build_siglip`` and transformers'
``SiglipVisionModel`` + ``Gemma3MultiModalProjector``)::

    x = patches(pixels) Wpatch + b + pos            (p*p patches of 3*ps*ps values each)
    per block: x += attn(ln1(x)); x += fc2(gelu_tanh(fc1(ln2(x))))   (bidirectional)
    x = post_ln(x)                                  (p*p, width)
    x = avg_pool(x as a p x p grid, n_merge)        (tokens, width), row by row
    x = rms_norm(x) * soft_emb_norm                 (the file holds 1 + w)
    out = x Wproj                                   (tokens, n_embd)

SmolVLM / Idefics3 (``idefics3``): the same tower on each tile, then
:func:`~modelc.vision.idefics3.pixel_shuffle` and one matrix (no pooling, no norm).
numpy f32 throughout; the math is the same for any image (the pixels are always the
square the tower was trained on).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from modelc.vision.idefics3 import pixel_shuffle
from modelc.vision.preprocess import patchify

if TYPE_CHECKING:
    from modelc.vision.blocks import VisionBlock
    from modelc.vision.mmproj import VisionConfig, VisionWeights

F32 = np.ndarray[Any, np.dtype[np.float32]]


def layer_norm(x: F32, w: F32, b: F32, eps: float) -> F32:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    out: F32 = (x - mu) / np.sqrt(var + np.float32(eps)) * w + b
    return out


def _gelu_tanh(x: F32) -> F32:
    c = np.float32(math.sqrt(2 / math.pi))
    out: F32 = np.float32(0.5) * x * (1 + np.tanh(c * (x + np.float32(0.044715) * x**3)))
    return out


def _attention(x: F32, b: VisionBlock, n_head: int) -> F32:
    n, w = x.shape
    hd = w // n_head
    q = (x @ b.wq.T + b.bq).reshape(n, n_head, hd).transpose(1, 0, 2)  # (heads, n, hd)
    k = (x @ b.wk.T + b.bk).reshape(n, n_head, hd).transpose(1, 0, 2)
    v = (x @ b.wv.T + b.bv).reshape(n, n_head, hd).transpose(1, 0, 2)
    o = np.empty((n, n_head, hd), np.float32)
    for h in range(n_head):  # one head's (n, n) scores at a time: Gemma 3's n is 4096
        s = q[h] @ k[h].T * np.float32(1 / math.sqrt(hd))  # (n, n)
        s -= s.max(-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(-1, keepdims=True)
        o[:, h] = s @ v[h]
    o = o.reshape(n, w)  # (n, width)
    out: F32 = o @ b.wo.T + b.bo
    return out


def siglip_blocks(
    cfg: VisionConfig, blocks: tuple[VisionBlock, ...], x: F32, post_w: F32, post_b: F32
) -> F32:
    """The SigLIP blocks and the final layer norm over embedded patches (n, width)."""
    for b in blocks:
        x = x + _attention(layer_norm(x, b.ln1_w, b.ln1_b, cfg.eps), b, cfg.n_head)
        h = _gelu_tanh(layer_norm(x, b.ln2_w, b.ln2_b, cfg.eps) @ b.w_up.T + b.b_up)
        x = x + (h @ b.w_down.T + b.b_down)
    return layer_norm(x, post_w, post_b, cfg.eps)


def tower(cfg: VisionConfig, wt: VisionWeights, pixels: F32) -> F32:
    """The SigLIP tower's last hidden states (patches, width) of pixels (3, S, S)."""
    x = patchify(pixels, cfg.patch_size) @ wt.patch_w.reshape(cfg.width, -1).T
    x += wt.patch_b
    x += wt.pos  # (patches, width)
    return siglip_blocks(cfg, wt.blocks, x, wt.post_w, wt.post_b)


def encode(cfg: VisionConfig, wt: VisionWeights, pixels: F32) -> F32:
    """One image's (or Idefics3 tile's) embeddings (tokens_per_image, n_embd) from its
    pixels (3, S, S)."""
    x = tower(cfg, wt, pixels)
    side, k = cfg.patches_per_side, cfg.n_merge
    if wt.soft_norm is None:  # Idefics3: pixel shuffle, then the fc
        x = pixel_shuffle(x.reshape(side, side, cfg.width), k)
    else:
        t = side // k
        grid = x.reshape(t, k, t, k, cfg.width).mean(axis=(1, 3))  # (t, t, width) pooled
        x = grid.reshape(t * t, cfg.width)
        x = x / np.sqrt((x * x).mean(-1, keepdims=True) + np.float32(cfg.eps)) * wt.soft_norm
    out: F32 = np.ascontiguousarray(x @ wt.proj, dtype=np.float32)  # (tokens, n_embd)
    return out
