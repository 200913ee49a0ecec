"""Images in: a model's vision part (``--mmproj FILE``, llama.cpp's ``tools/mtmd``).

:class:`VisionModel` is the projector file's tower (:mod:`~modelc.vision.mmproj`): it
decodes a client's image bytes (:mod:`~modelc.vision.preprocess`), makes the pixels the
model's processor would, and encodes them into one embedding per image token
(:mod:`~modelc.vision.encoder`).  :meth:`VisionModel.place` puts a prompt's images at
its media markers as llama.cpp's ``mtmd_tokenize`` does: each marker becomes the
projector's begin text (Gemma 3: ``<start_of_image>``), one position per embedding (an
:class:`~modelc.runtime.model.ImageSpan`, its token id a placeholder), then the end text
(``<end_of_image>``).  Gemma 3's projector, Qwen2.5-VL's, Qwen3-VL's and Mistral 3's
(Pixtral) run: a Qwen or Mistral image's embeddings come as their grid (rows, columns,
n_embd), a size of its own per image; a Qwen span carries the grid for M-RoPE
(:mod:`modelc.runtime.arch.mrope`), Qwen3-VL's are wider by their DeepStack features
(n_embd each), which the span carries as ``deep``; a Mistral image's rows are spans of
their own with an ``[IMG_BREAK]`` token between them
(:func:`~modelc.vision.pixtral.row_spans`).  A SmolVLM / Idefics3 image
(:mod:`~modelc.vision.idefics3`) and a large LFM2-VL one (:mod:`~modelc.vision.lfm2vl`;
a small one is its grid) are :class:`~modelc.vision.pieces.Tiles`: pieces in prompt order,
one span each, each with its own text around it.
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
from modelc.vision.idefics3 import tile_texts, tiles
from modelc.vision.lfm2vl import Lfm2Weights, encode_lfm2, lfm2_pixels
from modelc.vision.mmproj import AnyWeights, VisionConfig, VisionWeights, load_mmproj
from modelc.vision.pieces import Piece, Tiles
from modelc.vision.pixtral import PixtralWeights, encode_pixtral, row_spans
from modelc.vision.preprocess import (
    QWEN_PIXELS,
    ImageError,
    decode_image,
    gemma3_pixels,
    pixtral_pixels,
    qwen_patches,
)
from modelc.vision.qwen3vl import PIXELS as QWEN3_PIXELS
from modelc.vision.qwen3vl import Qwen3Weights, encode_qwen3vl
from modelc.vision.qwen25vl import Qwen25Weights, encode_qwen25

__all__ = [
    "MEDIA_MARKER",
    "TEXT_ARCH",
    "ImageError",
    "PlacedPrompt",
    "Tiles",
    "VisionModel",
    "no_vision",
]

F32 = np.ndarray[Any, np.dtype[np.float32]]
MEDIA_MARKER = "<__media__>"  # llama.cpp's mtmd_default_marker()
# per projector: the text before and after an image's embeddings (mtmd.cpp)
MARKERS = {
    "gemma3": ("<start_of_image>", "<end_of_image>"),
    "qwen2.5vl_merger": ("<|vision_start|>", "<|vision_end|>"),
    "pixtral": ("", "[IMG_END]"),
    "idefics3": ("", ""),  # per tile: idefics3.tile_texts
    "qwen3vl_merger": ("<|vision_start|>", "<|vision_end|>"),
    "lfm2": ("<|image_start|>", "<|image_end|>"),
}
KEEP = 16  # images whose embeddings are kept (a 4B Gemma 3's: 2.6 MB each)
# per projector: the token id an image position carries, if the vocab has it
PLACEHOLDER = {
    "gemma3": "<image_soft_token>",
    "qwen2.5vl_merger": "<|image_pad|>",
    "pixtral": "[IMG]",
    "idefics3": "<image>",
    "qwen3vl_merger": "<|image_pad|>",
    "lfm2": "<image>",
}
# per projector: the text models' architectures it goes with, where that is limited
TEXT_ARCH = {
    "gemma3": ("gemma3",),
    "idefics3": ("llama",),
    "pixtral": ("mistral3", "llama"),
    "lfm2": ("lfm2",),
}
# one image's: its rows of embeddings, a Qwen / LFM2 grid, or tiles (SmolVLM's, LFM2-VL's)
Embedding = F32 | Tiles


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
        self.weights: AnyWeights = weights
        self.bidirectional = cfg.projector == "gemma3"  # llama.cpp: causal attention off
        self._kept: OrderedDict[bytes, Embedding] = OrderedDict()  # image hash -> embeddings
        self._lock = threading.Lock()

    @property
    def tokens_per_image(self) -> int:
        """Gemma 3's tokens an image (a Qwen image's depend on its size)."""
        return self.cfg.tokens_per_image

    def pixels(self, data: bytes, param: str = "image") -> F32 | Tiles:
        """The pixel values of encoded image bytes; ImageError if unusable.  Gemma 3:
        (3, S, S); Qwen2.5-VL: (gh/2, gw/2, 4, 3*2*p*p), each 2x2 block's patches (flat:
        the processor's (gh*gw, 3*2*p*p)); Mistral 3: (3, H, W); Idefics3: :meth:`tiles`'
        pixels; LFM2-VL: (gh, gw, p*p*3), or a large image's :class:`Tiles` of those."""
        return self.tiles(data, param)[0]

    def tiles(self, data: bytes, param: str = "image") -> tuple[F32 | Tiles, int, int]:
        """:meth:`pixels` and an Idefics3 image's rows and columns of tiles (0, 0 for
        other projectors, and for an Idefics3 image that is its global image alone); an
        Idefics3 image's pixels are (rows * cols + 1, 3, S, S), the global image last."""
        img = decode_image(data, param)
        c = self.cfg
        if c.projector == "idefics3":
            return tiles(img, c.image_size, c.longest_edge, c.mean, c.std)
        if c.projector == "gemma3":
            return gemma3_pixels(img, c.image_size, c.mean, c.std), 0, 0
        if c.projector == "pixtral":
            size = c.patch_size * c.n_merge
            return pixtral_pixels(img, c.image_size, size, c.mean, c.std), 0, 0
        if c.projector == "lfm2":  # (gh, gw, p*p*3), or a large image's tiles
            return lfm2_pixels(img, c.patch_size, c.n_merge, c.mean, c.std, param), 0, 0
        limits = QWEN3_PIXELS if c.projector == "qwen3vl_merger" else QWEN_PIXELS
        x, gh, gw = qwen_patches(img, c.patch_size, c.n_merge, c.mean, c.std, limits, param)
        m = c.n_merge
        return x.reshape(gh // m, gw // m, m * m, -1), 0, 0

    def encode(self, pixels: F32 | Tiles) -> F32 | Tiles:
        """One image's embeddings: (tokens_per_image, n_embd), or a Qwen VL or LFM2-VL grid
        (rows, columns, n_embd; Qwen3-VL: n_embd * (1 + DeepStack layers)), or Mistral 3's
        grid (without its [IMG_BREAK] rows); a large LFM2-VL image's :class:`Tiles`."""
        w = self.weights
        if isinstance(w, Lfm2Weights):
            if isinstance(pixels, Tiles):  # each tile's and the thumbnail's
                return pixels.encoded(lambda p: encode_lfm2(self.cfg, w, p))
            return encode_lfm2(self.cfg, w, pixels)
        assert not isinstance(pixels, Tiles)
        if isinstance(w, PixtralWeights):
            return encode_pixtral(self.cfg, w, pixels)
        if isinstance(w, Qwen25Weights | Qwen3Weights):
            m, (r, c) = self.cfg.n_merge, pixels.shape[:2]
            flat, gh, gw = pixels.reshape(r * c * m * m, -1), r * m, c * m
            if isinstance(w, Qwen25Weights):
                return encode_qwen25(self.cfg, w, flat, gh, gw)
            return encode_qwen3vl(self.cfg, w, flat, gh, gw)
        return encode(self.cfg, w, pixels)

    def embed(self, data: bytes, param: str = "image") -> Embedding:
        """Decode, preprocess and encode one image (CPU work: run it in a worker thread);
        the last :data:`KEEP` images' embeddings are kept by the bytes' hash, so a repeated
        image (a chat's earlier turns) is not encoded again.  A split image's (LFM2-VL's
        large ones, every Idefics3 one) are :class:`~modelc.vision.pieces.Tiles`."""
        key = hashlib.blake2b(data, digest_size=16).digest()
        with self._lock:
            hit = self._kept.get(key)
            if hit is not None:
                self._kept.move_to_end(key)
                return hit
        pix, rows, cols = self.tiles(data, param)
        emb: Embedding
        if self.cfg.projector == "idefics3":  # SigLIP weights, pixels a stack of tiles
            w = self.weights
            assert isinstance(w, VisionWeights) and not isinstance(pix, Tiles)
            texts = tile_texts(rows, cols)
            emb = Tiles(
                tuple(
                    Piece(head, encode(self.cfg, w, t), tail)
                    for (head, tail), t in zip(texts, pix, strict=True)
                )
            )
        else:
            emb = self.encode(pix)
        for e in [p.data for p in emb.pieces] if isinstance(emb, Tiles) else [emb]:
            e.flags.writeable = False  # shared between requests
        with self._lock:
            self._kept[key] = emb
            while len(self._kept) > KEEP:
                self._kept.popitem(last=False)
        return emb

    @staticmethod
    def _token(encode_text: Callable[[str], list[int]], text: str) -> int:
        ids = encode_text(text)
        if len(ids) != 1:
            raise UsageError(
                f"the model's vocabulary has no {text} token for its images; give --mmproj the "
                "projector made with this model",
                param="messages",
            )
        return ids[0]

    def place(
        self,
        ids: Sequence[int],
        at: Sequence[int],
        embeds: Sequence[Embedding],
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
        fill = hold[0] if len(hold) == 1 else [*b_ids, *e_ids, 0][0]
        out: list[int] = []
        spans = []
        prev = 0
        for pos, emb in zip(at, embeds, strict=True):
            out += ids[prev:pos]
            prev = pos
            if isinstance(emb, Tiles):  # each piece after its text (modelc.vision.pieces)
                out += b_ids
                for p in emb.pieces:
                    out += encode_text(p.head) if p.head else []
                    grid = p.data.shape[:2] if p.data.ndim == 3 else (0, 0)
                    flat = p.data.reshape(-1, p.data.shape[-1])
                    spans.append(ImageSpan(len(out), flat, self.bidirectional, (grid[0], grid[1])))
                    out += [fill] * len(flat)
                    out += encode_text(p.tail) if p.tail else []
                out += e_ids
                continue
            grid = emb.shape[:2] if emb.ndim == 3 else (0, 0)
            if self.cfg.projector == "pixtral":  # a span a row, [IMG_BREAK] between
                if emb.ndim != 3 or emb.shape[-1] != self.cfg.n_embd:
                    raise ImageError(f"an image embedding has shape {emb.shape}", param="messages")
                out += b_ids
                tok, rows = row_spans(emb, len(out), fill, self._token(encode_text, "[IMG_BREAK]"))
                spans += rows
                out += tok + e_ids
                continue
            flat = emb.reshape(-1, emb.shape[-1]) if emb.ndim == 3 else emb
            d, n_deep = self.cfg.n_embd, len(self.cfg.deepstack)
            want = (len(flat) if grid[0] else self.tokens_per_image, d * (1 + n_deep))
            if flat.shape != want:
                raise ImageError(f"an image embedding has shape {emb.shape}", param="messages")
            deep = flat[:, d:].reshape(len(flat), n_deep, d).transpose(1, 0, 2) if n_deep else None
            out += b_ids
            spans.append(
                ImageSpan(len(out), flat[:, :d], self.bidirectional, (grid[0], grid[1]), deep)
            )
            out += [fill] * len(flat)
            out += e_ids
        out += ids[prev:]
        return PlacedPrompt(out, tuple(spans))
