"""LFM2-VL's vision tower and projector (``lfm2`` projector; llama.cpp's ``clip.cpp`` /
``models/siglip.cpp`` and transformers' ``Lfm2VlModel.get_image_features``)::

    x = patches Wpatch + b + pos(gh, gw)     (gh*gw, width); pos: the 16 x 16 grid resized
    per block: x += attn(ln1(x)); x += fc2(gelu_tanh(fc1(ln2(x))))   (SigLIP, bidirectional)
    x = post_ln(x), each 2x2 block of patches as one row (gh/2 * gw/2, 4 * width)
    out = fc2(gelu(fc1(layer_norm(x))))      (gh/2 * gw/2, n_embd), row by row

SigLIP2 NaFlex: an image keeps its own aspect ratio; the position embeddings (a square
grid) are resized to its patch grid with antialiased bilinear interpolation (PyTorch's
``interpolate(..., antialias=True)``).  The pixels are ``Lfm2VlImageProcessor``'s
(:func:`lfm2_pixels`): RGB resized (PyTorch's antialiased bilinear on uint8 pixels, bit
for bit: :func:`_resize_u8`) to :func:`~modelc.vision.preprocess.smart_resize`'s size,
both sides multiples of 32, within 64 .. 256 image tokens (256 x 256 .. 512 x 512
pixels), normalised, cut into 16 x 16 patches row by row, each patch's values (row,
column, channel).  An image over twice the 256 tokens' pixels (e.g. 724 x 724, which
rounds to 736 x 736) is split as the processor and llama.cpp's ``mtmd`` split it
(:class:`Tiles`): resized to a grid of 512-pixel tiles (2 to 10 of them, the grid's
aspect ratio the nearest the image's), each tile 256 tokens after its
``<|img_row_R_col_C|>``, then the whole image at the size above as a thumbnail after
``<|img_thumbnail|>``.  numpy f32 throughout.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from modelc.vision.encoder import layer_norm, siglip_blocks
from modelc.vision.pieces import Piece, Tiles
from modelc.vision.preprocess import normalise, smart_resize

if TYPE_CHECKING:
    from modelc.vision.blocks import VisionBlock
    from modelc.vision.mmproj import VisionConfig

F32 = np.ndarray[Any, np.dtype[np.float32]]
TOKENS = (64, 256)  # the image tokens an image takes (llama.cpp and the release's processor)
TILE = 512  # a tile's side in pixels
TILES = (2, 10)  # a split image's tiles, at least and at most
TOLERANCE = 2.0  # an image over TOLERANCE x the most tokens' pixels is split
PROJ_EPS = 1e-5  # the projector's nn.LayerNorm


@dataclass(frozen=True, slots=True)
class Lfm2Weights:
    patch: F32  # (width, p * p * 3): the patches' (row, column, channel) order
    patch_b: F32  # (width,)
    pos: F32  # (side, side, width) the position embeddings' grid
    blocks: tuple[VisionBlock, ...]
    post_w: F32  # (width,)
    post_b: F32
    norm_w: F32 | None  # (4 * width,) the projector's layer norm (optional in llama.cpp)
    norm_b: F32 | None
    w1: F32  # (hidden, 4 * width), with its bias
    b1: F32
    w2: F32  # (n_embd, hidden), with its bias
    b2: F32


def load_lfm2(
    cfg: VisionConfig, get: Callable[..., F32], blocks: tuple[VisionBlock, ...]
) -> Lfm2Weights:
    """The tower's weights by their mmproj names (``get(name, shape)``) around its SigLIP
    ``blocks``; the projector's layer norm only where the file has it."""
    from modelc.errors import FormatError

    w, ps = cfg.width, cfg.patch_size
    kernel = get("v.patch_embd.weight", (w, 3, ps, ps))
    pos = get("v.position_embd.weight")
    side = math.isqrt(pos.shape[0])
    if side * side != pos.shape[0] or pos.shape[1:] != (w,):
        raise FormatError(f"v.position_embd has shape {pos.shape}: no square grid of {w}")
    m = cfg.n_merge * cfg.n_merge * w
    norm_w: F32 | None = None
    norm_b: F32 | None = None
    try:
        norm_w, norm_b = get("mm.input_norm.weight", (m,)), get("mm.input_norm.bias", (m,))
    except FormatError:  # LFM2-VL's projector without its layer norm
        norm_w = norm_b = None
    w1 = get("mm.1.weight")
    if w1.shape[1:] != (m,):
        raise FormatError(f"mm.1.weight has shape {w1.shape}, expected (*, {m})")
    return Lfm2Weights(
        patch=np.ascontiguousarray(kernel.transpose(0, 2, 3, 1).reshape(w, -1)),
        patch_b=get("v.patch_embd.bias", (w,)),
        pos=np.ascontiguousarray(pos.reshape(side, side, w)),
        blocks=blocks,
        post_w=get("v.post_ln.weight", (w,)),
        post_b=get("v.post_ln.bias", (w,)),
        norm_w=norm_w,
        norm_b=norm_b,
        w1=w1,
        b1=get("mm.1.bias", (w1.shape[0],)),
        w2=get("mm.2.weight", (cfg.n_embd, w1.shape[0])),
        b2=get("mm.2.bias", (cfg.n_embd,)),
    )


