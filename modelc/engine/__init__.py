"""The engine: the scheduler that owns generation (:mod:`modelc.engine.scheduler`: queues,
request states, delivery; it decides each step through the pure :mod:`~modelc.engine.policy`)
and the model runner that executes each step (:mod:`modelc.engine.runner`: no trio).

``engine = build_engine(model, EngineOptions(...))`` loads the model; then
``await nursery.start(engine.run)`` starts the scheduler task, and the server calls
``engine.submit(request)`` / ``engine.embed(batch)`` / ``engine.stats()``
(the contract is :mod:`modelc.engine.api`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modelc.engine.options import EngineOptions
from modelc.engine.scheduler import LLMEngine
from modelc.errors import UnsupportedError, UsageError
from modelc.formats.ir import ModelIR
from modelc.runtime.backend import Backend
from modelc.runtime.backends.factory import get_backend
from modelc.runtime.model import EmbeddingModel, LanguageModel, SeqChunk
from modelc.vision import TEXT_ARCH, VisionModel

__all__ = ["EngineOptions", "LLMEngine", "build_engine", "build_runtime"]


def _cuda_runtime(ir: ModelIR, opt: EngineOptions) -> Any:
    """The model computing on the GPU when ``opt.device`` asks for CUDA (``auto``: when CuPy
    sees a GPU and the device-resident forward runs the model): wholly, or its first
    ``opt.n_gpu_layers`` layers with the rest on the CPU kernels; a model that forward
    does not run, op by op (one log line says why); else None (the CPU runs it all)."""
    ngl = opt.n_gpu_layers
    if opt.device in ("cpu", "webgpu", "metal") or ngl == 0:
        return None
    from modelc.runtime.backends.cuda import cuda_unavailable, require_cuda
    from modelc.runtime.backends.cuda_backend import CudaBackend
    from modelc.runtime.backends.cuda_offload import build_gpu

    # the GPU where it runs the model whole (experts asked on the CPU: the GPU, as -ngl N)
    auto = opt.device == "auto" and ngl == "auto" and not opt.n_cpu_moe
    if auto and (opt.kv_cache not in ("f16", "f32") or cuda_unavailable() is not None):
        return None
    if ngl != "auto" and (why := cuda_unavailable()) is not None:  # layers of no GPU
        raise UsageError(f"--n-gpu-layers {ngl}: {why}; use --n-gpu-layers auto or 0")
    if opt.n_cpu_moe and opt.device == "auto" and (why := cuda_unavailable()) is not None:
        raise UsageError(f"--n-cpu-moe {opt.n_cpu_moe}: {why}; drop --n-cpu-moe")
    if not auto:
        require_cuda()

    def cpu() -> Backend:
        return get_backend(threads=opt.threads)

    return build_gpu(
        ir,
        ngl,
        CudaBackend,
        cpu,
        kv_mode=opt.kv_cache,
        max_context=opt.max_context,
        max_concurrent=opt.max_concurrent,
        kv_budget_bytes=opt.kv_budget_bytes,
        fused_only=auto,
        n_cpu_moe=opt.n_cpu_moe,
        prefix_bytes=opt.prefix_cache_bytes,
    )


def _webgpu_runtime(ir: ModelIR, opt: EngineOptions, backend: Backend) -> Any:
    """The decoder resident on the WebGPU device (one submit a step) where it runs the
    model, else None (op by op on the WGSL backend; one log line says why)."""
    import logging

    from modelc.runtime.backends.webgpu import WebGPUBackend
    from modelc.runtime.backends.webgpu_llama import WebGpuLlama, resident_wanted

    if not resident_wanted() or not isinstance(backend, WebGPUBackend):
        return None
    why = None
    if opt.mmproj is not None:
        why = "images (--mmproj) run on the op-level decoder"
    elif opt.kv_cache not in ("f16", "f32"):
        why = f"--kv-cache {opt.kv_cache} (it keeps f16 or f32 caches)"
    else:
        try:
            return WebGpuLlama(ir, backend)
        except UnsupportedError as e:
            why = str(e)
    logging.getLogger("modelc").warning(
        f"--device {opt.device}: this {ir.architecture} model runs op by op, not resident: {why}"
    )
    return None


def build_runtime(
    ir: ModelIR,
    opt: EngineOptions,
    backend: Backend | None = None,
    runtime_factory: Callable[[ModelIR, Backend], Any] | None = None,
) -> tuple[Any, Backend]:
    """The runtime model of ``ir`` on ``opt.device`` (the GPU-resident forward for CUDA,
    else :func:`modelc.runtime.arch.build` or ``runtime_factory`` on the backend) and the
    host backend that goes with it (the engine's and the bench's one way to place a model)."""
    from modelc.runtime.arch import build

    on_cpu = backend is not None or (opt.mmproj is not None and opt.device == "auto")  # images
    gpu = None if on_cpu else _cuda_runtime(ir, opt)
    if backend is None and opt.device in ("webgpu", "metal"):  # WGSL shaders through wgpu
        backend = get_backend(opt.device)
        gpu = None if runtime_factory else _webgpu_runtime(ir, opt, backend)
    backend = backend or get_backend(threads=opt.threads)
    return gpu or (runtime_factory or build)(ir, backend), backend


def build_engine(
    model: str | Path | ModelIR,
    options: EngineOptions | None = None,
    *,
    model_name: str | None = None,
    backend: Backend | None = None,
    runtime_factory: Callable[[ModelIR, Backend], Any] | None = None,
) -> LLMEngine:
    """An engine for a model path / store or catalog name / loaded IR (not started yet);
    ``backend``: the compute backend (default: the CPU kernels with ``options.threads``);
    ``runtime_factory``: builds the runtime model from (ir, backend) instead of
    :func:`modelc.runtime.arch.build` (the specialised forward of a program ``modelc compile`` wrote)."""
    from modelc.engine.speculative import MLPDraftWeights
    from modelc.runtime.chat_template import load_template_file
    from modelc.runtime.prompt import PromptFormat

    opt = options or EngineOptions()
    opt.validate()
    artifact = None
    if isinstance(model, ModelIR):
        ir = model
    else:
        from modelc.resolve import open_ir

        ir, artifact = open_ir(str(model))
    if opt.mmproj is None and not opt.no_mmproj and artifact is not None:  # pulled beside it
        from modelc.store import mmproj_beside

        if (side := mmproj_beside(artifact)) is not None:
            opt = dataclasses.replace(opt, mmproj=str(side))
    runtime, backend = build_runtime(ir, opt, backend, runtime_factory)
    if not isinstance(runtime, (LanguageModel, EmbeddingModel)):
        raise UnsupportedError(
            f"{ir.architecture} models are neither language nor embedding models; "
            "the engine cannot serve them",
            path=ir.source.path,
        )
    if isinstance(runtime, LanguageModel):
        # one token through every layer now, not in the first request: the backend makes
        # what it derives from the weights on first use (repacked copies, tables)
        runtime.forward([SeqChunk(runtime.new_cache(max_tokens=1), [0])])
    template = ir.chat_template
    if opt.chat_template_file is not None:  # the file replaces the model's template
        template = load_template_file(opt.chat_template_file)
    prompt = (
        PromptFormat.build(
            ir.tokenizer,
            template,
            generation=ir.generation,
            metadata=ir.metadata,
            config=opt.sampling,
            max_tokens=opt.max_tokens,
        )
        if ir.tokenizer is not None
        else None
    )
    mlp = None
    if isinstance(runtime, LanguageModel) and MLPDraftWeights.has(ir):
        mlp = MLPDraftWeights.from_ir(ir, backend)
    name = model_name or (Path(str(ir.source.path)).stem if ir.source.path else ir.architecture)
    vision = _vision(opt.mmproj, runtime) if opt.mmproj else None
    return LLMEngine(runtime, prompt, opt, model_name=name, mlp_draft=mlp, vision=vision)


def _vision(path: str, runtime: Any) -> VisionModel:
    """The projector of ``--mmproj`` for ``runtime``: its width must be the model's, and the
    model the one decoder (image embeddings go in where its token embeddings would)."""
    from modelc.runtime.arch.decoder import Decoder

    vision = VisionModel(path)
    if not isinstance(runtime, Decoder):
        raise UnsupportedError(
            f"images run on the CPU decoder only; {type(runtime).__name__} takes none "
            "(start it with --device cpu)"
        )
    arch = runtime.architecture
    goes = TEXT_ARCH.get(vision.cfg.projector, (arch,))
    mrope = vision.cfg.projector in ("qwen2.5vl_merger", "qwen3vl_merger")
    deep = len(vision.cfg.deepstack) != runtime.spec.deepstack  # DeepStack layers (qwen3vl)
    if arch not in goes or mrope != (runtime.mrope is not None) or deep:
        raise UsageError(
            f"{path}: a {vision.cfg.projector} projector does not go with a {arch} model"
            + (f" (it goes with {' or '.join(goes)})" if arch not in goes else "")
            + "; give the mmproj file made with this model"
        )
    if vision.cfg.n_embd != runtime.d:
        raise UsageError(
            f"{path}: the projector makes {vision.cfg.n_embd}-wide embeddings but the model "
            f"is {runtime.d} wide; give the mmproj file made with this model"
        )
    return vision
