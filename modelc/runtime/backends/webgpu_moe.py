"""A mixture of experts in the resident WebGPU step, on the device with the rest of it:
the router's product, each token's experts and weights (``moe.wgsl``'s ``moe_route``:
softmax top-k renormalised as Mixtral's and Qwen3-MoE's, which is gpt-oss's softmax of the
k logits once its router's bias is added; or GLM-4.5's sigmoid scores with a bias for the
choice, scaled; or Llama 4's sigmoid scores scaling each expert's input), the chosen
experts' gate, up and down products of every (token, slot) pair (``moe_gemv.wgsl``: each
pair's rows of the stacked experts, read as stored, MXFP4 included), gpt-oss's expert
biases and clamped SwiGLU, the weighted sum added into the residual stream
(``moe_combine``, in expert-id order as :func:`~modelc.runtime.arch.moe.moe_ffn`), and the
shared experts' FFN beside.  Expert groups (DeepSeek V3) and a gated shared expert
(Qwen3.5-MoE) are refused (:func:`refuse_routing`).

A step of few pairs (decode) reads each pair's expert's rows (``moe_gemv``); one of more
pairs than half the experts (a prompt's chunk, many streams) first groups its pairs by
expert (``moe_group.wgsl``) and reads each expert's rows once, over its pairs
(``moe_gemv_grouped``: each pair's sums as ``moe_gemv``'s, bit for bit)."""

from __future__ import annotations

import math
import os
import re
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

from modelc.errors import UnsupportedError
from modelc.formats.ir import row_bytes
from modelc.runtime.arch.moe import Experts
from modelc.runtime.backend import Weight
from modelc.runtime.backends.webgpu import _FLOATS, DEQ, GEMV_WG, WebGPUBackend
from modelc.runtime.backends.webgpu_device import Dispatch, Gpu, Job, grid, shader_source, vec

if TYPE_CHECKING:
    from modelc.runtime.backends.webgpu_llama import WebGpuLlama


def stacked(ws: list[Weight]) -> Weight:
    """The experts' matrices as one (n * rows, cols) weight: the stack they are row views
    of where they are (no copy), else joined."""
    rows, cols = ws[0].shape
    base = ws[0].data.base
    if (
        isinstance(base, np.ndarray)
        and base.ndim == 3
        and len(base) == len(ws)
        and base.shape[1] == rows  # not halves of bigger rows (gemma4's fused gate_up)
        and base.flags.c_contiguous
        and all(np.shares_memory(w.data, base[i]) for i, w in enumerate(ws))
    ):
        data = base.reshape(len(ws) * rows, -1)
    else:
        data = np.concatenate([w.data for w in ws])
    return Weight(ws[0].dtype, (len(ws) * rows, cols), data)


def refuse_routing(e: Experts) -> None:
    """UnsupportedError unless ``e`` routes as this runs: softmax top-k renormalised
    (Mixtral, Qwen3-MoE), gpt-oss's, or GLM's (sigmoid scores, a bias for the choice,
    scaled, shared experts); not in groups (DeepSeek V3) nor a gated shared expert."""
    if e.routing is not None and e.routing.n_group > 32:
        raise UnsupportedError("the resident WebGPU decoder routes in at most 32 expert groups")
    if e.shared_gate is not None:
        raise UnsupportedError("the resident WebGPU decoder runs no gated shared expert")


MAX_GROUPED_EXPERTS = 512  # moe_group.wgsl's counts


def grouped(pairs: int, n_expert: int) -> bool:
    """Whether a step's ``pairs`` are grouped by expert before the experts' products: more
    of them than half the experts (``MODELC_WEBGPU_MOE_GROUP``: ``1`` always, ``0``
    never)."""
    forced = os.environ.get("MODELC_WEBGPU_MOE_GROUP")
    if n_expert > MAX_GROUPED_EXPERTS or forced == "0":
        return False
    return forced == "1" or 2 * pairs > n_expert


def _moe_gemv_source(fn: str, qpt: int, tpr: int) -> str:
    body = shader_source("moe_gemv").replace("DEQ4(", f"{fn}(")
    for name, v in (("WG", GEMV_WG), ("QPT", qpt), ("TPR", tpr)):
        body = re.sub(rf"const {name}: u32 = \d+u;", f"const {name}: u32 = {v}u;", body)
    return body + "\n" + shader_source("half", "quants")


