"""LFM2's short convolution, the recurrent layer in place of attention.

Per token of a sequence (llama.cpp's ``build_shortconv_block``, transformers'
``Lfm2ShortConv``)::

    b, c, x = split(h Win)                   (n, d) each
    y = causal_conv1d(b * x)                 width-L convolution per channel, no bias
    out = (c * y) Wout

What a sequence keeps between steps (:class:`~modelc.runtime.seq_state.SeqState`): the
last ``L - 1`` gated inputs ``b * x``, ``conv`` (L-1, d).  Checkpoints (a draft being
verified, the prefix cache's block boundaries) are kept as :mod:`.deltanet` keeps them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from modelc.errors import FormatError
from modelc.formats.ir import HParams
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.model import SeqChunk, TensorSource

__all__ = ["ShortConv", "load_shortconv", "shortconv"]


@dataclass(slots=True)
class ShortConv:
    """One short-convolution layer's weights (views into the model file)."""

    w_in: Weight  # (3*d, d): the B, C and x rows
    conv: F32Array  # (d, width)
    w_out: Weight  # (d, d)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """What a sequence keeps for this layer."""
        return {"conv": (self.conv.shape[1] - 1, self.conv.shape[0])}


def load_shortconv(src: TensorSource, i: int, hp: HParams) -> ShortConv | None:
    """Block ``i``'s short convolution, or None for an attention block."""
    if i not in hp.recurrent_layers:
        return None
    p, d = f"blk.{i}.shortconv.", hp.n_embd
    conv = src.array(p + "conv.weight")
    net = ShortConv(
        w_in=src.weight(p + "in_proj.weight"),
        conv=np.ascontiguousarray(conv.reshape(conv.shape[0], -1), np.float32),
        w_out=src.weight(p + "out_proj.weight"),
    )
    if net.w_in.shape[0] != 3 * d or net.conv.shape != (d, hp.ssm_conv):
        raise FormatError(
            f"blk.{i}: the short convolution's in_proj has {net.w_in.shape[0]} rows and its "
            f"kernel is {net.conv.shape}; a width of {hp.ssm_conv} over {d} channels needs "
            f"{3 * d} rows and ({d}, {hp.ssm_conv}); the metadata is wrong",
            path=src.ir.source.path,
        )
    return net


def shortconv(
    be: Backend,
    net: ShortConv,
    batch: Sequence[SeqChunk],
    slices: list[slice],
    li: int,
    h: F32Array,
) -> F32Array:
    """Layer ``li`` on the normed activations ``h`` (n, d): each sequence's rows through
    its own state (``chunk.cache.state``); a fresh (n, d) output."""
    d = net.conv.shape[0]
    bcx = be.matmul(net.w_in, h)  # (n, 3d)
    bx = bcx[:, :d] * bcx[:, 2 * d :]  # (n, d)
    y = np.empty_like(bx)  # (n, d)
    for c, sl in zip(batch, slices, strict=True):
        state = c.cache.state
        assert state is not None, "a recurrent layer needs the sequence's state"
        state.begin(li, c.cache.n)
        st = state.layer(li)
        m = sl.stop - sl.start
        x = np.concatenate([st["conv"], bx[sl]])  # (w-1+m, d): the inputs the kernel sees
        y[sl] = be.causal_conv1d(x, net.conv)
        st["conv"][...] = x[m:]
        keep = len(c.rows()) > 1  # a draft being verified: checkpoint every token
        state.scan(li, m, keep, x, None, lambda t0, t1: None)  # the checkpoints alone
    y *= bcx[:, d : 2 * d]
    return be.matmul(net.w_out, np.ascontiguousarray(y))
