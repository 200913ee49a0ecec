"""Mamba-2, the recurrent layer of Granite 4.0-H (``granitehybrid``), in its recurrent form.

Per token of a sequence (llama.cpp's ``build_mamba2_layer``, transformers'
``GraniteMoeHybridMambaLayer``)::

    z, xbc, dt = split(h Win)                 (inner), (inner + 2 g n), (heads)
    x, B, C = split(silu(causal_conv1d(xbc) + bias))     width-w convolution per channel
    dt = softplus(dt + dt_bias);  S = exp(dt A) S + dt x B^T;  y = S C + D x
    out = group_rms_norm(y * silu(z)) Wout    S: (heads, head size, n) per sequence

head ``j`` reads group ``j // (heads / groups)`` of B and C.  What a sequence keeps
between steps (:class:`~modelc.runtime.seq_state.SeqState`): the last ``w - 1`` inputs of
the convolution, ``conv`` (w-1, channels), and ``ssm`` S.  Tokens go one at a time through
S, in the backend's ``causal_conv1d`` and ``ssm_scan`` (C kernels on the CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from modelc.errors import FormatError
from modelc.formats.ir import HParams
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.model import SeqChunk, TensorSource

__all__ = ["Mamba2", "load_mamba2", "mamba2"]


@dataclass(slots=True)
class Mamba2:
    """One Mamba-2 layer's weights (views into the model file)."""

    w_in: Weight  # (2*inner + 2*groups*n + heads, d): z, x B C, dt
    conv: F32Array  # (channels, width), channels = inner + 2*groups*n
    conv_b: F32Array | None  # (channels,)
    dt_b: F32Array  # (heads,)
    a: F32Array  # (heads,): -exp(A_log)
    d_skip: F32Array  # (heads,)
    norm: F32Array  # (groups, inner / groups)
    w_out: Weight  # (d, inner)
    n_head: int
    n_group: int
    d_state: int

    @property
    def inner(self) -> int:
        return self.norm.size

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """What a sequence keeps for this layer."""
        hd = self.inner // self.n_head
        conv = (self.conv.shape[1] - 1, self.conv.shape[0])
        return {"conv": conv, "ssm": (self.n_head, hd, self.d_state)}


def load_mamba2(src: TensorSource, i: int, hp: HParams) -> Mamba2 | None:
    """Block ``i``'s Mamba-2 layer, or None for an attention block."""
    if i not in hp.recurrent_layers:
        return None
    p = f"blk.{i}."
    inner, heads, groups, n = hp.ssm_inner, hp.ssm_v_heads, hp.ssm_k_heads, hp.ssm_head_k
    conv = src.array(p + "ssm_conv1d.weight")
    net = Mamba2(
        w_in=src.weight(p + "ssm_in.weight"),
        conv=np.ascontiguousarray(conv.reshape(conv.shape[0], -1), np.float32),
        conv_b=src.vec(p + "ssm_conv1d.bias") if src.has(p + "ssm_conv1d.bias") else None,
        dt_b=src.vec(p + "ssm_dt.bias"),
        a=src.vec(p + "ssm_a").reshape(-1),
        d_skip=src.vec(p + "ssm_d").reshape(-1),
        norm=src.vec(p + "ssm_norm.weight").reshape(max(groups, 1), -1),
        w_out=src.weight(p + "ssm_out.weight"),
        n_head=heads,
        n_group=groups,
        d_state=n,
    )
    channels = inner + 2 * groups * n
    ok = heads and groups and heads % groups == 0 and inner % heads == 0
    if not ok or net.w_in.shape[0] != channels + inner + heads or net.inner != inner:
        raise FormatError(
            f"blk.{i}: the Mamba-2 layer's sizes ({heads} heads, {groups} groups, state {n}, "
            f"{inner} channels) do not match ssm_in ({net.w_in.shape[0]} rows) and ssm_norm "
            f"({net.norm.size}); the metadata is wrong",
            path=src.ir.source.path,
        )
    return net


