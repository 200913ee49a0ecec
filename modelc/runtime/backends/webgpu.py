"""The WebGPU backend (``--device webgpu``, and ``--device metal`` on Apple GPUs): every
Backend op as a WGSL compute shader (``wgsl/``), run through wgpu on Metal, Vulkan or D3D12.

Weights are uploaded once, in their quantized blocks as stored (keyed by the identity of
their data array, as the CPU backend's caches), and the matrix products dequantize them in
the shader: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K and IQ4_NL.  A
product of up to 8 rows of x (decode; ``MODELC_WEBGPU_GEMV``: that count, 0 never) runs
``gemv.wgsl`` on a GPU (threads along a weight row, reading it coalesced, their parts
summed in workgroup memory), more rows ``matmul.wgsl`` (a thread a weight row and 8 rows
of x), as do all products on a CPU adapter (lavapipe: there a thread a row already reads
its row in order, and workgroup sums cost; the GEMV was 2x slower).
Other weight types fall back to the numpy reference on the host.  A weight over the
adapter's storage-binding limit is split by rows into several buffers.

These ops keep the Backend protocol's numpy-in / numpy-out contract: activations, and
the KV cache that attention reads, cross to the device and back on every call (one submit
per call; a step of SmolLM2 makes ~300).  Dense llama-like decoders skip that: they run
resident (:mod:`~modelc.runtime.backends.webgpu_llama`, one submit a step) on these
shaders; the other families run op by op here.  Numerics: every product and
reduction is float32 with the activations kept in float32 (as the CPU backend's
``MODELC_MATMUL=exact``), summed in another order than the CPU's kernels, so results
agree to float32 rounding, not bit for bit.
"""

from __future__ import annotations

import functools
import math
import os
import re
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelc.errors import ConfigError, UnsupportedError, UsageError
from modelc.formats.ir import DType, row_bytes
from modelc.runtime.backend import F32Array, Weight
from modelc.runtime.backends.webgpu_device import Dispatch, Gpu, Job, grid, shader_source
from modelc.runtime.backends.webgpu_ops import ActivationOps

DEQ: dict[DType, str] = {
    DType.F32: "deq4_f32",
    DType.F16: "deq4_f16",
    DType.BF16: "deq4_bf16",
    DType.Q4_0: "deq4_q4_0",
    DType.Q4_1: "deq4_q4_1",
    DType.Q5_0: "deq4_q5_0",
    DType.Q5_1: "deq4_q5_1",
    DType.Q8_0: "deq4_q8_0",
    DType.Q4_K: "deq4_q4_k",
    DType.Q5_K: "deq4_q5_k",
    DType.Q6_K: "deq4_q6_k",
    DType.IQ4_NL: "deq4_iq4_nl",
    DType.MXFP4: "deq4_mxfp4",
}

NX = 8  # the most rows of x per matmul thread (matmul.wgsl): 1, 2, 4 or 8 by batch size
GEMV_ROWS = 8  # products of at most this many rows of x take gemv.wgsl (MODELC_WEBGPU_GEMV)
GEMV_WG = 64  # gemv.wgsl's threads a workgroup (a weight row, or a few short ones)
_FLOATS = (DType.F32, DType.F16, DType.BF16)
_CACHE_MAX = 4096


def _f32(a: np.ndarray[Any, Any]) -> F32Array:
    return np.ascontiguousarray(a, dtype=np.float32)


def _u(*vals: int) -> bytes:
    return struct.pack(f"<{len(vals)}I", *vals)


def _put(value: F32Array, out: F32Array | None) -> F32Array:
    if out is None:
        return value
    out[...] = value
    return out


