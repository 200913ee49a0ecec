"""modelc's own endpoints, with llama.cpp and vLLM field names where they differ."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
from quart import Blueprint, Response, request

import modelc
from modelc.engine.api import Engine
from modelc.server.context import body, ctx, json_response, record, use_model
from modelc.server.errors import ForbiddenError, NotImplementedFeature, ParamError
from modelc.server.generation import (
    chat_ids,
    embed_inputs,
    make_requests,
    new_id,
    respond,
    sampling,
    submit_all,
    text_ids,
)
from modelc.server.native.render import NativeRenderer
from modelc.server.native.schemas import (
    HealthResponse,
    InferRequest,
    InferResponse,
    InfoResponse,
    LoraLoadRequest,
    LoraResponse,
    LoraUnloadRequest,
    NativeChatRequest,
    NativeCompleteRequest,
    NativeEmbeddingRequest,
    NativeEmbeddingResponse,
    NativeOptions,
    SystemResponse,
    VersionResponse,
)
from modelc.server.state import ModelInfo

bp = Blueprint("native", __name__)


async def _answer(
    req: NativeOptions, info: ModelInfo, engine: Engine, ids: list[int], chat: bool, stream: bool
) -> Response:
    params = sampling(info, req, max_tokens=req.max_tokens)
    reqs = make_requests(
        new_id("chat" if chat else "cmpl"), ids, params, speculative=req.speculative
    )
    handles = submit_all(engine, reqs)
    return await respond(
        handles, NativeRenderer(info.model_id, chat), stream=stream, n_prompt=len(ids)
    )


@bp.post("/complete")
async def complete() -> Response:
    req = await body(NativeCompleteRequest)
    info, engine = await use_model(req.model, "text")
    return await _answer(req, info, engine, text_ids(info, req.prompt), chat=False, stream=False)


@bp.post("/chat")
async def chat() -> Response:
    req = await body(NativeChatRequest)
    info, engine = await use_model(req.model, "text")
    return await _answer(req, info, engine, chat_ids(info, req.messages), chat=True, stream=False)


@bp.post("/chat/stream")
async def chat_stream() -> Response:
    req = await body(NativeChatRequest)
    info, engine = await use_model(req.model, "text")
    return await _answer(req, info, engine, chat_ids(info, req.messages), chat=True, stream=True)


@bp.post("/infer")
async def infer() -> Response:
    req = await body(InferRequest)
    info, engine = await use_model(req.model)
    if info.architecture != "mlp":
        raise ParamError(
            f"/infer serves MLP (tensor) models; {info.model_id!r} is a {info.architecture} model "
            "(use /v1/completions, /v1/chat/completions or /v1/embeddings)",
            param="inputs",
        )
    run = getattr(engine, "infer", None)
    if run is None:
        raise NotImplementedFeature("this engine has no batched tensor inference (/infer) yet")
    widths = {len(x) for x in req.inputs}
    if len(widths) != 1:
        raise ParamError("every row of inputs must have the same length", param="inputs")
    x = np.asarray(req.inputs, np.float32)  # (batch, n_in)
    y = np.asarray(await run(x, req.input_name), np.float32)  # (batch, n_out)
    return json_response(InferResponse(y.tolist(), info.model_id))


@bp.post("/embeddings")
async def embeddings() -> Response:
    req = await body(NativeEmbeddingRequest)
    info, engine = await use_model(req.model, "embed")
    inp = req.input if req.input is not None else req.content
    if inp is None:
        raise ParamError("give 'input' (or llama.cpp's 'content')", param="input")
    batch = embed_inputs(inp, info)
    vecs = np.asarray(await engine.embed(batch), np.float32)
    n = sum(len(b) for b in batch)
    record().prompt_tokens = n
    return json_response(NativeEmbeddingResponse(vecs.tolist(), info.model_id, n))


@bp.get("/health")
async def health() -> Response:
    s = ctx().state
    if s.draining:
        return json_response(HealthResponse("shutting down"), 503)
    if not s.models.started:
        return json_response(HealthResponse("loading"), 503)
    return json_response(HealthResponse("ok"))


@bp.get("/info")
async def info_() -> Response:
    info = (await use_model(request.args.get("model")))[0]
    return json_response(
        InfoResponse(
            info.model_id,
            info.architecture,
            str(info.path),
            info.n_ctx,
            info.n_vocab,
            info.n_params,
            info.file_size,
            bool(info.chat_template),
            info.capabilities(),
            modelc.__version__,
        )
    )


def _git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(modelc.__file__).parent,
            capture_output=True,
            text=True,
            timeout=2,
            check=False,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


_SHA: list[str] = []


@bp.get("/api/version")
async def version() -> Response:
    if not _SHA:
        _SHA.append(_git_sha())
    return json_response(VersionResponse(modelc.__version__, _SHA[0]))


@bp.get("/v1/system")
async def system() -> Response:
    vm = psutil.virtual_memory()
    try:
        from modelc import _kernels

        kernels = getattr(_kernels, "__name__", "compiled")
    except ImportError:
        kernels = "numpy"
    return json_response(
        SystemResponse(
            f"{platform.system()} {platform.machine()}",
            sys.version.split()[0],
            os.cpu_count() or 1,
            vm.total,
            vm.available,
            kernels,
        )
    )


def _allowed_adapter(path: str, dirs: list[Path]) -> Path:
    if not dirs:
        raise ForbiddenError(
            "LoRA loading is off; start the server with --lora-dir DIR to allow adapters from DIR"
        )
    p = Path(path).expanduser().resolve()
    for d in dirs:
        if p.is_relative_to(d.resolve()):
            if not p.exists():
                raise ParamError(f"no adapter at {p}", param="path")
            return p
    raise ForbiddenError(
        f"{p} is outside the allowed adapter directories ({', '.join(str(d) for d in dirs)})"
    )


def _lora_engine(engine: Engine, op: str) -> object:
    fn = getattr(engine, op, None)
    if fn is None:
        raise NotImplementedFeature(
            f"this engine cannot {op.replace('_', ' ')} adapters yet (LoRA hot swap is not wired "
            "into the engine); restart with a merged model instead"
        )
    return fn


@bp.post("/lora/load")
async def lora_load() -> Response:
    req = await body(LoraLoadRequest)
    s = ctx().state
    _, engine = await use_model(req.model)
    p = _allowed_adapter(req.path, s.lora_dirs)
    fn = _lora_engine(engine, "load_lora")
    await fn(p, req.scale)  # type: ignore[operator]
    if str(p) not in s.lora_loaded:
        s.lora_loaded.append(str(p))
    return json_response(LoraResponse("loaded", list(s.lora_loaded)))


@bp.post("/lora/unload")
async def lora_unload() -> Response:
    req = await body(LoraUnloadRequest)
    s = ctx().state
    _, engine = await use_model(req.model)
    fn = _lora_engine(engine, "unload_lora")
    target = str(Path(req.path).expanduser().resolve()) if req.path else None
    if target is not None and target not in s.lora_loaded:
        raise ParamError(f"no adapter {target} is loaded", param="path")
    await fn(target)  # type: ignore[operator]
    s.lora_loaded[:] = [a for a in s.lora_loaded if target is not None and a != target]
    return json_response(LoraResponse("unloaded", list(s.lora_loaded)))