def _resize_u8(img: Any, size: tuple[int, int]) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """``img`` (RGB) resized to ``size`` (w, h) as PyTorch's antialiased bilinear resize
    of uint8 pixels (the processor's, through torchvision): Pillow's two passes, columns
    then rows, each rounded to uint8, but with int16 weights of as many fraction bits
    as the largest weight leaves (Pillow's have 22, and round a few pixels apart)."""
    x: np.ndarray[Any, Any] = np.asarray(img, np.uint8)  # (h, w, 3)
    for axis, n_out in ((1, size[0]), (0, size[1])):
        if x.shape[axis] == n_out:
            continue
        first, wt = _aa_taps(x.shape[axis], n_out)  # (n_out,), (n_out, taps)
        bits = 0
        while bits < 22 and int(0.5 + wt.max() * (1 << (bits + 1))) < (1 << 15):
            bits += 1
        k = (wt * (1 << bits) + 0.5).astype(np.int32)  # >= 0; a sum stays below 2**30
        idx = np.minimum(first[:, None] + np.arange(wt.shape[1]), x.shape[axis] - 1)
        shape = [1, 1, 1]
        shape[axis] = n_out
        y = np.full((*x.shape[:axis], n_out, *x.shape[axis + 1 :]), 1 << (bits - 1), np.int32)
        for j in range(wt.shape[1]):  # each tap (padded taps weigh 0)
            y += np.take(x, idx[:, j], axis=axis) * k[:, j].reshape(shape)
        x = np.clip(y >> bits, 0, 255)
    return x.astype(np.uint8)


def _patches(img: Any, size: tuple[int, int], patch: int, mean: Any, std: Any) -> F32:
    """(gh, gw, p * p * 3): ``img`` resized (:func:`_resize_u8`) to ``size`` (w, h),
    normalised and cut into patches, row by row, each patch's values (row, column,
    channel)."""
    x = normalise(_resize_u8(img, size), mean, std)
    gh, gw = size[1] // patch, size[0] // patch
    x = x.reshape(gh, patch, gw, patch, 3).transpose(0, 2, 1, 3, 4)  # (gh, gw, p, p, C)
    return np.ascontiguousarray(x.reshape(gh, gw, patch * patch * 3))


def _grid(h: int, w: int) -> tuple[int, int]:
    """The tiles' (columns, rows): the aspect ratio nearest the image's among 2 to 10
    tiles, a larger grid on a tie where the image has over half its pixels."""
    lo, hi = TILES
    every = [
        (c, r)
        for n in range(lo, hi + 1)
        for c in range(1, n + 1)
        for r in range(1, n + 1)
        if lo <= c * r <= hi
    ]  # as the processor builds them, so that its set orders equal areas alike
    ratios = sorted(set(every), key=lambda cr: cr[0] * cr[1])
    best, diff = (1, 1), math.inf
    for c, r in ratios:
        d = abs(w / h - c / r)
        if d < diff:
            best, diff = (c, r), d
        elif d == diff and h * w > 0.5 * TILE * TILE * c * r:
            best = (c, r)
    return best


