"""A vision projector file (``mmproj`` GGUF) as llama.cpp's ``convert_hf_to_gguf.py
--mmproj`` writes it: ``general.architecture`` ``clip``, the ``clip.vision.*`` keys
(image and patch size, width, heads, layers, mean and std, layer-norm epsilon) and
``clip.projector_type``; tensors ``v.patch_embd`` (width, 3, p, p) with its bias,
``v.position_embd`` (patches, width), per block ``v.blk.{i}.ln1`` / ``ln2`` (weight and
bias), ``attn_q`` / ``attn_k`` / ``attn_v`` / ``attn_out`` and ``ffn_up`` / ``ffn_down``
(each with a bias), ``v.post_ln``; Gemma 3's projector ``mm.soft_emb_norm`` (stored
``1 + w``) and ``mm.input_projection`` (width, n_embd of the text model); SmolVLM /
Idefics3's (``idefics3``) ``mm.model.fc`` (n_embd, width * s * s) after the pixel
shuffle by ``clip.vision.projector.scale_factor`` s, the images tiled to
``clip.vision.preproc_image_size`` (:mod:`modelc.vision.idefics3`).

Gemma 3's projector (``gemma3``) is read here, Qwen2.5-VL's (``qwen2.5vl_merger``) by
:mod:`modelc.vision.qwen25vl`, Qwen3-VL's (``qwen3vl_merger``) by :mod:`modelc.vision.qwen3vl`,
Mistral 3's (``pixtral``) by :mod:`modelc.vision.pixtral`, LFM2-VL's (``lfm2``: these
SigLIP blocks, then its own projector) by :mod:`modelc.vision.lfm2vl`; other projectors
are refused in one line.
Weights are widened to f32 once at load (a projector is small beside its text model).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from modelc.errors import FormatError, ModelcError, UnsupportedError
from modelc.formats.ir import DType, Tensor
from modelc.formats.quants import dequantize
from modelc.vision.blocks import VisionBlock
from modelc.vision.pixtral import PixtralWeights, load_pixtral
from modelc.vision.qwen3vl import Qwen3Weights, load_qwen3vl
from modelc.vision.qwen25vl import Qwen25Weights, load_qwen25

if TYPE_CHECKING:
    from modelc.vision.lfm2vl import Lfm2Weights

F32 = np.ndarray[Any, np.dtype[np.float32]]
PROJECTORS = ("gemma3", "qwen2.5vl_merger", "qwen3vl_merger", "pixtral", "idefics3", "lfm2")


@dataclass(frozen=True, slots=True)
class VisionConfig:
    projector: str
    image_size: int
    patch_size: int
    width: int  # the encoder's hidden size
    n_head: int
    n_layer: int
    eps: float
    n_embd: int  # the text model's width (the projection's output)
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    n_merge: int  # the pooling kernel per side (Gemma 3: 4; Qwen2.5-VL's merger: 2)
    n_wa_pattern: int = 0  # Qwen2.5-VL: every n-th block attends fully, the others in windows
    longest_edge: int = 0  # Idefics3: an image's longest side before it is cut into tiles
    deepstack: tuple[int, ...] = ()  # Qwen3-VL: the blocks whose DeepStack features are taken

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens_per_image(self) -> int:
        return (self.patches_per_side // self.n_merge) ** 2


@dataclass(frozen=True, slots=True)
class VisionWeights:
    patch_w: F32  # (width, 3, p, p)
    patch_b: F32  # (width,)
    pos: F32  # (patches, width)
    blocks: tuple[VisionBlock, ...]
    post_w: F32
    post_b: F32
    soft_norm: F32 | None  # (width,), 1 + w (Gemma 3's; None: Idefics3's pixel shuffle)
    proj: F32  # (width, n_embd); Idefics3: (width * s * s, n_embd)


AnyWeights: TypeAlias = (
    "VisionWeights | Qwen25Weights | Qwen3Weights | PixtralWeights | Lfm2Weights"
)


def _f32(t: Tensor) -> F32:
    data = t.data()
    if t.dtype is DType.BF16:
        data = (np.asarray(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif t.dtype.is_quantized:
        data = dequantize(data, t.dtype, tuple(t.shape))
    return np.ascontiguousarray(data, dtype=np.float32).reshape(tuple(int(n) for n in t.shape))


def _num(meta: Mapping[str, Any], key: str, path: Path, default: Any = None) -> Any:
    value = meta.get(key, default)
    if value is None:
        raise FormatError(f"the vision projector has no {key}; is this an mmproj file?", path=path)
    return value


def _merge(meta: Mapping[str, Any], proj: str) -> int:
    """Patches merged a side: Gemma 3's pooling, Qwen's merger, Mistral 3's patch merger
    (Pixtral 12B has none)."""
    if proj == "pixtral":
        return int(meta.get("clip.vision.spatial_merge_size", 1))
    return int(meta.get("clip.vision.projector.scale_factor", 4 if proj == "gemma3" else 2))


def siglip_blocks(cfg: VisionConfig, get: Callable[..., F32]) -> tuple[VisionBlock, ...]:
    """The SigLIP blocks' weights by their mmproj names (``get(name, shape)``)."""
    w = cfg.width

    def block(i: int) -> VisionBlock:
        b = f"v.blk.{i}."
        up = get(b + "ffn_up.weight")
        ff = up.shape[0]
        att = {
            f"{x}{n}": get(b + f"attn_{a}.{s}", (w, w) if s == "weight" else (w,))
            for a, n in (("q", "q"), ("k", "k"), ("v", "v"), ("out", "o"))
            for s, x in (("weight", "w"), ("bias", "b"))
        }
        return VisionBlock(
            ln1_w=get(b + "ln1.weight", (w,)),
            ln1_b=get(b + "ln1.bias", (w,)),
            **att,
            ln2_w=get(b + "ln2.weight", (w,)),
            ln2_b=get(b + "ln2.bias", (w,)),
            w_up=up,
            b_up=get(b + "ffn_up.bias", (ff,)),
            w_down=get(b + "ffn_down.weight", (w, ff)),
            b_down=get(b + "ffn_down.bias", (w,)),
        )

    return tuple(block(i) for i in range(cfg.n_layer))