def _silu(x: F32Array) -> F32Array:
    out: F32Array = (x / (1.0 + np.exp(-x))).astype(np.float32)
    return out


def mamba2(
    be: Backend,
    net: Mamba2,
    batch: Sequence[SeqChunk],
    slices: list[slice],
    li: int,
    h: F32Array,
    eps: float,
) -> F32Array:
    """Layer ``li`` on the normed activations ``h`` (n, d): each sequence's rows through
    its own state (``chunk.cache.state``); a fresh (n, d) output."""
    n, inner, ch = len(h), net.inner, net.conv.shape[0]
    proj = be.matmul(net.w_in, h)  # (n, inner + channels + heads)
    z, xbc = proj[:, :inner], proj[:, inner : inner + ch]
    dt = np.logaddexp(np.float32(0.0), proj[:, inner + ch :] + net.dt_b).astype(np.float32)
    decay = np.exp(dt * net.a).astype(np.float32)  # (n, heads)
    # each sequence's rows of xbc through its convolution (in place), then every row's heads
    conv_x = [_convolve(be, net, c, sl, li, xbc) for c, sl in zip(batch, slices, strict=True)]
    xs, b, cc = _heads(net, xbc)
    y = np.empty((n, net.n_head, inner // net.n_head), np.float32)  # (n, heads, head size)
    for c, sl, x in zip(batch, slices, conv_x, strict=True):
        state = c.cache.state
        assert state is not None
        s = state.layer(li)["ssm"]  # (heads, head size, n)

        def step(t0: int, t1: int, sl: slice = sl, s: F32Array = s) -> None:
            r = slice(sl.start + t0, sl.start + t1)
            be.ssm_scan(xs[r], b[r], cc[r], dt[r], decay[r], net.d_skip, s, y[r])

        keep = len(c.rows()) > 1  # a draft being verified: checkpoint every token
        state.scan(li, sl.stop - sl.start, keep, x, s, step)
    g = net.n_group
    y2 = y.reshape(n, inner) * _silu(z)  # (n, inner)
    ones = np.ones(inner // g, np.float32)
    normed = be.rms_norm(np.ascontiguousarray(y2.reshape(n * g, -1)), ones, eps)
    out = (normed.reshape(n, g, -1) * net.norm).reshape(n, inner)
    return be.matmul(net.w_out, np.ascontiguousarray(out, np.float32))


def _convolve(be: Backend, net: Mamba2, c: SeqChunk, sl: slice, li: int, xbc: F32Array) -> F32Array:
    """One sequence's rows ``sl`` of ``xbc`` (n, channels) through its convolution, bias and
    silu, in place, its ``conv`` state advanced; returns the inputs the kernel saw (w-1+m,
    channels)."""
    state = c.cache.state
    assert state is not None, "a recurrent layer needs the sequence's state"
    state.begin(li, c.cache.n)
    st = state.layer(li)
    x = np.concatenate([st["conv"], xbc[sl]])  # (w-1+m, channels)
    xbc[sl] = be.causal_conv1d(x, net.conv, net.conv_b, silu=True)
    st["conv"][...] = x[sl.stop - sl.start :]
    return x


def _heads(net: Mamba2, u: F32Array) -> tuple[F32Array, F32Array, F32Array]:
    """x (n, heads, head size), and each head's group's B and C (n, heads, state) from the
    convolution's output u (n, channels)."""
    n, inner, gn = len(u), net.inner, net.n_group * net.d_state
    xs = np.ascontiguousarray(u[:, :inner].reshape(n, net.n_head, inner // net.n_head))
    grp = np.arange(net.n_head) // (net.n_head // net.n_group)
    b = u[:, inner : inner + gn].reshape(n, net.n_group, net.d_state)[:, grp]
    c = u[:, inner + gn :].reshape(n, net.n_group, net.d_state)[:, grp]
    return xs, b, c