def lfm2_pixels(
    img: Any,
    patch: int,
    merge: int,
    mean: tuple[float, float, float],
    std: tuple[float, float, float],
    param: str = "image",
) -> F32 | Tiles:
    """``Lfm2VlImageProcessor``'s pixel values of an RGB image (see the module docstring):
    (gh, gw, p * p * 3), the image's grid of patches, or a large image's :class:`Tiles`."""
    f = patch * merge
    lo, hi = (n * f * f for n in TOKENS)
    h, w = smart_resize(img.height, img.width, f, lo, hi, param, max_ratio=math.inf, floor=f)
    whole = _patches(img, (w, h), patch, mean, std)
    hb, wb = (max(patch, round(n / f) * f) for n in (img.height, img.width))
    if hb * wb <= hi * TOLERANCE:
        return whole
    cols, rows = _grid(img.height, img.width)
    big = _patches(img, (TILE * cols, TILE * rows), patch, mean, std)
    n = TILE // patch
    tiles = [
        Piece(f"<|img_row_{r + 1}_col_{c + 1}|>", big[r * n : (r + 1) * n, c * n : (c + 1) * n])
        for r in range(rows)
        for c in range(cols)
    ]
    return Tiles((*tiles, Piece("<|img_thumbnail|>", whole)))


def _aa_taps(n_in: int, n_out: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """PyTorch's antialiased bilinear resize (align_corners False), a triangle filter
    widened by the scale when shrinking, normalised: each output's first input (n_out,)
    and its weights (n_out, taps), zero past its last input."""
    scale = n_in / n_out
    support, inv = (scale, 1 / scale) if scale > 1 else (1.0, 1.0)
    first = np.zeros(n_out, np.int64)
    out = np.zeros((n_out, 2 * math.ceil(support) + 1))
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), n_in)
        wt = np.maximum(0.0, 1 - np.abs((np.arange(lo, hi) - center + 0.5) * inv))
        first[i], out[i, : hi - lo] = lo, wt / wt.sum()
    return first, out


def _aa_bilinear(n_in: int, n_out: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    """:func:`_aa_taps` as a (n_out, n_in) matrix."""
    first, wt = _aa_taps(n_in, n_out)
    out = np.zeros((n_out, n_in + wt.shape[1]))
    for i in range(n_out):
        out[i, first[i] : first[i] + wt.shape[1]] = wt[i]
    return out[:, :n_in]


def resize_pos(pos: F32, gh: int, gw: int) -> F32:
    """The (side, side, width) position grid resized to (gh * gw, width), row by row."""
    rows, cols = _aa_bilinear(pos.shape[0], gh), _aa_bilinear(pos.shape[1], gw)
    out = np.einsum("ir,rcw,jc->ijw", rows, pos.astype(np.float64), cols)
    return np.ascontiguousarray(out.reshape(gh * gw, -1), dtype=np.float32)


def encode_lfm2(cfg: VisionConfig, wt: Lfm2Weights, pixels: F32) -> F32:
    """One image's embeddings (gh/2, gw/2, n_embd) from its pixel values (gh, gw, p*p*3)."""
    from modelc.runtime.backends.numpy_ref import erf

    gh, gw, _ = pixels.shape
    x = pixels.reshape(gh * gw, -1) @ wt.patch.T + wt.patch_b
    x += resize_pos(wt.pos, gh, gw)  # (gh * gw, width)
    x = siglip_blocks(cfg, wt.blocks, x, wt.post_w, wt.post_b)
    k = cfg.n_merge  # pixel unshuffle: each k x k block's patches, row by row, as one row
    x = x.reshape(gh // k, k, gw // k, k, cfg.width).transpose(0, 2, 1, 3, 4)
    x = x.reshape((gh // k) * (gw // k), k * k * cfg.width)
    if wt.norm_w is not None and wt.norm_b is not None:
        x = layer_norm(x, wt.norm_w, wt.norm_b, PROJ_EPS)
    h = x @ wt.w1.T + wt.b1
    h = np.float32(0.5) * h * (1 + erf(h * np.float32(1 / math.sqrt(2))))
    out: F32 = np.ascontiguousarray(
        (h @ wt.w2.T + wt.b2).reshape(gh // k, gw // k, -1), dtype=np.float32
    )
    return out
