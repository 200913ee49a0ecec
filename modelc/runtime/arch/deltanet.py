"""Gated DeltaNet linear attention (Qwen3.5 / Qwen3-Next), the recurrent form.

In place of attention a recurrent layer (llama.cpp's ``build_layer_attn_linear``,
transformers' ``Qwen3_5GatedDeltaNet``) computes, per token of a sequence::

    qkv = h Wqkv;  z = h Wgate;  beta = sigmoid(h Wbeta);  g = a * softplus(h Walpha + dt)
    q, k, v = split(silu(causal_conv1d(qkv)))      width-w convolution per channel
    q, k = l2norm(q), l2norm(k);  q /= sqrt(d_k)
    S = exp(g) S;  S += k (beta (v - k^T S))^T;  o = q^T S     S: (heads, d_k, d_v)
    out = (rms_norm(o) * silu(z)) Wout

value head ``j`` reads key head ``j % key heads`` (qwen35's GGUF: tiled order), or
``j // (value heads / key heads)`` (qwen3next: grouped, as transformers).  Qwen3-Next's
``ssm_ba`` holds per key head its value heads' beta rows then their alpha rows.  What a sequence
keeps between steps (:class:`~modelc.runtime.seq_state.SeqState`): the last ``w - 1``
inputs of the convolution, ``conv`` (w-1, channels), and ``ssm`` S.  Tokens go one at a
time through S, in the backend's ``causal_conv1d`` and ``delta_scan`` (C kernels on the CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from modelc.errors import FormatError
from modelc.formats.ir import HParams
from modelc.runtime.backend import Backend, F32Array, Weight
from modelc.runtime.model import SeqChunk, TensorSource

__all__ = ["DeltaNet", "deltanet", "load_deltanet"]

L2_EPS = np.float32(1e-6)  # transformers' l2norm (the FLA kernels')


@dataclass(slots=True)
class DeltaNet:
    """One Gated DeltaNet layer's weights (views into the model file)."""

    wqkv: Weight  # (2*n_k*d_k + n_v*d_v, d)
    wz: Weight  # (n_v*d_v, d): the output gate
    wbeta: Weight  # (n_v, d)
    walpha: Weight  # (n_v, d)
    conv: F32Array  # (channels, width)
    dt: F32Array  # (n_v,)
    a: F32Array  # (n_v,): -exp(A_log)
    norm: F32Array  # (d_v,)
    wout: Weight  # (d, n_v*d_v)
    n_k: int  # key heads
    n_v: int  # value heads
    d_k: int
    d_v: int
    grouped: bool = False  # value head j reads key head j // (n_v / n_k); else j % n_k

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """What a sequence keeps for this layer."""
        return {"conv": (self.conv.shape[1] - 1, self.conv.shape[0]), "ssm": self.ssm_shape}

    @property
    def ssm_shape(self) -> tuple[int, int, int]:
        return (self.n_v, self.d_k, self.d_v)


def _rows(w: Weight, rows: list[int]) -> Weight:
    """Rows of ``w`` gathered (a copy; rows are independent in every dtype)."""
    return Weight(w.dtype, (len(rows), w.shape[1]), np.ascontiguousarray(w.data[rows]))


def _beta_alpha(src: TensorSource, p: str, nk: int, nv: int) -> tuple[Weight, Weight]:
    if not src.has(p + "ssm_ba.weight"):
        return src.weight(p + "ssm_beta.weight"), src.weight(p + "ssm_alpha.weight")
    ba, r = src.weight(p + "ssm_ba.weight"), nv // nk  # per key head: r betas, r alphas
    beta = [g * 2 * r + j for g in range(nk) for j in range(r)]
    return _rows(ba, beta), _rows(ba, [b + r for b in beta])


def load_deltanet(src: TensorSource, i: int, hp: HParams, grouped: bool = False) -> DeltaNet | None:
    """Block ``i``'s recurrent layer, or None for an attention block."""
    if i not in hp.recurrent_layers:
        return None
    p = f"blk.{i}."
    nk, nv, dk = hp.ssm_k_heads, hp.ssm_v_heads, hp.ssm_head_k
    dv = hp.ssm_inner // nv if nv else 0
    conv = src.array(p + "ssm_conv1d.weight")
    if not nk or nv % nk:
        raise FormatError(f"blk.{i}: {nv} value heads on {nk} key heads", path=src.ir.source.path)
    wbeta, walpha = _beta_alpha(src, p, nk, nv)
    net = DeltaNet(
        wqkv=src.weight(p + "attn_qkv.weight"),
        wz=src.weight(p + "attn_gate.weight"),
        wbeta=wbeta,
        walpha=walpha,
        conv=np.ascontiguousarray(conv.reshape(conv.shape[0], -1)),
        dt=src.vec(p + "ssm_dt.bias"),
        a=src.vec(p + "ssm_a"),
        norm=src.vec(p + "ssm_norm.weight"),
        wout=src.weight(p + "ssm_out.weight"),
        n_k=nk,
        n_v=nv,
        d_k=dk,
        d_v=dv,
        grouped=grouped,
    )
    channels = 2 * nk * dk + nv * dv
    if net.wqkv.shape[0] != channels or net.conv.shape[0] != channels:
        raise FormatError(
            f"blk.{i}: the linear attention's heads ({nk} key, {nv} value of {dk}/{dv}) do "
            f"not match attn_qkv ({net.wqkv.shape[0]} rows) and ssm_conv1d "
            f"({net.conv.shape[0]} channels); the metadata is wrong",
            path=src.ir.source.path,
        )
    return net


