"""Partial offload (``--n-gpu-layers N|auto|all``, llama.cpp's ``-ngl``): the first layers
on the GPU (:class:`~modelc.runtime.backends.cuda_llama.CudaLlama`), the rest on the CPU
kernels, one step flowing through both (:class:`~modelc.runtime.split.SplitLM`), so a
model larger than the GPU still runs.

``auto`` (as llama.cpp's ``--fit``) puts as many layers on the GPU as its free memory
holds beside their KV caches (every sequence at its full context), the embedding table and
scratch: :func:`plan_gpu_layers`, a pure function of those sizes.  The GPU part takes the
embedding (the step starts there); the output head goes with the last layer.
:func:`build_cuda` builds the whole model on the GPU (its checks, :func:`cuda_plan`,
shared with :func:`build_offload`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from modelc.errors import UsageError
from modelc.formats.ir import ModelIR
from modelc.runtime.arch.decoder import Decoder, DecoderBlock
from modelc.runtime.backend import Backend
from modelc.runtime.backends.cuda import CudaBackend, require_cuda
from modelc.runtime.backends.cuda_llama import CudaLlama, cuda_host, cuda_n_ctx
from modelc.runtime.kv_cache import KVMode
from modelc.runtime.model import CausalLM
from modelc.runtime.split import SplitLM

SCRATCH = 256 << 20  # the GPU's activations, cuBLAS workspace and allocator slack (check_fits')


def plan_gpu_layers(
    layer_bytes: Sequence[int], kv_per_layer: int, embd: int, head: int, free: int
) -> int:
    """How many first layers ``auto`` puts on the GPU: the most whose weights
    (``layer_bytes``, in order) and KV caches (``kv_per_layer`` each: every sequence at
    its full context) fit in ``free`` bytes beside the embedding table and
    :data:`SCRATCH`; every layer only if the output head (``head`` bytes: 0 when it is the
    embedding table) fits too.  0 when not even the first layer fits."""
    room = free - embd - SCRATCH
    k, used = 0, 0
    for w in layer_bytes:
        if used + w + kv_per_layer > room:
            break
        used, k = used + w + kv_per_layer, k + 1
    if k == len(layer_bytes) and used + head > room:
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
) -> CausalLM | None:
    """The model for ``--device cuda`` with ``n_gpu_layers`` (as
    :func:`~modelc.runtime.backends.cuda_llama.build_cuda`, the same checks): the GPU's
    :class:`CudaLlama` when every layer goes there, None when none does (the CPU runs it
    all), else a :class:`SplitLM` of the first layers on the GPU and the rest on
    ``cpu()``."""

    host, ctx = cuda_plan(ir, kv_mode, max_context, host)
    n = len(host.blocks)
    per_token_layer = host.kv_shape.bytes_per_token(KVMode(kv_mode)) // n
    kv_layer = per_token_layer * ctx * max_concurrent  # every sequence at its context
    if kv_budget_bytes is not None:  # the engine's whole KV budget, spread over the layers
        kv_layer = kv_budget_bytes // n
    if n_gpu_layers == "auto":
        free = int(require_cuda().cuda.runtime.memGetInfo()[0])
        tied = host.output is host.tok_embd
        k = plan_gpu_layers(
            [_bytes(b) for b in host.blocks],
            kv_layer,
            int(host.tok_embd.data.nbytes),
            0 if tied else int(host.output.data.nbytes),
            free,
        )
    else:
        k = n if n_gpu_layers == "all" else min(int(n_gpu_layers), n)
    if k == 0:
        return None
    host.keep_layers(0, k)
    per_seq, n_seqs = (
        (kv_layer * k, 1)
        if kv_budget_bytes is not None
        else (
            per_token_layer * ctx * k,
            max_concurrent,
        )
    )
    gpu = CudaLlama(ir, CudaBackend(), kv_bytes=per_seq, n_seqs=n_seqs, host=host)
    if k == n:
        return gpu
    rest = Decoder(ir, cpu())
    rest.keep_layers(k, n)
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
    n_ctx = cuda_n_ctx(host.n_ctx, host)
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
