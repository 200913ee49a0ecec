"""Mistral 3 / Pixtral's vision tower and projector (``pixtral`` projector; llama.cpp's
``models/pixtral.cpp`` and transformers' ``PixtralVisionModel`` +
``Mistral3MultiModalProjector``)::

    x = rms(patches Wpatch) (ln_pre)         (gh*gw, width), patches row by row, no bias
    per block: x += attn(rms(x)); x += down(silu(gate(rms(x))) * up(rms(x)))
    x = rms(x) (mm.input_norm), each 2x2 block's 4 patches as one (channel, row, col)
    x = x Wmerge                             (gh/2 * gw/2, width): the patch merger
    out = gelu(x W1 + b1) W2 + b2            (gh/2, gw/2, n_embd), row by row

Attention is bidirectional with an axial 2-D RoPE (rotate-half, theta 10000): a head's
first quarter of pairs turns by the patch's row with the even frequencies of the head
dimension, the second quarter by its column with the odd ones.  The converter writes
Q/K rows permuted to interleaved pairs (``LlamaModel.permute``); they are put back at
load.  Pixtral 12B (no merger: ``spatial_merge_size`` absent) runs with ``n_merge`` 1.

In the prompt an image is its rows of ``[IMG]`` positions, an ``[IMG_BREAK]`` token after
every row but the last and ``[IMG_END]`` after it (``PixtralProcessor``): one span a row
(:func:`row_spans`), the breaks ordinary tokens with their own embeddings, as
transformers has them.  (llama.cpp's graph puts a copy of the ``[IMG_BREAK]`` embedding,
the mmproj's ``v.token_embd.img_break``, into the image's embeddings instead: the same
numbers; modelc does not need that tensor, which the converter of llama-cpp-python 0.3.36
leaves out of an HF model's mmproj.)  numpy f32 throughout.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from modelc.runtime.model import ImageSpan
from modelc.vision.preprocess import patchify

if TYPE_CHECKING:
    from modelc.vision.mmproj import VisionConfig

F32 = np.ndarray[Any, np.dtype[np.float32]]
THETA = 10000.0  # llama.cpp's and PixtralVisionConfig's rope_theta
ROWS = 2048  # queries a step: (ROWS, patches) f32 scores


@dataclass(frozen=True, slots=True)
class PixtralBlock:
    ln1: F32  # (width,) RMS norm weights
    ln2: F32
    wq: F32  # (width, width), rows in rotate-half order
    wk: F32
    wv: F32
    wo: F32
    w_gate: F32  # (ff, width)
    w_up: F32
    w_down: F32  # (width, ff)


@dataclass(frozen=True, slots=True)
class PixtralWeights:
    patch: F32  # (width, 3 * p * p), channel-major as the convolution's kernel
    pre: F32  # (width,) ln_pre
    blocks: tuple[PixtralBlock, ...]
    norm: F32 | None  # (width,) the projector's RMS norm (None: no merger)
    merge: F32 | None  # (width, width * n_merge**2)
    w1: F32  # (n_embd, width)
    b1: F32
    w2: F32  # (n_embd, n_embd)
    b2: F32


def _unpermute(w: F32, n_head: int) -> F32:
    """Interleaved-pair rows (the converter's) back to rotate-half rows."""
    return np.ascontiguousarray(
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def load_pixtral(
    cfg: VisionConfig, get: Callable[..., F32], has: Callable[[str], bool]
) -> PixtralWeights:
    """The tower's weights by their mmproj names (``get(name, shape)``)."""
    w, ps, e = cfg.width, cfg.patch_size, cfg.n_embd

    def block(i: int) -> PixtralBlock:
        b = f"v.blk.{i}."
        ff = get(b + "ffn_up.weight").shape[0]
        return PixtralBlock(
            ln1=get(b + "ln1.weight", (w,)),
            ln2=get(b + "ln2.weight", (w,)),
            wq=_unpermute(get(b + "attn_q.weight", (w, w)), cfg.n_head),
            wk=_unpermute(get(b + "attn_k.weight", (w, w)), cfg.n_head),
            wv=get(b + "attn_v.weight", (w, w)),
            wo=get(b + "attn_out.weight", (w, w)),
            w_gate=get(b + "ffn_gate.weight", (ff, w)),
            w_up=get(b + "ffn_up.weight", (ff, w)),
            w_down=get(b + "ffn_down.weight", (w, ff)),
        )

    def bias(name: str) -> F32:
        return get(name, (e,)) if has(name) else np.zeros(e, np.float32)

    merged = cfg.n_merge > 1
    m = w * cfg.n_merge**2
    return PixtralWeights(
        patch=np.ascontiguousarray(get("v.patch_embd.weight", (w, 3, ps, ps)).reshape(w, -1)),
        pre=get("v.pre_ln.weight", (w,)),
        blocks=tuple(block(i) for i in range(cfg.n_layer)),
        norm=get("mm.input_norm.weight", (w,)) if merged else None,
        merge=get("mm.patch_merger.weight", (w, m)) if merged else None,
        w1=get("mm.1.weight", (e, w)),
        b1=bias("mm.1.bias"),
        w2=get("mm.2.weight", (e, e)),
        b2=bias("mm.2.bias"),
    )


def _rms(x: F32, w: F32, eps: float) -> F32:
    out: F32 = x / np.sqrt((x * x).mean(-1, keepdims=True) + np.float32(eps)) * w
    return out


def _rope_2d(gh: int, gw: int, hd: int) -> tuple[F32, F32]:
    """cos and sin (n, 1, hd/2) of each patch (row by row): pairs ``j < hd/4`` turn by
    the row at frequency ``2j``, the others by the column at ``2j + 1``."""
    inv = 1.0 / THETA ** (np.arange(0, hd, 2, dtype=np.float32) / hd)  # (hd/2,)
    r, c = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    ang = np.concatenate(
        [r.ravel()[:, None] * inv[0::2], c.ravel()[:, None] * inv[1::2]], axis=1
    ).astype(np.float32)  # (n, hd/2)
    cos = np.cos(ang.astype(np.float64)).astype(np.float32)[:, None, :]
    sin = np.sin(ang.astype(np.float64)).astype(np.float32)[:, None, :]
    return cos, sin


def _attention(x: F32, b: PixtralBlock, n_head: int, cos: F32, sin: F32) -> F32:
    n, w = x.shape
    hd = w // n_head
    half = hd // 2

    def rope(t: F32) -> F32:  # rotate-half over the whole head
        a, z = t[..., :half], t[..., half:]
        out: F32 = np.concatenate([a * cos - z * sin, z * cos + a * sin], axis=-1)
        return out

    q = rope((x @ b.wq.T).reshape(n, n_head, hd))
    k = rope((x @ b.wk.T).reshape(n, n_head, hd))
    v = (x @ b.wv.T).reshape(n, n_head, hd)
    o = np.empty((n, n_head, hd), np.float32)
    scale = np.float32(1 / math.sqrt(hd))
    for h in range(n_head):
        for a in range(0, n, ROWS):  # (ROWS, n) scores at a time: a 1540-pixel side is 12100
            s = q[a : a + ROWS, h] @ k[:, h].T * scale
            s -= s.max(-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(-1, keepdims=True)
            o[a : a + ROWS, h] = s @ v[:, h]
    out: F32 = o.reshape(n, w) @ b.wo.T
    return out


def encode_pixtral(cfg: VisionConfig, wt: PixtralWeights, pixels: F32) -> F32:
    """One image's embeddings (gh/m, gw/m, n_embd) from its pixel values (3, H, W)."""
    from modelc.runtime.backends.numpy_ref import erf

    p, m = cfg.patch_size, cfg.n_merge
    gh, gw = pixels.shape[1] // p, pixels.shape[2] // p
    x = _rms(patchify(pixels, p) @ wt.patch.T, wt.pre, cfg.eps)  # (gh*gw, width)
    cos, sin = _rope_2d(gh, gw, cfg.width // cfg.n_head)
    for b in wt.blocks:
        x = x + _attention(_rms(x, b.ln1, cfg.eps), b, cfg.n_head, cos, sin)
        h = _rms(x, b.ln2, cfg.eps)
        g = h @ b.w_gate.T
        x = x + (g / (1 + np.exp(-g)) * (h @ b.w_up.T)) @ b.w_down.T
    if wt.norm is not None and wt.merge is not None:
        y = _rms(x, wt.norm, cfg.eps).reshape(gh // m, m, gw // m, m, cfg.width)
        y = y.transpose(0, 2, 4, 1, 3).reshape(-1, cfg.width * m * m)  # torch's unfold
        x = y @ wt.merge.T  # (gh/m * gw/m, width)
    y = x @ wt.w1.T + wt.b1
    y = np.float32(0.5) * y * (1 + erf(y * np.float32(1 / math.sqrt(2))))
    out: F32 = np.ascontiguousarray(
        (y @ wt.w2.T + wt.b2).reshape(gh // m, gw // m, -1), dtype=np.float32
    )
    return out


def row_spans(
    grid: F32, start: int, img_id: int, break_id: int
) -> tuple[list[int], list[ImageSpan]]:
    """An image's prompt ids from ``start`` on and its spans, one a row, from its grid
    (rows, cols, n_embd): each row's ``[IMG]`` positions, then an ``[IMG_BREAK]`` token but
    after the last row."""
    r, c, _ = grid.shape
    ids = ([img_id] * c + [break_id]) * r
    spans = [ImageSpan(start + k * (c + 1), np.ascontiguousarray(grid[k])) for k in range(r)]
    return ids[:-1], spans
