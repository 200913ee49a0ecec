"""M-RoPE (Qwen2-VL / Qwen2.5-VL; llama.cpp's ``LLAMA_ROPE_TYPE_MROPE``): each head's
rotary pairs cut into three contiguous sections rotating by a token's temporal, height and
width positions (``mrope_section``; pairs ``0..s0-1`` by t, the next ``s1`` by h, the rest
by w), NeoX layout.  Interleaved (Qwen3-VL, ``LLAMA_ROPE_TYPE_IMROPE``; transformers'
``recomposition_frequencies``): pair ``i`` turns by h if ``i % 3 == 1`` and ``i < 3 * s1``,
by w if ``i % 3 == 2`` and ``i < 3 * s2``, else by t.

A text token's three positions are equal.  An image of ``gh x gw`` merged patches placed
at positions ``s .. s + gh*gw - 1`` (an :class:`~modelc.runtime.model.ImageSpan` with its
``grid``) takes ``t = b``, ``h = b + row``, ``w = b + col`` with ``b`` the position its
first token would have had; the text after it continues from ``b + max(gh, gw)``
(transformers' ``get_rope_index``, llama.cpp's ``mtmd_image_tokens_get_n_pos``), so every
later token's positions are its cache index minus ``gh*gw - max(gh, gw)`` per image before
it.  The cache holds keys already rotated: only the current rows' positions are made here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from modelc.errors import UnsupportedError
from modelc.runtime.backend import Backend, F32Array
from modelc.runtime.model import IntArray, SeqChunk


def mrope_positions(batch: Sequence[SeqChunk], pos: IntArray, slices: Sequence[slice]) -> IntArray:
    """The (3, n) t/h/w positions of a step's rows (``pos``: their cache indices)."""
    out = np.repeat(pos[None, :], 3, axis=0)  # (3, n)
    for c, sl in zip(batch, slices, strict=True):
        idx, o = pos[sl], out[:, sl]
        shift = 0  # cache index -> position, from the images before
        for im in sorted(c.images, key=lambda im: im.start):
            gh, gw = im.grid
            if not gh:
                continue
            inside = (idx >= im.start) & (idx < im.end)
            k = idx[inside] - im.start
            base = im.start + shift
            o[0, inside] = base
            o[1, inside] = base + k // gw
            o[2, inside] = base + k % gw
            step = max(gh, gw) - gh * gw
            o[:, idx >= im.end] += step
            shift += step
    return out


def section_of_pairs(sections: Sequence[int], interleaved: bool) -> IntArray:
    """Each rotary pair's section: 0 (t), 1 (h) or 2 (w)."""
    i = np.arange(sum(sections))
    if not interleaved:
        return np.repeat(np.arange(len(sections)), sections).astype(np.int64)
    out = np.zeros(len(i), np.int64)
    out[(i % 3 == 1) & (i < 3 * sections[1])] = 1
    out[(i % 3 == 2) & (i < 3 * sections[2])] = 2
    return out


class MRope:
    """A model's M-RoPE: its sections over the inverse frequencies (rot_dim / 2 pairs),
    contiguous or ``interleaved``."""

    def __init__(self, sections: Sequence[int], inv_freq: F32Array, interleaved: bool) -> None:
        if sum(sections) != len(inv_freq):
            raise UnsupportedError(
                f"M-RoPE sections {list(sections)} do not add up to the {len(inv_freq)} "
                "rotary pairs of a head"
            )
        which = section_of_pairs(sections, interleaved)
        self.pairs = [np.flatnonzero(which == s) for s in range(len(sections))]
        self.inv_freq = inv_freq

    def angles(
        self, be: Backend, batch: Sequence[SeqChunk], pos: IntArray, slices: Sequence[slice]
    ) -> tuple[F32Array, F32Array]:
        """cos and sin (n, pairs) of the step's rows, each section by its own positions."""
        p3 = mrope_positions(batch, pos, slices)
        cos = np.empty((len(pos), len(self.inv_freq)), np.float32)
        sin = np.empty_like(cos)
        for s, idx in enumerate(self.pairs):
            if len(idx):
                cos[:, idx], sin[:, idx] = be.rope_angles(p3[s], self.inv_freq[idx])
        return cos, sin
