"""Partial offload (``--n-gpu-layers N|auto|all``, llama.cpp's ``-ngl``): the first layers
on the GPU (:class:`~modelc.runtime.backends.cuda_llama.CudaLlama`), the rest on the CPU
kernels, one step flowing through both (:class:`~modelc.runtime.split.SplitLM`), so a
model larger than the GPU still runs.

``auto`` (as llama.cpp's ``--fit``) puts as many layers on the GPU as its free memory
holds beside their KV caches (every sequence at its full context), the embedding table and
scratch: :func:`plan_gpu_layers`, a pure function of those sizes.  The GPU part takes the
embedding (the step starts there) and the output norm and head, so a step runs the GPU's
layers, the CPU's, then the head on the GPU (a tied head is the embedding table already
there: no more memory); ``MODELC_OFFLOAD_HEAD=last`` keeps the head with the last layer
on the CPU, as llama.cpp's ``-ngl`` below every layer does (:func:`head_on_gpu`).
:func:`build_cuda` builds the whole model on the GPU (its checks, :func:`cuda_plan`,
shared with :func:`build_offload`).

What the fused forward does not run (:func:`fused_lacks`: a part of the description
outside :data:`~modelc.runtime.backends.cuda_family.CUDA_RUNS`, a head size or width its
kernels are not built for, a model that is not the one decoder) runs op by op instead, as
llama.cpp's scheduler hands a GPU backend's missing ops to the CPU: the model's own
forward on :class:`~modelc.runtime.backends.cuda.CudaBackend`, whose matrix products,
rows, norms and attention run on the GPU and the rest on the numpy reference
(:func:`build_op_by_op`; :func:`op_by_op_note` is the line saying so).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from modelc.errors import UsageError
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import build
from modelc.runtime.arch.decoder import Decoder, DecoderBlock
from modelc.runtime.arch.decoder_spec import lacks
from modelc.runtime.arch.longrope import short_factors_ctx
from modelc.runtime.backend import Backend
from modelc.runtime.backends.cuda import head_runs, require_cuda
from modelc.runtime.backends.cuda_backend import CudaBackend
from modelc.runtime.backends.cuda_family import CUDA_RUNS, cuda_host
from modelc.runtime.backends.cuda_kv import device_prefix
from modelc.runtime.backends.cuda_llama import CudaLlama
from modelc.runtime.backends.numpy_ref import NumpyBackend
from modelc.runtime.kv_cache import KVMode
from modelc.runtime.model import CausalLM
from modelc.runtime.split import SplitLM

log = logging.getLogger("modelc")
SCRATCH = 256 << 20  # the GPU's activations, cuBLAS workspace and allocator slack (check_fits')


def head_on_gpu() -> bool:
    """Whether a split's GPU part holds the output head: yes, unless
    ``MODELC_OFFLOAD_HEAD=last`` (llama.cpp's placement, for side-by-side figures)."""
    where = os.environ.get("MODELC_OFFLOAD_HEAD", "first")
    if where not in ("first", "last"):
        raise UsageError(f"MODELC_OFFLOAD_HEAD={where}: use first (the default) or last")
    return where == "first"


def plan_gpu_layers(
    layer_bytes: Sequence[int],
    kv_per_layer: int,
    embd: int,
    head: int,
    free: int,
    head_first: bool = True,
) -> int:
    """How many first layers ``auto`` puts on the GPU: the most whose weights
    (``layer_bytes``, in order) and KV caches (``kv_per_layer`` each: every sequence at
    its full context) fit in ``free`` bytes beside the embedding table, the output head
    (``head`` bytes: 0 when it is the embedding table) and :data:`SCRATCH`.  The head is
    the GPU part's with any layer there (``head_first``), else (``MODELC_OFFLOAD_HEAD=last``)
    only with every layer: then every layer only if it fits too.  0 when not even the
    first layer fits."""
    room = free - embd - SCRATCH - (head if head_first else 0)
    k, used = 0, 0
    for w in layer_bytes:
        if used + w + kv_per_layer > room:
            break
        used, k = used + w + kv_per_layer, k + 1
    if not head_first and k == len(layer_bytes) and used + head > room:
        k -= 1
    return max(k, 0)


def _bytes(b: DecoderBlock) -> int:
    mats = [b.wq, b.wk, b.wv, b.wo, b.w_gate, b.w_up, b.w_down]
    if b.experts is not None:
        e = b.experts
        mats += [e.router, *e.gate, *e.up, *e.down]
    return sum(int(np.asarray(w.data).nbytes) for w in mats if w is not None)


def build_offload(
    ir: ModelIR,
    n_gpu_layers: int | str,
    cpu: Callable[[], Backend],
    *,
    kv_mode: str,
    max_context: int | None,
    max_concurrent: int,
    kv_budget_bytes: int | None,
    host: Decoder | None = None,
    prefix_bytes: int = 0,
) -> CausalLM | None:
    """The model for ``--device cuda`` with ``n_gpu_layers`` (as
    :func:`~modelc.runtime.backends.cuda_llama.build_cuda`, the same checks): the GPU's
    :class:`CudaLlama` when every layer goes there, None when none does (the CPU runs it
    all), else a :class:`SplitLM` of the first layers on the GPU and the rest on
    ``cpu()``, the output head on the GPU (:func:`head_on_gpu`).  ``auto`` leaves
    ``prefix_bytes`` free beside the layers: the prefix cache's blocks of a GPU cache
    stay in GPU memory (:func:`~modelc.runtime.backends.cuda_kv.device_prefix`)."""

    host, ctx = cuda_plan(ir, kv_mode, max_context, host)
    head_first = head_on_gpu()
    n = len(host.blocks)
    per_token_layer = host.kv_shape.bytes_per_token(KVMode(kv_mode)) // n
    kv_layer = per_token_layer * ctx * max_concurrent  # every sequence at its context
    if kv_budget_bytes is not None:  # the engine's whole KV budget, spread over the layers
        kv_layer = kv_budget_bytes // n
    if n_gpu_layers == "auto":
        free = int(require_cuda().cuda.runtime.memGetInfo()[0])
        free -= prefix_bytes if device_prefix() else 0
        tied = host.output is host.tok_embd
        k = plan_gpu_layers(
            [_bytes(b) for b in host.blocks],
            kv_layer,
            int(host.tok_embd.data.nbytes),
            0 if tied else int(host.output.data.nbytes),
            free,
            head_first,
        )
    else:
        k = n if n_gpu_layers == "all" else min(int(n_gpu_layers), n)
    if k == 0:
        return None
    host.keep_layers(0, k, head=head_first or k == n)
    per_seq, n_seqs = (
        (kv_layer * k, 1)
        if kv_budget_bytes is not None
        else (
            per_token_layer * ctx * k,
            max_concurrent,
        )
    )
    gpu = CudaLlama(ir, CudaBackend(), kv_bytes=per_seq, n_seqs=n_seqs, host=host)
    gpu.warm(max_concurrent, kv_mode)  # every decode graph now (the graph buckets)
    if k == n:
        return gpu
    rest = Decoder(ir, cpu())
    rest.keep_layers(k, n, head=not head_first)
    return SplitLM([gpu, rest])


def cuda_plan(
    ir: ModelIR, kv_mode: str, max_context: int | None, host: Decoder | None
) -> tuple[Decoder, int]:
    """The host model (what the GPU does not run refused, before any GPU work) and each
    sequence's context on the GPU; a quantized KV cache refused in one line."""
    if kv_mode not in (KVMode.F16.value, KVMode.F32.value):
        raise UsageError(
            f"--kv-cache {kv_mode} is not supported with --device cuda; use f16 or f32"
        )
    host = host if host is not None else cuda_host(ir)
    n_ctx = short_factors_ctx(host.n_ctx, host.spec.long_rope_after)
    return host, min(max_context or n_ctx, n_ctx)


def build_cuda(
    ir: ModelIR,
    *,
    kv_mode: str,
    max_context: int | None,
    max_concurrent: int,
    kv_budget_bytes: int | None,
    host: Decoder | None = None,
) -> CudaLlama:
    """The GPU-resident model for the engine, after checking that its weights and the KV
    caches of ``max_concurrent`` full-length sequences fit in free GPU memory."""

    host, ctx = cuda_plan(ir, kv_mode, max_context, host)
    per_seq = host.kv_shape.bytes_per_token(KVMode(kv_mode)) * ctx
    if kv_budget_bytes is not None:
        per_seq, max_concurrent = kv_budget_bytes, 1
    return CudaLlama(ir, CudaBackend(), kv_bytes=per_seq, n_seqs=max_concurrent, host=host)


def fused_lacks(model: Any) -> str:
    """What of ``model`` (a runtime model, on any backend) the device-resident
    :class:`CudaLlama` does not run, worded for :func:`op_by_op_note`; "" when it runs
    all of it."""
    if not isinstance(model, Decoder):
        return f"{model.architecture} models"
    sp = model.spec
    why = [lacks(sp, CUDA_RUNS)]
    heads = sorted(h for h in set(sp.head_dims or (sp.head_dim,)) if not head_runs(h))
    why.append(f"a head size of {heads[0]}" if heads else "")
    mats = [w for b in model.blocks for w in (b.wq, b.wk, b.wv, b.wo, b.w_gate, b.w_up, b.w_down)]
    mats += [w for b in model.blocks if b.experts for w in (*b.experts.up, *b.experts.down)]
    if sp.d % 32 or any(w is not None and w.shape[1] % 32 for w in mats):
        why.append("widths that are not multiples of 32")
    return "; ".join(w for w in why if w)


def op_by_op_note(architecture: str, lacking: str) -> str:
    """The one line saying a model runs op by op on the GPU, and why."""
    return (
        f"--device cuda: this {architecture} model runs op by op (matrix products, norms "
        f"and attention on the GPU, the rest on the CPU), since the device-resident forward "
        f"does not run {lacking} yet"
    )


def build_op_by_op(
    ir: ModelIR,
    n_gpu_layers: int | str,
    gpu: Callable[[], Backend],
    cpu: Callable[[], Backend],
    n_cpu_moe: int = 0,
) -> Any:
    """The model's own forward (:func:`~modelc.runtime.arch.build`) on ``gpu()`` (the
    op-level :class:`CudaBackend`; in tests the numpy reference stands in), or with
    ``n_gpu_layers`` N below its layers, a :class:`SplitLM` of its first N layers and the
    output head there (:func:`head_on_gpu`) and the rest on ``cpu()``; None for 0 layers
    (the CPU runs it all).  ``n_cpu_moe`` N: the experts of the first N layers computed by
    one ``cpu()`` backend (their weights never go to the GPU: the op-level backend uploads
    a weight at its first product)."""
    if n_gpu_layers == 0:
        return None
    model = build(ir, gpu())
    if n_cpu_moe and isinstance(model, Decoder):
        host = cpu()
        for b in model.blocks[:n_cpu_moe]:
            if b.experts is not None:
                b.experts.backend = host
    n = len(model.blocks) if isinstance(model, Decoder) else 0
    if n_gpu_layers in ("auto", "all") or int(n_gpu_layers) >= n:
        return model
    assert isinstance(model, Decoder)
    k, head_first = int(n_gpu_layers), head_on_gpu()
    model.keep_layers(0, k, head=head_first)
    rest = Decoder(ir, cpu())
    rest.keep_layers(k, n, head=not head_first)
    return SplitLM([model, rest])


def build_gpu(
    ir: ModelIR,
    n_gpu_layers: int | str,
    gpu: Callable[[], Backend],
    cpu: Callable[[], Backend],
    *,
    kv_mode: str,
    max_context: int | None,
    max_concurrent: int,
    kv_budget_bytes: int | None,
    fused_only: bool = False,
    n_cpu_moe: int = 0,
    prefix_bytes: int = 0,
) -> Any:
    """The model for ``--device cuda`` (``n_gpu_layers`` of it): device-resident
    (:func:`build_offload`) where :func:`fused_lacks` finds nothing, else op by op on
    ``gpu()`` (:func:`build_op_by_op`, after logging :func:`op_by_op_note`), or with
    ``fused_only`` (``--device auto``) None: the CPU runs it.  ``n_cpu_moe`` N on a
    mixture: op by op, the first N layers' experts on the CPU kernels (the fused forward
    keeps every expert on the GPU)."""
    host = build(ir, NumpyBackend())  # the description, checked; no GPU work yet
    lacking = fused_lacks(host)
    blocks = host.blocks if isinstance(host, Decoder) else []
    if n_cpu_moe and any(b.experts is not None for b in blocks):
        experts = sum(b.experts is not None for b in blocks[:n_cpu_moe])
        log.warning(
            f"--n-cpu-moe {n_cpu_moe}: the experts of {experts} mixture layer(s) on the CPU "
            "kernels, the rest of this model op by op on the GPU"
        )
        return build_op_by_op(ir, n_gpu_layers, gpu, cpu, n_cpu_moe)
    if n_cpu_moe:
        log.info(f"--n-cpu-moe {n_cpu_moe}: this {ir.architecture} model has no experts")
    if lacking and fused_only:
        return None
    if lacking:
        log.warning(op_by_op_note(ir.architecture, lacking))
        return build_op_by_op(ir, n_gpu_layers, gpu, cpu)
    assert isinstance(host, Decoder)
    return build_offload(
        ir,
        n_gpu_layers,
        cpu,
        kv_mode=kv_mode,
        max_context=max_context,
        max_concurrent=max_concurrent,
        kv_budget_bytes=kv_budget_bytes,
        host=host,
        prefix_bytes=prefix_bytes,
    )