class MoeLayer:
    """A layer's experts on the device (stacked), and the dispatches of their FFN."""

    def __init__(self, gpu: Gpu, e: Experts, scaled_input: bool = False) -> None:
        refuse_routing(e)
        # llama 4: sigmoid scores of the top k scale each expert's input, not its output
        self.scaled_input = scaled_input
        self.router = e.router
        self.gate, self.up, self.down = stacked(e.gate), stacked(e.up), stacked(e.down)
        self.n_expert, self.k = int(e.router.shape[0]), int(e.n_used)
        self.ff, self.d = int(e.gate[0].shape[0]), int(e.down[0].shape[0])
        # moe.wgsl's moe_route: its flags (1 sigmoid, 2 renormalised), the weights' scale,
        # the scores' bias for the choice (DeepSeek's and GLM's exp_probs_b; else zeros)
        r = e.routing
        self.flags = 2 if r is None else int(r.gating == "sigmoid") | (2 * int(r.norm))
        if scaled_input:
            self.flags = 1
        scale = np.float32(1.0 if r is None else r.scale)
        self.scale_bits = int(scale.view(np.uint32))
        bias = e.bias if e.bias is not None else np.zeros(self.n_expert, np.float32)
        self.ebias = vec(gpu, bias, "exp_probs_b")
        # DeepSeek V3: the experts in n_group groups, a token's from its best n_group_used
        self.groups = (r.n_group, r.n_group_used) if r is not None and r.n_group > 1 else (0, 0)
        self.shared = e.shared  # every token's experts beside (gate, up, down)
        self.sff = 0 if e.shared is None else int(e.shared[0].shape[0])
        # gpt-oss: the router's and each expert's biases, the SwiGLU's clamp (moe_oai)
        self.oai = None
        if e.oai is not None:
            b = e.oai
            names = ("router", "gate", "up", "down")
            self.oai = {n: vec(gpu, getattr(b, n), f"oai_{n}") for n in names}
            self.limit = float(b.limit)

    def mats(self) -> list[Weight]:
        return [self.router, self.gate, self.up, self.down, *(self.shared or ())]

    @staticmethod
    def sizes(layers: list[MoeLayer], n: int) -> dict[str, int]:
        """The step's MoE buffers for ``n`` rows (bytes), by name."""
        e = max(m.n_expert for m in layers)
        pairs = n * max(m.k for m in layers)
        ff, d = max(m.ff for m in layers), max(m.d for m in layers)
        wide = max(pairs * ff, n * max(m.sff for m in layers))  # the shared experts' too
        return {
            "moe_logits": n * e * 4,
            "moe_ids": pairs * 4,
            "moe_wts": pairs * 4,
            "moe_gu": wide * 2 * 4,
            "moe_act": wide * 4,
            "moe_out": pairs * d * 4,
            "moe_in": pairs * d * 4 if any(m.scaled_input for m in layers) else 4,
            "moe_offs": (e + 1) * 4,
            "moe_plist": pairs * 4,
        }

    def record(
        self,
        m: WebGpuLlama,
        job: Job,
        bufs: dict[str, tuple[Any, ...]],
        h: tuple[Any, ...],
        x: tuple[Any, ...],
        n: int,
        entry: str,
        *,
        router_in: tuple[Any, ...] | None = None,
        wscale: Any = None,
        written: bool = False,
    ) -> None:
        """``x += the experts' FFN of h`` for n rows, through the model ``m``'s products
        and elementwise dispatches; ``entry``: its activation (silu_mul, gelu_mul).  Gemma
        4's mixture beside the FFN: the router reads ``router_in`` (default h), each pair's
        weight times its expert's ``wscale``, and x is ``written``, not added to."""
        be, elem = m.be, m._elem
        logits, ids, wts = bufs["moe_logits"], bufs["moe_ids"], bufs["moe_wts"]
        gu, act, out = bufs["moe_gu"], bufs["moe_act"], bufs["moe_out"]
        m._matmul(job, self.router, h if router_in is None else router_in, n, logits)
        oai, e, k, ff, d = self.oai, self.n_expert, self.k, self.ff, self.d
        if oai is not None:
            elem(job, "add_bias", n * e, {1: oai["router"], 2: logits}, e)
        bind = {0: logits, 1: ids, 2: wts, 5: self.ebias}
        n_group, used = self.groups
        self._moe(
            be, job, "moe_route", n, bind, n,
            d=self.scale_bits, flags=self.flags, col0=n_group, stride=used,
        )  # fmt: skip
        pairs = n * k
        if wscale is not None:
            self._moe(be, job, "moe_wscale", pairs, {0: wscale, 1: ids, 2: wts}, pairs, d=0)
        group = None  # many pairs: grouped by expert, each expert's rows read once
        if grouped(pairs, e):
            group = (bufs["moe_offs"], bufs["moe_plist"])
            pipe = be.gpu.pipeline("moe_group", "moe_group", shader_source("moe_group"))
            bind = {0: ids, 1: group[0], 2: group[1]}
            job.add(Dispatch(pipe, bind, struct.pack("<4I", pairs, e, 0, 0), 3, (1, 1, 1)))
        xin, div = h, k  # each pair reads its token's row
        if self.scaled_input:  # or its own, the token's row times its weight
            xin, div = bufs["moe_in"], 1
            self._moe(be, job, "moe_scale_in", pairs * d, {0: h, 2: wts, 4: xin}, pairs, d=d)
        self._experts(be, job, self.gate, xin, pairs, div, gu, 2 * ff, 0, ids, group)
        self._experts(be, job, self.up, xin, pairs, div, gu, 2 * ff, ff, ids, group)
        if oai is not None:  # each pair's expert's biases, then the clamped SwiGLU
            for name, col0 in (("gate", 0), ("up", ff)):
                bind = {0: oai[name], 1: ids, 4: gu}
                self._moe(
                    be, job, "moe_bias", pairs * ff, bind, pairs, d=ff, col0=col0, stride=2 * ff
                )
            elem(job, "swiglu_oai", pairs * ff, {0: gu, 1: gu, 2: act}, ff, self.limit)
        else:
            elem(job, entry, pairs * ff, {0: gu, 1: gu, 2: act}, ff)
        self._experts(be, job, self.down, act, pairs, 1, out, d, 0, ids, group)
        if oai is not None:
            bind = {0: oai["down"], 1: ids, 4: out}
            self._moe(be, job, "moe_bias", pairs * d, bind, pairs, d=d, stride=d)
        bind = {0: out, 2: wts, 4: x}
        flags = int(self.scaled_input) | 2 * int(written)
        self._moe(be, job, "moe_combine", n * d, bind, n, d=d, flags=flags)
        if self.shared is not None:  # the shared experts' FFN, added into x too
            sgate, sup, sdown = self.shared
            sff = self.sff
            for w, col0 in ((sgate, 0), (sup, sff)):
                m._matmul(job, w, h, n, gu, stride=2 * sff, col0=col0)
            elem(job, entry, n * sff, {0: gu, 1: gu, 2: act}, sff)
            m._matmul(job, sdown, act, n, x, acc=True)

    def _moe(
        self,
        be: WebGPUBackend,
        job: Job,
        entry: str,
        threads: int,
        bind: dict[int, tuple[Any, ...]],
        n: int,
        *,
        d: int,
        flags: int = 0,
        col0: int = 0,
        stride: int = 0,
    ) -> None:
        """A dispatch of moe.wgsl's ``entry`` over ``threads``, with its uniforms (moe.wgsl's
        Params, by their names there: ``n`` tokens or pairs, ``d`` a width or the route's
        scale bits, ``flags``, ``col0``, ``stride``: moe_bias' row stride, moe_route's groups
        a token uses)."""
        gx, gy = grid(math.ceil(threads / 64))
        params = struct.pack("<8I", n, self.n_expert, self.k, d, gx * 64, flags, col0, stride)
        pipe = be.gpu.pipeline("moe", entry, shader_source("moe"))
        job.add(Dispatch(pipe, bind, params, 3, (gx, gy, 1)))

    def _experts(
        self,
        be: WebGPUBackend,
        job: Job,
        w: Weight,
        x: tuple[Any, ...],
        pairs: int,
        x_div: int,
        out: tuple[Any, ...],
        stride: int,
        col0: int,
        ids: tuple[Any, ...],
        group: tuple[Any, Any] | None = None,
    ) -> None:
        """Pair p's expert's rows of the stack ``w`` times x row p / ``x_div``, into out's
        row p from column ``col0`` (rows ``stride`` wide): a dispatch a weight buffer, a
        workgroup's rows for one pair, or (``group``: moe_group's offsets and pair list)
        for every pair of one expert."""
        rows, cols = w.shape
        per_expert = rows // self.n_expert
        qpt = 1 if w.dtype in _FLOATS else 8  # a thread's chunk, as gemv.wgsl's
        tpr = min(GEMV_WG, 1 << (max(1, -(-cols // (4 * qpt))).bit_length() - 1))
        fn = DEQ[w.dtype]
        src = _moe_gemv_source(fn, qpt, tpr)
        entry = "moe_gemv" if group is None else "moe_gemv_grouped"
        pipe = be.gpu.pipeline(f"moe_gemv_{fn}_{tpr}", entry, src)
        rb = row_bytes(w.dtype, cols)
        gx, gy = grid(math.ceil(per_expert / (GEMV_WG // tpr)))
        for buf, r0, nr in be._chunks(w):
            params = struct.pack(
                "<12I", nr, cols, pairs, rb, stride, col0, gx, r0, per_expert, x_div, 0, 0
            )
            bind = {0: (buf, buf.size), 1: x, 2: out}
            if group is None:
                bind[4] = ids
            else:
                bind[5], bind[6] = group
            z = pairs if group is None else self.n_expert
            job.add(Dispatch(pipe, bind, params, 3, (gx, gy, z)))
