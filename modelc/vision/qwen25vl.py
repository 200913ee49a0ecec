"""Qwen2.5-VL's vision tower and merger (``qwen2.5vl_merger`` projector; llama.cpp's
``clip.cpp`` / ``models/qwen2vl.cpp`` and transformers' ``Qwen2_5_VisionTransformerPretrainedModel``)::

    x = patches Wpatch                       (gh*gw, width); Wpatch: both frames' kernels
    per block: x += attn(rms(x)); x += down(silu(gate(rms(x))) * up(rms(x)))
    x = rms(x) (post_ln), each 2x2 block's 4 rows as one (gh*gw/4, 4*width)
    out = gelu(x W0 + b0) W2 + b2            (gh/2 * gw/2, n_embd), row by row

The patches come ordered by 2x2 merge blocks (:func:`~modelc.vision.preprocess.qwen_patches`).
Attention is bidirectional with a 2-D RoPE (rotate-half; a head's first quarter of pairs
turns by the patch's row, the second by its column, ``theta`` 10000); every
``n_wa_pattern``-th block attends over the whole image, the others within windows of
112 pixels (4 x 4 merge blocks at patch 14), as ``get_vision_window_index`` groups them.
numpy f32 throughout.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from modelc.vision.mmproj import VisionConfig

F32 = np.ndarray[Any, np.dtype[np.float32]]
WINDOW = 112  # pixels a window's side (llama.cpp's attn_window_size default, transformers')
THETA = 10000.0


@dataclass(frozen=True, slots=True)
class Qwen25Block:
    ln1: F32  # (width,) RMS norm weights
    ln2: F32
    wq: F32  # (width, width), each with its bias (width,)
    bq: F32
    wk: F32
    bk: F32
    wv: F32
    bv: F32
    wo: F32
    bo: F32
    w_gate: F32  # (ff, width), each with its bias
    b_gate: F32
    w_up: F32
    b_up: F32
    w_down: F32  # (width, ff)
    b_down: F32


@dataclass(frozen=True, slots=True)
class Qwen25Weights:
    patch: F32  # (width, 3 * 2 * p * p): (channel, frame, row, column) as the pixel values
    blocks: tuple[Qwen25Block, ...]
    post: F32  # (width,) the merger's RMS norm
    w0: F32  # (4 * width, 4 * width)
    b0: F32
    w2: F32  # (n_embd, 4 * width)
    b2: F32


def load_qwen25(cfg: VisionConfig, get: Callable[..., F32]) -> Qwen25Weights:
    """The tower's weights by their mmproj names (``get(name, shape)``)."""
    w, ps = cfg.width, cfg.patch_size
    frames = [get(f"v.patch_embd.weight{s}", (w, 3, ps, ps)) for s in ("", ".1")]
    patch = np.stack(frames, axis=2).reshape(w, -1)  # (width, C, T, p, p) flattened

    def block(i: int) -> Qwen25Block:
        b = f"v.blk.{i}."
        ff = get(b + "ffn_up.weight").shape[0]
        att = {
            f"{x}{n}": get(b + f"attn_{a}.{s}", (w, w) if s == "weight" else (w,))
            for a, n in (("q", "q"), ("k", "k"), ("v", "v"), ("out", "o"))
            for s, x in (("weight", "w"), ("bias", "b"))
        }
        shapes = {"gate": (ff, w), "up": (ff, w), "down": (w, ff)}
        ffn = {
            f"{x}_{n}": get(b + f"ffn_{n}.{s}", shape if s == "weight" else shape[:1])
            for n, shape in shapes.items()
            for s, x in (("weight", "w"), ("bias", "b"))
        }
        return Qwen25Block(
            ln1=get(b + "ln1.weight", (w,)), ln2=get(b + "ln2.weight", (w,)), **att, **ffn
        )

    m = 4 * w  # the 2x2 merge
    return Qwen25Weights(
        patch=np.ascontiguousarray(patch),
        blocks=tuple(block(i) for i in range(cfg.n_layer)),
        post=get("v.post_ln.weight", (w,)),
        w0=get("mm.0.weight", (m, m)),
        b0=get("mm.0.bias", (m,)),
        w2=get("mm.2.weight", (cfg.n_embd, m)),
        b2=get("mm.2.bias", (cfg.n_embd,)),
    )


def _rms(x: F32, w: F32, eps: float) -> F32:
    out: F32 = x / np.sqrt((x * x).mean(-1, keepdims=True) + np.float32(eps)) * w
    return out


def _erf(x: F32) -> F32:
    from modelc.runtime.backends.numpy_ref import erf

    return erf(x)


