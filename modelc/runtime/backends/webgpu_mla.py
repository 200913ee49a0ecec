"""Multi-head latent attention in the resident WebGPU step (DeepSeek V2/V3,
:mod:`~modelc.runtime.arch.mla` as llama.cpp runs it): the queries (through their low-rank
``wq_a`` and norm where the model has one), the cached row ``[norm(latent), rope(k_pe)]``
(one KV head of ``rank + rope``), the queries with ``K_b`` absorbed and their RoPE tail,
then attention over the cached rows (the model's own dispatches: values are the same rows,
stored twice so the cache is an ordinary K/V one for the prefix cache and context shifts),
and each head's values out of its attention-weighted latent through ``V_b``
(``mla.wgsl``)."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from modelc.formats.ir import LatentAttention
from modelc.runtime.arch.mla import LatentBlock
from modelc.runtime.backend import Weight
from modelc.runtime.backends.webgpu import WebGPUBackend
from modelc.runtime.backends.webgpu_device import Dispatch, Gpu, Job, grid, shader_source, vec

if TYPE_CHECKING:
    from modelc.runtime.backends.webgpu_llama import WebGpuLlama


class MlaLayer:
    """A layer's latent-attention weights on the device, and the dispatches around its
    attention."""

    def __init__(self, gpu: Gpu, b: LatentBlock, mla: LatentAttention, eps: float) -> None:
        self.wq, self.wq_a, self.wkv_a = b.wq, b.wq_a, b.wkv_a
        self.q_a_norm = None if b.q_a_norm is None else vec(gpu, b.q_a_norm, "q_a_norm")
        self.kv_a_norm = vec(gpu, b.kv_a_norm, "kv_a_norm")
        self.k_b, self.v_b = vec(gpu, b.k_b, "k_b"), vec(gpu, b.v_b, "v_b")
        self.nh = int(b.k_b.shape[0])
        self.rank, self.nope, self.rope = mla.kv_rank, mla.nope_dim, mla.rope_dim
        self.v_dim, self.q_rank, self.eps = mla.v_dim, mla.q_rank, eps

    @property
    def width(self) -> int:
        """The cached row: the latent and the keys' RoPE part."""
        return self.rank + self.rope

    def mats(self) -> list[Weight]:
        return [self.wq, self.wkv_a, *([self.wq_a] if self.wq_a is not None else [])]

    def sizes(self, n: int) -> dict[str, int]:
        """The step's buffers for ``n`` rows (bytes), by name."""
        qh = self.nope + self.rope
        return {
            "mla_qa": n * max(self.q_rank, 1) * 4,
            "mla_q": n * self.nh * qh * 4,
            "mla_kv": n * self.width * 4,
            "mla_qq": n * self.nh * self.width * 4,
            "mla_o": n * self.nh * self.width * 4,
            "mla_out": n * self.nh * self.v_dim * 4,
        }

    def project(
        self,
        m: WebGpuLlama,
        job: Job,
        bufs: dict[str, tuple[Any, ...]],
        h: tuple[Any, ...],
        n: int,
        rotate: Callable[[tuple[Any, ...], int], None],
    ) -> None:
        """The queries ``mla_qq`` (n, heads, rank + rope) and the cached rows ``mla_kv``
        (n, rank + rope) of ``h``, through the model ``m``'s products and norms;
        ``rotate(buf, heads)``: RoPE on the last ``rope`` values of each head's row."""
        be = m.be
        q, kv, qq = bufs["mla_q"], bufs["mla_kv"], bufs["mla_qq"]
        if self.wq_a is not None and self.q_a_norm is not None:
            qa = bufs["mla_qa"]
            m._matmul(job, self.wq_a, h, n, qa)
            m._norm(job, None, self.q_a_norm, n, qa, width=self.q_rank)
            m._matmul(job, self.wq, qa, n, q)
        else:
            m._matmul(job, self.wq, h, n, q)
        m._matmul(job, self.wkv_a, h, n, kv)
        gx, gy = grid(n)
        job.add(self._dispatch(be, "mla_kv_norm", {2: kv, 1: self.kv_a_norm}, n, gx, (gx, gy, 1)))
        rotate(kv, 1)
        self._flat(be, job, "mla_absorb", {0: q, 1: self.k_b, 2: qq}, n, n * self.nh * self.width)
        rotate(qq, self.nh)

    def values(self, m: WebGpuLlama, job: Job, bufs: dict[str, tuple[Any, ...]], n: int) -> None:
        """``mla_out`` (n, heads * v_dim): each head's values out of ``mla_o``."""
        o, out = bufs["mla_o"], bufs["mla_out"]
        self._flat(
            m.be, job, "mla_values", {0: o, 1: self.v_b, 2: out}, n, n * self.nh * self.v_dim
        )

    def _flat(
        self, be: WebGPUBackend, job: Job, entry: str, bind: dict[int, Any], n: int, threads: int
    ) -> None:
        gx, gy = grid(math.ceil(threads / 64))
        job.add(self._dispatch(be, entry, bind, n, gx * 64, (gx, gy, 1)))

    def _dispatch(
        self,
        be: WebGPUBackend,
        entry: str,
        bind: dict[int, Any],
        n: int,
        gxs: int,
        groups: tuple[int, int, int],
    ) -> Dispatch:
        params = struct.pack(
            "<7If", n, self.nh, self.rank, self.nope, self.rope, self.v_dim, gxs, self.eps
        )
        pipe = be.gpu.pipeline("mla", entry, shader_source("mla"))
        return Dispatch(pipe, bind, params, 3, groups)
