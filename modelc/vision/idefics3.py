"""SmolVLM / Idefics3 images (``idefics3`` projector): tiles, pixel shuffle, prompt text.

As transformers' ``SmolVLMImageProcessor`` / ``Idefics3ImageProcessor`` (Pillow backend)
and ``SmolVLMProcessor``, and llama.cpp's ``mtmd_image_preprocessor_idefics3`` and
``mtmd.cpp`` (``MTMD_SLICE_TMPL_IDEFICS3``):

* :func:`tiles`: the RGB image resized (Lanczos) so that its longest side is the
  preprocessor's ``longest_edge`` (the other side in ratio, rounded down, then up to
  even), resized again so that both sides are multiples of the tile (the tower's image
  size), cut into ``rows x cols`` tiles row by row, and the whole resized to one tile
  (the global image) last; each rescaled by 1/255 and normalised.
* the tower (:func:`~modelc.vision.encoder.tower`) runs on each tile; its (side, side)
  patches go through :func:`pixel_shuffle` (each s x s block's features side by side)
  and one matrix into ``(side / s) ** 2`` embeddings a tile;
* :func:`tile_texts`: the text around each tile's embeddings:
  ``<fake_token_around_image><row_r_col_c>`` before a tile, ``\\n`` after a row but the
  last, then ``\\n\\n<fake_token_around_image><global-img>`` before the global image and
  ``<fake_token_around_image>`` after it.

Where transformers and llama.cpp differ (modelc holds to transformers): an image that
fits one tile (``longest_edge`` no larger than the tile) is the global image alone in
transformers, one 1 x 1 tile plus the global image in llama.cpp; transformers takes the
second resize's short side from the long side's ratio (``int(W / ratio)``), llama.cpp
from the first resize's short side (they can part by one tile only at a side of
``k * tile + 1`` pixels); and llama.cpp's own Lanczos filter gives pixels a few 1/255
away from Pillow's wherever an image is really resized (the global image always is).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

F32 = np.ndarray[Any, np.dtype[np.float32]]
MAX_SIDE = 4096  # transformers' MAX_IMAGE_SIZE: no resized side beyond it
FAKE = "<fake_token_around_image>"
GLOBAL = "<global-img>"
IMAGE = "<image>"  # the token an embedding's position carries


def sizes(h: int, w: int, longest: int, tile: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (height, width) after the first resize (longest side ``longest``) and after
    the second (both sides multiples of ``tile``), as transformers computes them."""
    ratio = w / h
    if w >= h:
        h1, w1 = int(longest / ratio), longest
        h1 += h1 % 2
    else:
        h1, w1 = longest, int(longest * ratio)
        w1 += w1 % 2
    h1, w1 = max(h1, 1), max(w1, 1)
    ratio = w1 / h1
    if w1 >= h1 and w1 > MAX_SIDE:
        h1, w1 = max(int(MAX_SIDE / ratio), 1), MAX_SIDE
    elif h1 > w1 and h1 > MAX_SIDE:
        h1, w1 = MAX_SIDE, max(int(MAX_SIDE * ratio), 1)
    ratio = w1 / h1
    if w1 >= h1:
        w2 = math.ceil(w1 / tile) * tile
        h2 = math.ceil(int(w2 / ratio) / tile) * tile
    else:
        h2 = math.ceil(h1 / tile) * tile
        w2 = math.ceil(int(h2 * ratio) / tile) * tile
    return (h1, w1), (max(h2, tile), max(w2, tile))


def tiles(
    img: Any,
    tile: int,
    longest: int,
    mean: tuple[float, float, float],
    std: tuple[float, float, float],
) -> tuple[F32, int, int]:
    """An RGB image's pixel values (rows * cols + 1, 3, tile, tile), the global image
    last, and its rows and columns of tiles (0, 0: the global image alone)."""
    from PIL import Image

    from modelc.vision.preprocess import normalise

    lanczos = Image.Resampling.LANCZOS
    (h1, w1), (h2, w2) = sizes(img.height, img.width, longest, tile)
    big = img.resize((w1, h1), resample=lanczos).resize((w2, h2), resample=lanczos)
    if h2 <= tile and w2 <= tile:
        parts, rows, cols = [big], 0, 0
    else:
        rows, cols = h2 // tile, w2 // tile
        parts = [
            big.crop((c * tile, r * tile, (c + 1) * tile, (r + 1) * tile))
            for r in range(rows)
            for c in range(cols)
        ]
        parts.append(big.resize((tile, tile), resample=lanczos))
    x = np.stack([normalise(p, mean, std).transpose(2, 0, 1) for p in parts])
    return np.ascontiguousarray(x, dtype=np.float32), rows, cols


def pixel_shuffle(x: F32, s: int) -> F32:
    """(side, side, width) -> ((side/s)**2, width*s*s): each s x s block's patches, row by
    row, side by side (transformers' ``SmolVLMConnector.pixel_shuffle``)."""
    side, _, width = x.shape
    t = side // s
    y = x.reshape(t, s, t, s, width).transpose(0, 2, 1, 3, 4)  # (t, t, s, s, width)
    return np.ascontiguousarray(y.reshape(t * t, s * s * width))


def tile_texts(rows: int, cols: int) -> list[tuple[str, str]]:
    """Per tile (row by row, the global image last), the text before and after its
    embeddings."""
    if rows == 0:
        return [(FAKE + GLOBAL, FAKE)]
    out = []
    for r in range(rows):
        for c in range(cols):
            head = ("\n" if r and c == 0 else "") + f"{FAKE}<row_{r + 1}_col_{c + 1}>"
            out.append((head, ""))
    out.append(("\n\n" + FAKE + GLOBAL, FAKE))
    return out
