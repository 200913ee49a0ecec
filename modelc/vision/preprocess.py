"""Images in: decoding a client's bytes safely, and the pixels a vision tower takes.

:func:`decode_image` opens PNG, JPEG, WebP or GIF bytes (a GIF or animated WebP: its first
frame) with Pillow under limits (bytes, declared pixels, sides), so that a truncated,
mistyped, zero-size or decompression-bomb image is one :class:`ImageError` (a 400 on the
server) and never a crash; :func:`decode_data_url` reads a ``data:image/...;base64,``
URL.  :func:`gemma3_pixels` is transformers' ``Gemma3ImageProcessor`` (its Pillow
backend, no pan-and-scan): RGB (transparency composited on white), resized to the
tower's square with Pillow's bilinear filter, rescaled by 1/255 and normalised with the
projector's mean and std; (3, size, size) f32.  :func:`qwen_patches` is
``Qwen2VLImageProcessor``'s (Qwen2-VL, Qwen2.5-VL): a size of its own per image;
:func:`pixtral_pixels` ``PixtralImageProcessor``'s (Mistral 3).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import warnings
from typing import Any

import numpy as np

from modelc.errors import UsageError

F32 = np.ndarray[Any, np.dtype[np.float32]]
FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
MAX_BYTES = 20 << 20  # an encoded image
MAX_PIXELS = 50_000_000  # declared width x height (a 7000 x 7000 photo fits)
MAX_SIDE = 16384
QWEN_PIXELS = (56 * 56, 28 * 28 * 1280)  # Qwen2-VL's processor: min and max pixels


class ImageError(UsageError):
    """An image a request carries cannot be used (broken, hostile, too large, a format
    modelc does not read, or sent to a model without a vision part)."""


def decode_data_url(url: str, param: str) -> bytes:
    """The bytes of a ``data:image/<type>;base64,<data>`` URL (another type, such as
    ``text/plain``, is refused, as llama.cpp's server does; the image type need not be the
    bytes': the bytes say what they are)."""
    head, sep, data = url.partition(",")
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        raise ImageError(
            "an image URL must be a base64 data URL of an image (data:image/png;base64,...)",
            param=param,
        )
    return decode_base64(data, param)


def decode_base64(data: str, param: str) -> bytes:
    if len(data) > MAX_BYTES * 4 // 3 + 4:
        raise ImageError(f"the image is larger than {MAX_BYTES >> 20} MiB", param=param)
    try:
        return base64.b64decode(data.strip(), validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageError(f"the image is not valid base64: {e}", param=param) from e


def decode_image(data: bytes, param: str = "image") -> Any:
    """A Pillow RGB image from encoded bytes (its first frame); ImageError if it cannot be
    used.  Pillow is imported here: modelc runs text models without it."""
    try:
        from PIL import Image
    except ImportError as e:  # pragma: no cover - Pillow is a dependency
        raise ImageError("images need Pillow: pip install pillow", param=param) from e
    if not data:
        raise ImageError("the image is empty (0 bytes)", param=param)
    if len(data) > MAX_BYTES:
        raise ImageError(f"the image is larger than {MAX_BYTES >> 20} MiB", param=param)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=FORMATS)
            w, h = img.size
            if w <= 0 or h <= 0:
                raise ImageError(f"the image is {w}x{h} pixels; it has none", param=param)
            if w > MAX_SIDE or h > MAX_SIDE or w * h > MAX_PIXELS:
                raise ImageError(
                    f"the image declares {w}x{h} pixels; at most {MAX_SIDE} a side and "
                    f"{MAX_PIXELS} in all are taken",
                    param=param,
                )
            img.seek(0)  # an animation's first frame
            img.load()
            return _rgb(img)
    except ImageError:
        raise
    except Exception as e:  # Pillow raises many kinds on hostile input; each is one 400
        what = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ImageError(
            f"the image cannot be decoded (PNG, JPEG, WebP or GIF): {what}", param=param
        ) from e


def _rgb(img: Any) -> Any:
    """RGB, any transparency composited onto white (transformers' ``convert_to_rgb``)."""
    from PIL import Image

    if "A" in img.getbands() or img.info.get("transparency") is not None:
        img = img.convert("RGBA")
        white = Image.new("RGBA", img.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, img).convert("RGB")
    return img.convert("RGB")


def gemma3_pixels(
    img: Any, size: int, mean: tuple[float, float, float], std: tuple[float, float, float]
) -> F32:
    """Gemma 3's pixel values of an RGB image: (3, size, size)."""
    from PIL import Image

    small = img.resize((size, size), resample=Image.Resampling.BILINEAR)
    return np.ascontiguousarray(normalise(small, mean, std).transpose(2, 0, 1))


def normalise(img: Any, mean: tuple[float, ...], std: tuple[float, ...]) -> F32:
    """(H, W, 3) f32: rescaled by 1/255, less the mean, over the std (transformers' order)."""
    x: F32 = (np.asarray(img, np.uint8).astype(np.float64) * (1 / 255)).astype(np.float32)
    y = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)  # f32 already
    return y.astype(np.float32, copy=False)