def _grid(gh: int, gw: int, merge: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Each patch's row and column (patches in merge-block order)."""
    r, c = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    shape = (gh // merge, merge, gw // merge, merge)
    return r.reshape(shape).transpose(0, 2, 1, 3).ravel(), c.reshape(shape).transpose(
        0, 2, 1, 3
    ).ravel()


class AttnWeights(Protocol):
    """A vision block's attention projections, each with its bias (Qwen2.5-VL, Qwen3-VL)."""

    @property
    def wq(self) -> F32: ...
    @property
    def bq(self) -> F32: ...
    @property
    def wk(self) -> F32: ...
    @property
    def bk(self) -> F32: ...
    @property
    def wv(self) -> F32: ...
    @property
    def bv(self) -> F32: ...
    @property
    def wo(self) -> F32: ...
    @property
    def bo(self) -> F32: ...


def rope_tables(gh: int, gw: int, merge: int, head_dim: int) -> tuple[F32, F32]:
    """The 2-D RoPE's cos and sin (n, 1, head_dim / 2) of a gh x gw grid of patches in
    merge-block order: a head's first half of pairs turns by the patch's row, the second
    by its column (``theta`` 10000)."""
    rows, cols = _grid(gh, gw, merge)
    hd = head_dim
    inv = (1.0 / THETA ** (np.arange(0, hd // 2, 2, dtype=np.float32) / (hd // 2))).astype(
        np.float32
    )
    ang = np.concatenate([rows[:, None] * inv, cols[:, None] * inv], axis=1)  # (n, hd/2)
    cos = np.cos(ang.astype(np.float64)).astype(np.float32)[:, None, :]  # (n, 1, hd/2)
    sin = np.sin(ang.astype(np.float64)).astype(np.float32)[:, None, :]
    return cos, sin


def attention(
    x: F32, b: AttnWeights, n_head: int, cos: F32, sin: F32, groups: list[np.ndarray[Any, Any]]
) -> F32:
    """Bidirectional attention with the 2-D RoPE, within each group of rows."""
    n, w = x.shape
    hd = w // n_head
    half = hd // 2

    def heads(wt: F32, bias: F32) -> F32:
        return (x @ wt.T + bias).reshape(n, n_head, hd)

    def rope(t: F32) -> F32:  # rotate-half
        a, z = t[..., :half], t[..., half:]
        out: F32 = np.concatenate([a * cos - z * sin, z * cos + a * sin], axis=-1)
        return out

    q, k, v = rope(heads(b.wq, b.bq)), rope(heads(b.wk, b.bk)), heads(b.wv, b.bv)
    o = np.empty((n, n_head, hd), np.float32)
    scale = np.float32(1 / math.sqrt(hd))
    for idx in groups:  # windows (or the whole image) attend within themselves
        for h in range(n_head):
            s = q[idx, h] @ k[idx, h].T * scale
            s -= s.max(-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(-1, keepdims=True)
            o[idx, h] = s @ v[idx, h]
    out: F32 = o.reshape(n, w) @ b.wo.T + b.bo
    return out


def encode_qwen25(cfg: VisionConfig, wt: Qwen25Weights, patches: F32, gh: int, gw: int) -> F32:
    """One image's embeddings (gh/2, gw/2, n_embd) from its pixel values (gh*gw, 3*2*p*p)."""
    m = cfg.n_merge
    rows, cols = _grid(gh, gw, m)
    cos, sin = rope_tables(gh, gw, m, cfg.width // cfg.n_head)
    ws = WINDOW // m // cfg.patch_size  # merge blocks a window's side
    win = (rows // m // ws) * (gw // m) + cols // m // ws  # each patch's window
    windows = [np.flatnonzero(win == g) for g in np.unique(win)]
    whole = [np.arange(len(rows))]
    x = patches @ wt.patch.T  # (n, width)
    for i, b in enumerate(wt.blocks):
        full = cfg.n_wa_pattern == 0 or (i + 1) % cfg.n_wa_pattern == 0
        x = x + attention(
            _rms(x, b.ln1, cfg.eps), b, cfg.n_head, cos, sin, whole if full else windows
        )
        h = _rms(x, b.ln2, cfg.eps)
        g = h @ b.w_gate.T + b.b_gate
        g = g / (1 + np.exp(-g)) * (h @ b.w_up.T + b.b_up)
        x = x + (g @ b.w_down.T + b.b_down)
    y = _rms(x, wt.post, cfg.eps).reshape(-1, m * m * cfg.width)  # (tokens, 4 * width)
    y = y @ wt.w0.T + wt.b0
    y = np.float32(0.5) * y * (1 + _erf(y * np.float32(1 / math.sqrt(2))))
    out: F32 = np.ascontiguousarray(
        (y @ wt.w2.T + wt.b2).reshape(gh // m, gw // m, -1), dtype=np.float32
    )
    return out