@functools.cache
def matmul_source(fn: str, nx: int) -> str:
    """matmul.wgsl for a weight type (its deq4_* function of quants.wgsl) with ``nx`` rows
    of x per thread, the tile's accumulators written out as scalars (registers everywhere)."""
    body = shader_source("matmul").replace("DEQ4(", f"{fn}(")
    body = body.replace("const NX: u32 = 8u;", f"const NX: u32 = {nx}u;")
    decl = "".join(f"var a{r} = 0.0;\n    " for r in range(nx))
    step = "".join(f"a{r} += dot(w, xs[xq[{r}] + k]);\n        " for r in range(nx))
    store = "".join(  # acc: added to what out holds (a residual), as x + (W h) on the CPU
        f"if (x0 + {r}u < p.n) {{ let o{r} = (x0 + {r}u) * p.out_stride + p.row0 + row; "
        f"outs[o{r}] = select(a{r}, outs[o{r}] + a{r}, p.acc != 0u); }}\n    "
        for r in range(nx)
    )
    body = body.replace("ACC_DECL", decl).replace("ACC_STEP", step).replace("ACC_STORE", store)
    return body + "\n" + shader_source("half", "quants")


@functools.cache
def gemv_source(fn: str, nx: int, qpt: int, tpr: int) -> str:
    """gemv.wgsl for a weight type (its deq4_* function), ``nx`` rows of x, ``qpt`` quads a
    thread's chunk and ``tpr`` threads a weight row, the accumulators written as scalars."""
    body = shader_source("gemv").replace("DEQ4(", f"{fn}(")
    for name, v in (("NX", nx), ("WG", GEMV_WG), ("QPT", qpt), ("TPR", tpr)):
        body = re.sub(rf"const {name}: u32 = \d+u;", f"const {name}: u32 = {v}u;", body)
    decl = "".join(f"var a{r} = 0.0;\n    " for r in range(nx))
    step = "".join(f"a{r} += dot(w, xs[xq[{r}] + k]);\n            " for r in range(nx))
    part = "".join(f"part[{r}u * WG + lid] = a{r};\n    " for r in range(nx))
    body = body.replace("ACC_DECL", decl).replace("ACC_STEP", step).replace("ACC_PART", part)
    return body + "\n" + shader_source("half", "quants")


def gemv_rows(cpu: bool = False) -> int:
    """The most rows of x a product takes the GEMV shader for: ``MODELC_WEBGPU_GEMV`` (0:
    never, the per-row matmul shader always, for comparison), by default GEMV_ROWS on a
    GPU and 0 on a ``cpu`` adapter."""
    env = os.environ.get("MODELC_WEBGPU_GEMV", "").strip()
    if not env:
        return 0 if cpu else GEMV_ROWS
    try:
        return max(0, int(env))
    except ValueError as e:
        raise ConfigError(f"MODELC_WEBGPU_GEMV={env!r} is not a whole number (0: off)") from e