def _sigmoid(x: F32Array) -> F32Array:
    out: F32Array = (1.0 / (1.0 + np.exp(-x))).astype(np.float32)
    return out


def _l2norm(x: F32Array) -> F32Array:  # over the last axis
    out: F32Array = x / np.sqrt((x * x).sum(-1, keepdims=True) + L2_EPS)
    return out


def deltanet(
    be: Backend,
    net: DeltaNet,
    batch: Sequence[SeqChunk],
    slices: list[slice],
    li: int,
    h: F32Array,
    eps: float,
) -> F32Array:
    """Layer ``li`` on the normed activations ``h`` (n, d): each sequence's rows through
    its own state (``chunk.cache.state``); a fresh (n, d) output."""
    n = len(h)
    qkv, z, b, a = be.matmul_many((net.wqkv, net.wz, net.wbeta, net.walpha), h)
    beta = _sigmoid(b)  # (n, n_v)
    decay = np.exp(net.a * np.logaddexp(np.float32(0.0), a + net.dt)).astype(np.float32)
    # each sequence's rows of qkv through its convolution (in place), then every row's heads
    conv_x = [_convolve(be, net, c, sl, li, qkv) for c, sl in zip(batch, slices, strict=True)]
    q, k, v = _heads(net, qkv)
    o = np.empty((n, net.n_v, net.d_v), np.float32)  # (n, n_v, d_v)
    for c, sl, x in zip(batch, slices, conv_x, strict=True):
        state = c.cache.state
        assert state is not None
        s = state.layer(li)["ssm"]  # (n_v, d_k, d_v)

        def step(t0: int, t1: int, sl: slice = sl, s: F32Array = s) -> None:
            r = slice(sl.start + t0, sl.start + t1)
            be.delta_scan(q[r], k[r], v[r], beta[r], decay[r], s, o[r])

        keep = len(c.rows()) > 1  # a draft being verified: checkpoint every token
        state.scan(li, sl.stop - sl.start, keep, x, s, step)
    y = be.rms_norm(o.reshape(n * net.n_v, net.d_v), net.norm, eps).reshape(n, -1)
    y = be.silu_mul(z, y, out=y)  # (n, n_v*d_v)
    return be.matmul(net.wout, y)


def _convolve(
    be: Backend, net: DeltaNet, c: SeqChunk, sl: slice, li: int, qkv: F32Array
) -> F32Array:
    """One sequence's rows ``sl`` of ``qkv`` (n, channels) through its convolution and silu,
    in place, its ``conv`` state advanced; returns the inputs the kernel saw (w-1+m,
    channels)."""
    state = c.cache.state
    assert state is not None, "a recurrent layer needs the sequence's state"
    state.begin(li, c.cache.n)
    st = state.layer(li)
    x = np.concatenate([st["conv"], qkv[sl]])  # (w-1+m, channels)
    qkv[sl] = be.causal_conv1d(x, net.conv, silu=True)
    st["conv"][...] = x[sl.stop - sl.start :]
    return x


def _heads(net: DeltaNet, y: F32Array) -> tuple[F32Array, F32Array, F32Array]:
    """q and k (n, n_v, d_k), each value head's key head, l2-normed (q scaled), and v (n,
    n_v, d_v) from the convolution's output y (n, channels)."""
    n, kd = len(y), net.n_k * net.d_k
    heads = np.arange(net.n_v)
    tile = heads // (net.n_v // net.n_k) if net.grouped else heads % net.n_k
    q = _l2norm(y[:, :kd].reshape(n, net.n_k, net.d_k))[:, tile] / np.float32(np.sqrt(net.d_k))
    k = _l2norm(y[:, kd : 2 * kd].reshape(n, net.n_k, net.d_k))[:, tile]
    v = np.ascontiguousarray(y[:, 2 * kd :].reshape(n, net.n_v, net.d_v))
    return q, k, v
