"""modelc's own endpoints, with llama.cpp and vLLM field names where they differ."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import psutil
from quart import Blueprint, Response

import modelc
from modelc.engine.api import Engine, FinishEvent
from modelc.runtime.sampling import SamplingParams
from modelc.server import sse
from modelc.server.context import body, ctx, json_response, nursery, record, stream_response
from modelc.server.errors import ForbiddenError, NotImplementedFeature, ParamError
from modelc.server.generation import (
    FINISH,
    EventStream,
    chat_prompt,
    check_budget,
    collect_all,
    embed_inputs,
    make_requests,
    new_id,
    relay,
    sampling_params,
    submit_all,
)
from modelc.server.schemas import (
    DetokenizeRequest,
    DetokenizeResponse,
    GenerationSettings,
    HealthResponse,
    InferRequest,
    InferResponse,
    InfoResponse,
    LoraLoadRequest,
    LoraResponse,
    LoraUnloadRequest,
    NativeChatRequest,
    NativeChatResponse,
    NativeCompleteRequest,
    NativeCompleteResponse,
    NativeEmbeddingRequest,
    NativeEmbeddingResponse,
    NativeMessage,
    NativeOptions,
    NativeStreamEvent,
    NativeUsage,
    PropsResponse,
    SystemResponse,
    TokenizeRequest,
    TokenizeResponse,
    TokenPiece,
    VersionResponse,
)
from modelc.server.state import ModelInfo

bp = Blueprint("native", __name__)
DEFAULTS = NativeOptions()


def _sampling(o: NativeOptions, info: ModelInfo, n_prompt: int) -> SamplingParams:
    return sampling_params(o, info, check_budget(info, n_prompt, o.max_tokens))


def _usage(f: FinishEvent) -> NativeUsage:
    return NativeUsage(
        f.prompt_tokens,
        f.completion_tokens,
        f.prompt_tokens + f.completion_tokens,
        f.time_to_first_token,
        round(f.total_time, 6),
    )


async def _one(
    engine: Engine, ids: list[int], sp: SamplingParams, prefix: str
) -> tuple[str, FinishEvent]:
    c = ctx()
    out = (
        await collect_all(submit_all(engine, make_requests(new_id(prefix), ids, sp, 1)), c.metrics)
    )[0]
    assert out.finish is not None
    record().add(out.finish)
    return out.text, out.finish


@bp.post("/complete")
async def complete() -> Response:
    req = await body(NativeCompleteRequest)
    info, engine = ctx().state.serve(None, "text")
    ids = info.tok().encode(req.prompt, add_special=True)
    text, fin = await _one(engine, ids, _sampling(req, info, len(ids)), "cmpl")
    return json_response(
        NativeCompleteResponse(text, FINISH.get(fin.reason, "stop"), _usage(fin), info.model_id)
    )


@bp.post("/chat")
async def chat() -> Response:
    req = await body(NativeChatRequest)
    info, engine = ctx().state.serve(None, "text")
    _, ids = chat_prompt(info, req.messages)
    text, fin = await _one(engine, ids, _sampling(req, info, len(ids)), "chat")
    return json_response(
        NativeChatResponse(
            NativeMessage("assistant", text),
            FINISH.get(fin.reason, "stop"),
            _usage(fin),
            info.model_id,
        )
    )


@bp.post("/chat/stream")
async def chat_stream() -> Response:
    c = ctx()
    req = await body(NativeChatRequest)
    info, engine = c.state.serve(None, "text")
    _, ids = chat_prompt(info, req.messages)
    handle = submit_all(
        engine, make_requests(new_id("chat"), ids, _sampling(req, info, len(ids)), 1)
    )[0]
    st = EventStream(handle, nursery(), c.metrics)
    return stream_response(_native_stream(st, c.state.ping_interval), sse.HEADERS)


def _native_stream(st: EventStream, ping: float) -> AsyncIterator[bytes]:
    def finish(f: FinishEvent) -> list[bytes]:
        last = NativeStreamEvent(
            delta=f.text, finish_reason=FINISH.get(f.reason, "stop"), usage=_usage(f)
        )
        return [sse.event(last), sse.DONE]

    return relay(st, ping, lambda text: sse.event(NativeStreamEvent(delta=text)), finish)


@bp.post("/infer")
async def infer() -> Response:
    req = await body(InferRequest)
    info, engine = ctx().state.ready()
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
    info, engine = ctx().state.serve(None, "embed")
    inp = req.input if req.input is not None else req.content
    if inp is None:
        raise ParamError("give 'input' (or llama.cpp's 'content')", param="input")
    batch = embed_inputs(inp, info)
    vecs = np.asarray(await engine.embed(batch), np.float32)
    n = sum(len(b) for b in batch)
    record().prompt_tokens = n
    return json_response(NativeEmbeddingResponse(vecs.tolist(), info.model_id, n))


@bp.post("/tokenize")
async def tokenize() -> Response:
    req = await body(TokenizeRequest)
    info = ctx().state.model()
    tok = info.tok()
    add = req.add_special if req.add_special is not None else req.add_special_tokens
    if req.messages is not None:
        _, ids = chat_prompt(info, req.messages)
    else:
        text = req.content if req.content is not None else req.prompt
        if text is None:
            raise ParamError(
                "give 'content' (llama.cpp), 'prompt' or 'messages' (vLLM)", param="content"
            )
        ids = tok.encode(text, add_special=True if add is None else add)
    tokens: list[int | TokenPiece] = (
        [TokenPiece(i, tok.token_to_piece(i).decode("utf-8", "replace")) for i in ids]
        if req.with_pieces
        else list(ids)
    )
    return json_response(TokenizeResponse(tokens, len(ids), info.n_ctx))


@bp.post("/detokenize")
async def detokenize() -> Response:
    req = await body(DetokenizeRequest)
    info = ctx().state.model()
    tok = info.tok()
    bad = [i for i in req.tokens if i >= tok.vocab_size]
    if bad:
        raise ParamError(
            f"token id {bad[0]} is outside the vocabulary 0..{tok.vocab_size - 1}", param="tokens"
        )
    text = tok.decode(req.tokens)
    return json_response(DetokenizeResponse(text, text))


@bp.get("/health")
async def health() -> Response:
    s = ctx().state
    if s.draining:
        return json_response(HealthResponse("shutting down"), 503)
    if s.engine is None or s.info is None:
        return json_response(HealthResponse("loading"), 503)
    return json_response(HealthResponse("ok"))


@bp.get("/info")
async def info_() -> Response:
    info = ctx().state.model()
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


@bp.get("/props")
async def props() -> Response:
    s = ctx().state
    info = s.model()
    d = DEFAULTS
    settings = GenerationSettings(
        info.n_ctx,
        d.max_tokens,
        d.temperature,
        d.top_p,
        d.top_k,
        d.min_p,
        d.repetition_penalty,
        d.presence_penalty,
        d.frequency_penalty,
    )
    return json_response(
        PropsResponse(
            str(info.path),
            info.model_id,
            info.architecture,
            s.max_concurrent,
            info.chat_template or "",
            settings,
            f"modelc {modelc.__version__}",
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
    _, engine = s.ready()
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
    _, engine = s.ready()
    fn = _lora_engine(engine, "unload_lora")
    target = str(Path(req.path).expanduser().resolve()) if req.path else None
    if target is not None and target not in s.lora_loaded:
        raise ParamError(f"no adapter {target} is loaded", param="path")
    await fn(target)  # type: ignore[operator]
    s.lora_loaded[:] = [a for a in s.lora_loaded if target is not None and a != target]
    return json_response(LoraResponse("unloaded", list(s.lora_loaded)))
