"""Images in: a model's vision part (``--mmproj FILE``, llama.cpp's ``tools/mtmd``).

:class:`VisionModel` is the projector file's tower (:mod:`~modelc.vision.mmproj`): it
decodes a client's image bytes (:mod:`~modelc.vision.preprocess`), makes the pixels the
model's processor would, and encodes them into one embedding per image token
(:mod:`~modelc.vision.encoder`).  :meth:`VisionModel.place` puts a prompt's images at
its media markers as llama.cpp's ``mtmd_tokenize`` does: each marker becomes the
projector's begin text (Gemma 3: ``<start_of_image>``), one position per embedding (an
:class:`~modelc.runtime.model.ImageSpan`, its token id a placeholder), then the end text
(``<end_of_image>``).  Gemma 3's projector, Qwen2.5-VL's and LFM2-VL's run
(:mod:`~modelc.vision.lfm2vl`: ``<|image_start|>`` .. ``<|image_end|>``, a large image
as its tiles, each after its label, and a thumbnail: :class:`Tiles`, one span each): a
Qwen or LFM2 image's embeddings come as their grid (rows, columns, n_embd), a size of
its own per image, and its span carries the grid for M-RoPE
(:mod:`modelc.runtime.arch.mrope`; a model without M-RoPE ignores it).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from modelc.errors import UsageError
from modelc.runtime.model import ImageSpan
from modelc.vision.encoder import encode
from modelc.vision.lfm2vl import Lfm2Weights, Tiles, encode_lfm2, lfm2_pixels
from modelc.vision.mmproj import VisionConfig, VisionWeights, load_mmproj
from modelc.vision.preprocess import ImageError, decode_image, gemma3_pixels, qwen_patches
from modelc.vision.qwen25vl import Qwen25Weights, encode_qwen25

__all__ = ["MEDIA_MARKER", "ImageError", "PlacedPrompt", "Tiles", "VisionModel", "no_vision"]

F32 = np.ndarray[Any, np.dtype[np.float32]]
MEDIA_MARKER = "<__media__>"  # llama.cpp's mtmd_default_marker()
# per projector: the text before and after an image's embeddings (mtmd.cpp)
MARKERS = {
    "gemma3": ("<start_of_image>", "<end_of_image>"),
    "qwen2.5vl_merger": ("<|vision_start|>", "<|vision_end|>"),
    "lfm2": ("<|image_start|>", "<|image_end|>"),
}
FAMILIES = {"gemma3": ("gemma3",), "lfm2": ("lfm2",)}  # projector -> its text families
KEEP = 16  # images whose embeddings are kept (a 4B Gemma 3's: 2.6 MB each)
# per projector: the token id an image position carries, if the vocab has it
PLACEHOLDER = {
    "gemma3": "<image_soft_token>",
    "qwen2.5vl_merger": "<|image_pad|>",
    "lfm2": "<image>",
}


def no_vision(model: str) -> ImageError:
    return ImageError(
        f"{model} takes no images; start it with --mmproj FILE (its vision projector)",
        param="messages",
    )


@dataclass(frozen=True, slots=True)
class PlacedPrompt:
    ids: list[int]  # the prompt with each image's positions (placeholder ids)
    images: tuple[ImageSpan, ...]


class VisionModel:
    """A projector file's vision tower (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        cfg, weights = load_mmproj(path)
        self.cfg: VisionConfig = cfg
        self.weights: VisionWeights | Qwen25Weights | Lfm2Weights = weights
        self.bidirectional = cfg.projector == "gemma3"  # llama.cpp: causal attention off
        self._kept: OrderedDict[bytes, F32 | Tiles] = OrderedDict()  # image hash -> embeddings
        self._lock = threading.Lock()

    def goes_with(self, architecture: str) -> bool:
        """Whether this projector's embeddings are for a model of ``architecture``."""
        return architecture in FAMILIES.get(self.cfg.projector, (architecture,))

    @property
    def tokens_per_image(self) -> int:
        """Gemma 3's tokens an image (a Qwen image's depend on its size)."""
        return self.cfg.tokens_per_image

    def pixels(self, data: bytes, param: str = "image") -> F32 | Tiles:
        """The pixel values of encoded image bytes; ImageError if unusable.  Gemma 3:
        (3, S, S); Qwen2.5-VL: (gh/2, gw/2, 4, 3*2*p*p), each 2x2 block's patches (flat:
        the processor's (gh*gw, 3*2*p*p)); LFM2-VL: (gh, gw, p*p*3), or a large image's
        :class:`Tiles` of those."""
        img = decode_image(data, param)
        c = self.cfg
        if c.projector == "gemma3":
            return gemma3_pixels(img, c.image_size, c.mean, c.std)
        if c.projector == "lfm2":  # (gh, gw, p*p*3), or a large image's tiles
            return lfm2_pixels(img, c.patch_size, c.n_merge, c.mean, c.std, param)
        x, gh, gw = qwen_patches(img, c.patch_size, c.n_merge, c.mean, c.std, param=param)
        m = c.n_merge
        return x.reshape(gh // m, gw // m, m * m, -1)

    def encode(self, pixels: F32 | Tiles) -> F32 | Tiles:
        """One image's embeddings: (tokens_per_image, n_embd), or Qwen2.5-VL's and
        LFM2-VL's grid (rows, columns, n_embd)."""
        if isinstance(self.weights, Lfm2Weights):
            wt = self.weights
            if isinstance(pixels, Tiles):  # each tile's and the thumbnail's
                return Tiles(tuple((t, encode_lfm2(self.cfg, wt, p)) for t, p in pixels.pieces))
            return encode_lfm2(self.cfg, wt, pixels)
        assert not isinstance(pixels, Tiles)
        if isinstance(self.weights, Qwen25Weights):
            m, (r, c) = self.cfg.n_merge, pixels.shape[:2]
            return encode_qwen25(
                self.cfg, self.weights, pixels.reshape(r * c * m * m, -1), r * m, c * m
            )
        return encode(self.cfg, self.weights, pixels)

    def embed(self, data: bytes, param: str = "image") -> F32 | Tiles:
        """Decode, preprocess and encode one image (CPU work: run it in a worker thread);
        the last :data:`KEEP` images' embeddings are kept by the bytes' hash, so a repeated
        image (a chat's earlier turns) is not encoded again."""
        key = hashlib.blake2b(data, digest_size=16).digest()
        with self._lock:
            hit = self._kept.get(key)
            if hit is not None:
                self._kept.move_to_end(key)
                return hit
        emb = self.encode(self.pixels(data, param))
        for _, e in emb.pieces if isinstance(emb, Tiles) else (("", emb),):
            e.flags.writeable = False  # shared between requests
        with self._lock:
            self._kept[key] = emb
            while len(self._kept) > KEEP:
                self._kept.popitem(last=False)
        return emb

    def place(
        self,
        ids: Sequence[int],
        at: Sequence[int],
        embeds: Sequence[F32 | Tiles],
        encode_text: Callable[[str], list[int]],
    ) -> PlacedPrompt:
        """The prompt ``ids`` with image ``i`` placed before ``ids[at[i]]`` (``at``
        ascending: where each media marker was); ``encode_text`` tokenizes the begin and
        end texts (control tokens parsed)."""
        if len(at) != len(embeds):
            raise UsageError(
                f"the prompt has {len(at)} image markers for {len(embeds)} images; do not "
                f"write {MEDIA_MARKER} in text",
                param="messages",
            )
        begin, end = MARKERS[self.cfg.projector]
        b_ids, e_ids = encode_text(begin), encode_text(end)
        hold = encode_text(PLACEHOLDER[self.cfg.projector])
        fill = hold[0] if len(hold) == 1 else b_ids[0]
        out: list[int] = []
        spans = []
        prev = 0
        for pos, image in zip(at, embeds, strict=True):
            out += ids[prev:pos]
            out += b_ids
            for label, emb in image.pieces if isinstance(image, Tiles) else (("", image),):
                out += encode_text(label) if label else []  # a tile's (LFM2-VL)
                grid = emb.shape[:2] if emb.ndim == 3 else (0, 0)  # M-RoPE's, if the model's
                emb = emb.reshape(-1, emb.shape[-1]) if emb.ndim == 3 else emb
                want = (len(emb) if grid[0] else self.tokens_per_image, self.cfg.n_embd)
                if emb.shape != want:
                    raise ImageError(f"an image embedding has shape {emb.shape}", param="messages")
                spans.append(ImageSpan(len(out), emb, self.bidirectional, (grid[0], grid[1])))
                out += [fill] * len(emb)
            out += e_ids
            prev = pos
        out += ids[prev:]
        return PlacedPrompt(out, tuple(spans))
