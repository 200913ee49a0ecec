"""LFM2's short convolution in the resident WebGPU step (:mod:`.webgpu_llama`), the device
side of :mod:`modelc.runtime.arch.shortconv`: the in-projection, ``B * x``, the causal
convolution over each sequence's last ``L - 1`` inputs and this step's, times ``C``, and
the out-projection added into the residual stream, all in the step's one submit
(``shortconv.wgsl``).

The sequences' states stay where the CPU keeps them (each cache's
:class:`~modelc.runtime.seq_state.SeqState`, with its checkpoints for drafts and the
prefix cache): the step writes each sequence's last inputs to the device beside its token
ids, and reads back the layer's ``B * x`` rows, from which :func:`advance_states` moves
each state on exactly as the CPU's layer does (a state is the layer's last inputs, so no
arithmetic of its own).  A state is ``(L - 1) x d`` floats a layer; the rows read back,
``n x d`` a layer a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from modelc.runtime.arch.shortconv import ShortConv
from modelc.runtime.backend import Weight
from modelc.runtime.backends.webgpu_device import Dispatch, Gpu, flat, u32s, vec
from modelc.runtime.model import SeqChunk

if TYPE_CHECKING:
    from modelc.runtime.backends.webgpu_attn import StepRec
    from modelc.runtime.backends.webgpu_llama import WebGpuLlama


class ConvLayer:
    """One short-convolution layer's weights on the device."""

    def __init__(self, gpu: Gpu, net: ShortConv) -> None:
        self.w_in, self.w_out = net.w_in, net.w_out
        self.d, self.width = int(net.conv.shape[0]), int(net.conv.shape[1])
        self.kernel = vec(gpu, np.ascontiguousarray(net.conv, np.float32), "conv_kernel")

    def mats(self) -> list[Weight]:
        return [self.w_in, self.w_out]


def step_inputs(
    batch: Sequence[SeqChunk], slices: list[slice], layers: list[int], keep: int, d: int
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Each row's (sequence, index in it), and every conv layer's states of the step's
    sequences, (layers, sequences, keep, d), as the device reads them."""
    n = slices[-1].stop if slices else 0
    rows = np.zeros((n, 2), np.uint32)
    for s, sl in enumerate(slices):
        rows[sl, 0] = s
        rows[sl, 1] = np.arange(sl.stop - sl.start)
    states = np.zeros((len(layers), len(batch), keep, d), np.float32)
    for i, li in enumerate(layers):
        for s, c in enumerate(batch):
            assert c.cache.state is not None, "a recurrent layer needs the sequence's state"
            states[i, s] = c.cache.state.layer(li)["conv"]
    return rows, states


def record_shortconv(m: WebGpuLlama, s: StepRec, ly: Any, li: int, hin: Any) -> None:
    """Layer ``li``'s short convolution of ``hin`` added into x; its ``B * x`` rows into
    ``sc_bx{li}``, read back after the step (:func:`advance_states`)."""
    conv: ConvLayer = ly.conv
    job, bufs, n, d = s.job, s.bufs, s.n, conv.d
    bcx, y, bx = bufs["sc_bcx"], bufs["sc_y"], bufs[f"sc_bx{li}"]
    m._matmul(job, conv.w_in, hin, n, bcx)
    gx, gy, gxs = flat(n * d)
    params = u32s(n, d, conv.width, gxs)
    pipe = m._pipe("shortconv", "shortconv_bx")
    job.add(Dispatch(pipe, {0: bcx, 1: bx}, params, 2, (gx, gy, 1)))
    states = bufs[f"sc_state{li}"]
    bind = {0: bcx, 1: bx, 3: conv.kernel, 4: states, 5: bufs["sc_rows"], 6: y}
    job.add(Dispatch(m._pipe("shortconv", "shortconv"), bind, params, 2, (gx, gy, 1)))
    job.reads.append((bx[0], n * d * 4))
    m._residual(job, conv.w_out, y, n, bufs["x"], bufs["h"], ly.post[0])


def advance_states(
    batch: Sequence[SeqChunk], slices: list[slice], layers: list[int], bxs: list[bytes], d: int
) -> None:
    """Each sequence's state moved past this step's rows from each conv layer's ``B * x``
    read back (``bxs``, in layer order), as :func:`~modelc.runtime.arch.shortconv.shortconv`
    moves it: the last inputs kept, checkpoints where a draft or a block boundary asks."""
    n = slices[-1].stop if slices else 0
    for li, raw in zip(layers, bxs, strict=True):
        bx = np.frombuffer(raw, np.float32, n * d).reshape(n, d)
        for c, sl in zip(batch, slices, strict=True):
            state = c.cache.state
            assert state is not None
            state.begin(li, c.cache.n)
            st = state.layer(li)
            m = sl.stop - sl.start
            x = np.concatenate([st["conv"], bx[sl]])
            st["conv"][...] = x[m:]
            state.scan(li, m, len(c.rows()) > 1, x, None, lambda t0, t1: None)
