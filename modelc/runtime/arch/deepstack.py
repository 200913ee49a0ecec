"""DeepStack (Qwen3-VL; llama.cpp's ``n_deepstack_layers``, transformers'
``_deepstack_process``): after decoder layer ``l`` of the first ``n_deepstack``, each image
position's hidden state gets the ``l``-th of its image's DeepStack features
(:attr:`~modelc.runtime.model.ImageSpan.deep`, made by the vision tower's intermediate
mergers: :mod:`modelc.vision.qwen3vl`); text positions get nothing (llama.cpp pads their
wider input embedding with zeros).
"""

from __future__ import annotations

from collections.abc import Sequence

from modelc.runtime.backend import F32Array
from modelc.runtime.model import SeqChunk


def add_deepstack(
    batch: Sequence[SeqChunk], slices: Sequence[slice], x: F32Array, layer: int
) -> None:
    """Add layer ``layer``'s DeepStack features to the rows of ``x`` (n, d) at image
    positions (images without features, or with fewer layers of them, add nothing)."""
    for c, sl in zip(batch, slices, strict=True):
        for im, a, b in c.spans():
            if im.deep is None or layer >= len(im.deep):
                continue
            off = c.cache.n + a - im.start
            x[sl.start + a : sl.start + b] += im.deep[layer, off : off + b - a]
