"""A split image: its pieces in prompt order, each with the text around it.

LFM2-VL (:mod:`.lfm2vl`): 512-pixel tiles after a ``<|img_row_R_col_C|>`` label each, then
a thumbnail after ``<|img_thumbnail|>``; SmolVLM / Idefics3 (:mod:`.idefics3`): tiles
after ``<fake_token_around_image><row_R_col_C>``, then the global image between
``<fake_token_around_image><global-img>`` and ``<fake_token_around_image>``.  A piece
holds its pixel values until encoded, then its embeddings; each piece is one image span
of the prompt (:meth:`modelc.vision.VisionModel.place`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

F32 = np.ndarray[Any, np.dtype[np.float32]]


@dataclass(frozen=True, slots=True)
class Piece:
    head: str  # the text before the piece's span
    data: F32  # pixel values, or once encoded its embeddings
    tail: str = ""  # the text after it


@dataclass(frozen=True, slots=True)
class Tiles:
    pieces: tuple[Piece, ...]

    def encoded(self, encode: Callable[[F32], F32]) -> Tiles:
        """Each piece's data through ``encode`` (pixels -> embeddings), texts kept."""
        return Tiles(tuple(Piece(p.head, encode(p.data), p.tail) for p in self.pieces))