def load_mmproj(path: str | Path) -> tuple[VisionConfig, AnyWeights]:
    """The projector's settings and weights; FormatError / UnsupportedError on a file that
    is no mmproj, or whose projector modelc does not run."""
    from modelc.formats.gguf import read_gguf

    p = Path(path)
    try:
        meta, tensors = read_gguf(p)
    except ModelcError:
        raise
    except (OSError, ValueError) as e:
        raise FormatError(f"cannot read the vision projector: {e}", path=p) from e
    if meta.get("general.architecture") != "clip" or not meta.get("clip.has_vision_encoder"):
        raise FormatError(
            "this is no vision projector (general.architecture is "
            f"{meta.get('general.architecture')!r}, not 'clip' with a vision encoder); give "
            "--mmproj the mmproj-*.gguf file made with convert_hf_to_gguf.py --mmproj",
            path=p,
        )
    proj = str(meta.get("clip.projector_type", ""))
    if proj not in PROJECTORS:
        raise UnsupportedError(
            f"vision projector {proj!r} is not supported; modelc runs {', '.join(PROJECTORS)}",
            path=p,
        )
    mean, std = _num(meta, "clip.vision.image_mean", p), _num(meta, "clip.vision.image_std", p)
    cfg = VisionConfig(
        projector=proj,
        image_size=int(_num(meta, "clip.vision.image_size", p)),
        patch_size=int(_num(meta, "clip.vision.patch_size", p)),
        width=int(_num(meta, "clip.vision.embedding_length", p)),
        n_head=int(_num(meta, "clip.vision.attention.head_count", p)),
        n_layer=int(_num(meta, "clip.vision.block_count", p)),
        eps=float(meta.get("clip.vision.attention.layer_norm_epsilon", 1e-6)),
        n_embd=int(_num(meta, "clip.vision.projection_dim", p)),
        mean=(float(mean[0]), float(mean[1]), float(mean[2])),
        std=(float(std[0]), float(std[1]), float(std[2])),
        n_merge=_merge(meta, proj),
        n_wa_pattern=int(meta.get("clip.vision.n_wa_pattern", 0)),
        longest_edge=int(meta.get("clip.vision.preproc_image_size", 0)),
        deepstack=tuple(
            i for i, on in enumerate(meta.get("clip.vision.is_deepstack_layers") or ()) if on
        ),
    )
    if cfg.n_head <= 0 or cfg.width % cfg.n_head:
        raise FormatError(f"width {cfg.width} does not split into {cfg.n_head} heads", path=p)

    def get(name: str, shape: tuple[int, ...] | None = None) -> F32:
        t = tensors.get(name)
        if t is None:
            raise FormatError(f"the vision projector is missing tensor {name!r}", path=p)
        a = _f32(t)
        if shape is not None and a.shape != shape:
            raise FormatError(f"{name} has shape {a.shape}, expected {shape}", path=p)
        return a

    if proj == "qwen2.5vl_merger":
        return cfg, load_qwen25(cfg, get)
    if proj == "pixtral":
        return cfg, load_pixtral(cfg, get, lambda name: name in tensors)
    if proj == "qwen3vl_merger":
        return cfg, load_qwen3vl(cfg, get)
    if proj == "lfm2":
        from modelc.vision.lfm2vl import load_lfm2

        return cfg, load_lfm2(cfg, get, siglip_blocks(cfg, get))
    side = cfg.patches_per_side
    if cfg.patch_size <= 0 or side <= 0 or cfg.n_merge <= 0 or side % cfg.n_merge:
        raise FormatError(
            f"image size {cfg.image_size}, patch size {cfg.patch_size} and pooling "
            f"{cfg.n_merge} do not fit together",
            path=p,
        )
    w, ps = cfg.width, cfg.patch_size
    shuffle, wide = proj == "idefics3", w * cfg.n_merge**2
    if shuffle and cfg.longest_edge < cfg.image_size:
        raise FormatError(
            f"the Idefics3 projector's preprocessor size {cfg.longest_edge} is below its "
            f"tile size {cfg.image_size}; make the mmproj with convert_hf_to_gguf.py --mmproj",
            path=p,
        )

    weights = VisionWeights(
        patch_w=get("v.patch_embd.weight", (w, 3, ps, ps)),
        patch_b=get("v.patch_embd.bias", (w,)),
        pos=get("v.position_embd.weight", (side * side, w)),
        blocks=siglip_blocks(cfg, get),
        post_w=get("v.post_ln.weight", (w,)),
        post_b=get("v.post_ln.bias", (w,)),
        soft_norm=None if shuffle else get("mm.soft_emb_norm.weight", (w,)),
        proj=np.ascontiguousarray(get("mm.model.fc.weight", (cfg.n_embd, wide)).T)
        if shuffle
        else get("mm.input_projection.weight", (w, cfg.n_embd)),
    )
    return cfg, weights