class WebGPUBackend(ActivationOps):
    """Backend ops on a WebGPU device.  ``require``: the adapter's backend must be this one
    (``"Metal"`` for ``--device metal``); default any of Metal, Vulkan, D3D12."""

    name = "webgpu"

    def __init__(self, require: str | None = None) -> None:
        self.gpu = Gpu(require)
        self.device_name = self.gpu.describe()
        super().__init__()  # the numpy reference: what has no shader
        # id(weight data) -> (that data, [(buffer, first row, rows)])
        self._weights: dict[int, tuple[np.ndarray[Any, Any], list[tuple[Any, int, int]]]] = {}
        # products of up to this many rows of x: gemv.wgsl
        self.gemv_rows = gemv_rows(str(self.gpu.adapter.info["adapter_type"]) == "CPU")

    # --- weights ------------------------------------------------------------------------

    def _chunks(self, w: Weight) -> list[tuple[Any, int, int]]:
        """The weight's device buffers (uploaded on first use): (buffer, row0, rows)."""
        hit = self._weights.get(id(w.data))
        if hit is not None and hit[0] is w.data:
            return hit[1]
        rows, cols = w.shape
        rb = row_bytes(w.dtype, cols)
        raw = np.ascontiguousarray(w.data).view(np.uint8).reshape(rows, rb)
        limit = min(self.gpu.max_binding, self.gpu.max_buffer) - 4
        per = max(1, limit // rb)
        if rb > limit:
            raise UnsupportedError(
                f"a {w.dtype.name} weight row of {rb} bytes is over {self.device_name}'s "
                f"{limit} byte storage-binding limit; use --device cpu"
            )
        self._check_memory(raw.nbytes)
        chunks = [
            (
                self.gpu.weight_buffer(raw[r0 : r0 + per], f"w{w.dtype.name}"),
                r0,
                min(per, rows - r0),
            )
            for r0 in range(0, rows, per)
        ]
        if len(self._weights) >= _CACHE_MAX:
            self._weights.clear()
        self._weights[id(w.data)] = (w.data, chunks)
        return chunks

    def _check_memory(self, nbytes: int) -> None:
        """Refuse a weight, naming the sizes, past the device's budget (``memory_budget``) or,
        on unified memory (Apple, integrated, software adapters: the copy comes out of host
        RAM), where it would leave under 512 MiB free.  Weights are placed on first use, which
        the engine makes at load (one token through every layer), not mid-request."""
        placed = self.gpu.uploaded >> 20
        budget = self.gpu.budget
        if budget is not None and self.gpu.uploaded + nbytes > budget:
            raise UsageError(
                f"WebGPU: the weights do not fit the {budget >> 20} MiB budget "
                f"({self.gpu.budget_source}): {placed} MiB placed, the next needs "
                f"{max(1, nbytes >> 20)} MiB; use --device cpu or a smaller model"
            )
        if not self.gpu.unified_memory:
            return
        import psutil

        free = int(psutil.virtual_memory().available)
        if nbytes + (512 << 20) > free:
            raise UsageError(
                f"WebGPU: {nbytes >> 20} MiB more of weights would leave under 512 MiB of the "
                f"{free >> 20} MiB free ({placed} MiB placed so far); "
                "use --device cpu or a smaller model"
            )

    def _module(self, dtype: DType, nx: int) -> tuple[str, str]:
        fn = DEQ[dtype]
        return f"matmul_{fn}_{nx}", matmul_source(fn, nx)

    # --- matrix products ----------------------------------------------------------------

    def matmul_dispatches(
        self,
        w: Weight,
        x: tuple[Any, ...],
        n: int,
        out: tuple[Any, ...],
        acc: bool = False,
        stride: int = 0,
        col0: int = 0,
    ) -> list[Dispatch]:
        """The dispatches of ``out (+)= x @ dequant(w).T`` for ``n`` rows of x (bound
        buffers, x's rows padded to whole quads): ``acc`` adds into out (a residual);
        ``stride`` (default the weight's rows) and ``col0`` are out's row width and the first
        column written.  Up to ``gemv_rows`` rows of x: gemv.wgsl (a workgroup a weight row,
        its threads along the row); more: matmul.wgsl (a thread a weight row and NX rows)."""
        rows, cols = w.shape
        rb = row_bytes(w.dtype, cols)
        nx = min(NX, 1 << (n - 1).bit_length())
        fn = DEQ[w.dtype]
        gemv = n <= self.gemv_rows
        rpw = 1  # weight rows a workgroup
        if gemv:
            qpt = 1 if w.dtype in _FLOATS else 8  # a thread's chunk: a quad, or a block's 8
            # threads a row: a power of two up to GEMV_WG, none without a chunk (short rows:
            # several rows a workgroup)
            tpr = min(GEMV_WG, 1 << (max(1, -(-cols // (4 * qpt))).bit_length() - 1))
            rpw = GEMV_WG // tpr
            src = gemv_source(fn, nx, qpt, tpr)
            pipe = self.gpu.pipeline(f"gemv_{fn}_{nx}_{tpr}", "gemv", src)
        else:
            key, src = self._module(w.dtype, nx)
            pipe = self.gpu.pipeline(key, "matmul", src)
        res = []
        for buf, r0, nr in self._chunks(w):
            gx, gy = grid(math.ceil(nr / rpw) if gemv else math.ceil(nr / 64))
            gxs = gx if gemv else gx * 64  # workgroups / threads along x
            params = _u(nr, cols, n, rb, stride or rows, col0 + r0, gxs, int(acc))
            bind = {0: (buf, buf.size), 1: x, 2: out}
            res.append(Dispatch(pipe, bind, params, 3, (gx, gy, math.ceil(n / nx))))
        return res

    def matmul(self, w: Weight, x: F32Array, out: F32Array | None = None) -> F32Array:
        return self.matmul_many([w], x, [out])[0]

    def matmul_many(
        self, ws: Sequence[Weight], x: F32Array, outs: Sequence[F32Array | None] | None = None
    ) -> list[F32Array]:
        outs = list(outs) if outs is not None else [None] * len(ws)
        if len(outs) != len(ws):
            raise ValueError(f"matmul_many: {len(ws)} weights but {len(outs)} outputs")
        x = _f32(x)
        n = x.shape[0]
        res: list[F32Array | None] = [None] * len(ws)
        gpu_ws = [i for i, w in enumerate(ws) if w.dtype in DEQ and n > 0]
        for i, w in enumerate(ws):
            if i not in gpu_ws:
                res[i] = self._fallback.matmul(w, x, outs[i])
        if gpu_ws:
            with self.gpu.lock:
                job = Job()
                cols4 = -(-x.shape[1] // 4) * 4  # x rows padded to whole vec4s
                xp = x if cols4 == x.shape[1] else np.pad(x, ((0, 0), (0, cols4 - x.shape[1])))
                xb = self.gpu.put("mm_x", xp)
                for slot, i in enumerate(gpu_ws):
                    w = ws[i]
                    rows, cols = w.shape
                    if x.shape[1] != cols:
                        raise ValueError(f"matmul: x has {x.shape[1]} columns, weight {w.shape}")
                    ob = self.gpu.scratch(f"mm_out{slot}", n * rows * 4)
                    for d in self.matmul_dispatches(w, xb, n, ob):
                        job.add(d)
                    job.reads.append((ob[0], n * rows * 4))
                data = self.gpu.run(job)
            for k, i in enumerate(gpu_ws):
                value = np.frombuffer(data[k], np.float32).reshape(n, ws[i].shape[0])
                res[i] = _put(value.copy(), outs[i])
        return [r for r in res if r is not None]

    def get_rows(
        self, w: Weight, ids: np.ndarray[Any, Any], out: F32Array | None = None
    ) -> F32Array:
        idx = np.asarray(ids, dtype=np.int64).reshape(-1)
        rows, cols = w.shape
        if w.dtype not in DEQ or idx.size == 0:
            return self._fallback.get_rows(w, ids, out)
        if idx.min() < -rows or idx.max() >= rows:
            raise IndexError(f"get_rows: an id is out of range for {rows} rows")
        idx = np.where(idx < 0, idx + rows, idx)
        with self.gpu.lock:
            key, src = self._module(w.dtype, 1)
            pipe = self.gpu.pipeline(key, "get_rows", src)
            ib = self.gpu.put("gr_ids", idx.astype(np.uint32))
            ob = self.gpu.scratch("gr_out", idx.size * cols * 4)
            gy, gz = grid(idx.size)
            job = Job()
            for buf, r0, nr in self._chunks(w):
                job.add(
                    Dispatch(
                        pipe,
                        {0: (buf, buf.size), 2: ob, 4: ib},
                        _u(nr, cols, idx.size, row_bytes(w.dtype, cols), 0, r0, 0, 0),
                        3,
                        (math.ceil(math.ceil(cols / 4) / 64), gy, gz),
                    )
                )
            job.reads.append((ob[0], idx.size * cols * 4))
            (data,) = self.gpu.run(job)
        return _put(np.frombuffer(data, np.float32).reshape(idx.size, cols).copy(), out)