def smart_resize(
    h: int,
    w: int,
    factor: int,
    min_pixels: int,
    max_pixels: int,
    param: str = "image",
    *,
    max_ratio: float = 200,
    floor: int = 0,
) -> tuple[int, int]:
    """Qwen2-VL's target size: both sides multiples of ``factor``, the area within
    ``min_pixels .. max_pixels``, the aspect ratio kept as near as may be (LFM2-VL's:
    no ratio limit, each side first rounded to at least ``floor``)."""
    if max(h, w) / min(h, w) > max_ratio:
        raise ImageError(
            f"the image is {w}x{h}; its sides' ratio must be below {max_ratio:g}", param=param
        )
    hb, wb = max(floor, round(h / factor) * factor), max(floor, round(w / factor) * factor)
    if hb * wb > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        hb = max(factor, math.floor(h / beta / factor) * factor)
        wb = max(factor, math.floor(w / beta / factor) * factor)
    elif hb * wb < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        hb, wb = math.ceil(h * beta / factor) * factor, math.ceil(w * beta / factor) * factor
    return hb, wb


def qwen_patches(
    img: Any,
    patch: int,
    merge: int,
    mean: tuple[float, float, float],
    std: tuple[float, float, float],
    pixels: tuple[int, int] = QWEN_PIXELS,
    param: str = "image",
) -> tuple[F32, int, int]:
    """Qwen2-VL / Qwen2.5-VL's pixel values of an RGB image (``Qwen2VLImageProcessor``, its
    Pillow backend): resized (bicubic) to :func:`smart_resize`'s size within ``pixels``
    (min, max), normalised, cut into ``patch`` squares ordered by ``merge x merge``
    blocks, row by row, each patch's values (channel, frame, row, column) with the one
    frame twice (the temporal patch of 2); ((gh * gw), 3 * 2 * patch * patch) and the
    grid gh x gw of patches."""
    from PIL import Image

    f = patch * merge
    h, w = smart_resize(img.height, img.width, f, *pixels, param)
    x = normalise(img.resize((w, h), resample=Image.Resampling.BICUBIC), mean, std)
    gh, gw = h // patch, w // patch
    x = x.reshape(gh // merge, merge, patch, gw // merge, merge, patch, 3)
    x = x.transpose(0, 3, 1, 4, 6, 2, 5)  # (gh/m, gw/m, m, m, C, p, p)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], 2, patch, patch))
    return np.ascontiguousarray(x.reshape(gh * gw, 3 * 2 * patch * patch)), gh, gw


def pixtral_pixels(
    img: Any,
    longest: int,
    align: int,
    mean: tuple[float, float, float],
    std: tuple[float, float, float],
) -> F32:
    """Pixtral / Mistral 3's pixel values of an RGB image (``PixtralImageProcessor``, its
    Pillow backend, with ``PixtralProcessor``'s patch size times the merge as ``align``):
    shrunk to fit ``longest`` a side, each side then rounded up to a multiple of
    ``align``, resized (bicubic) and normalised; (3, H, W)."""
    from PIL import Image

    h, w = img.height, img.width
    ratio = max(h / longest, w / longest)
    if ratio > 1:
        h, w = max(1, math.floor(h / ratio)), max(1, math.floor(w / ratio))
    h, w = ((h - 1) // align + 1) * align, ((w - 1) // align + 1) * align
    x = normalise(img.resize((w, h), resample=Image.Resampling.BICUBIC), mean, std)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def patchify(pixels: F32, patch: int) -> F32:
    """(3, H, W) -> (H/p * W/p, 3 * p * p), patches row by row, each channel-major (the
    convolution's weight order)."""
    c, h, w = pixels.shape
    x = pixels.reshape(c, h // patch, patch, w // patch, patch).transpose(1, 3, 0, 2, 4)
    return np.ascontiguousarray(x.reshape((h // patch) * (w // patch), c * patch * patch))
