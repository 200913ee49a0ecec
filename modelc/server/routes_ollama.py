"""Ollama's ``/api/generate``, ``/api/chat``, ``/api/embed`` and ``/api/tags``.

Streaming is newline-delimited JSON (Ollama's default ``stream: true``); ``options``
map onto the same sampling settings as the OpenAI endpoints.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import numpy as np
from quart import Blueprint, Response

from modelc.engine.api import Constraint, ConstraintKind, Engine, FinishEvent
from modelc.runtime.sampling import SamplingParams
from modelc.server import sse
from modelc.server import tools as tooling
from modelc.server.context import body, ctx, json_response, nursery, record, stream_response
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
    submit_all,
)
from modelc.server.schemas import (
    OllamaChatChunk,
    OllamaChatRequest,
    OllamaEmbedRequest,
    OllamaEmbedResponse,
    OllamaFunctionCall,
    OllamaGenerateChunk,
    OllamaGenerateRequest,
    OllamaGeneration,
    OllamaMessage,
    OllamaModel,
    OllamaModelDetails,
    OllamaOptions,
    OllamaTags,
    OllamaToolCall,
)
from modelc.server.state import ModelInfo

bp = Blueprint("ollama", __name__)


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _sampling(o: OllamaOptions | None, info: ModelInfo, n_prompt: int) -> SamplingParams:
    o = o or OllamaOptions()
    limit = None if o.num_predict is None or o.num_predict < 0 else o.num_predict
    return SamplingParams(
        temperature=0.8 if o.temperature is None else o.temperature,
        top_k=40 if o.top_k is None else o.top_k,
        top_p=0.9 if o.top_p is None else o.top_p,
        min_p=0.0 if o.min_p is None else o.min_p,
        repetition_penalty=1.1 if o.repeat_penalty is None else o.repeat_penalty,
        presence_penalty=o.presence_penalty or 0.0,
        frequency_penalty=o.frequency_penalty or 0.0,
        seed=o.seed,
        max_tokens=check_budget(info, n_prompt, limit),
        stop=list(o.stop or []),
        stop_token_ids=list(info.stop_ids),
    )


def _format(fmt: str | dict[str, Any] | None) -> Constraint | None:
    if fmt is None:
        return None
    if fmt == "json":
        return Constraint(ConstraintKind.JSON_OBJECT)
    return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(fmt))


def _done_fields(f: FinishEvent | None) -> dict[str, Any]:
    if f is None:
        return {}
    return {
        "done_reason": FINISH.get(f.reason, "stop"),
        "prompt_eval_count": f.prompt_tokens,
        "eval_count": f.completion_tokens,
        "total_duration": int(f.total_time * 1e9),
    }


ChunkFn = Callable[[str, FinishEvent | None], OllamaGenerateChunk | OllamaChatChunk]


async def _answer(
    req: OllamaGeneration,
    info: ModelInfo,
    engine: Engine,
    ids: list[int],
    prefix: str,
    chunk: ChunkFn,
) -> Response:
    """Generate from ``ids`` and answer as Ollama does: NDJSON chunks, or the final chunk alone.

    ``chunk(text, finish)`` builds a chunk; ``finish`` is None until the last one.
    """
    c = ctx()
    reqs = make_requests(
        new_id(prefix), ids, _sampling(req.options, info, len(ids)), 1, _format(req.format)
    )
    handle = submit_all(engine, reqs)[0]
    if req.stream:
        chunks = relay(
            EventStream(handle, nursery(), c.metrics),
            None,
            lambda text: sse.ndjson(chunk(text, None)),
            lambda f: [sse.ndjson(chunk(f.text, f))],
        )
        return stream_response(chunks, sse.NDJSON_HEADERS)
    out = (await collect_all([handle], c.metrics))[0]
    assert out.finish is not None
    record().add(out.finish)
    return json_response(chunk(out.text, out.finish))


@bp.post("/api/generate")
async def generate() -> Response:
    c = ctx()
    req = await body(OllamaGenerateRequest)
    info, engine = c.state.serve(req.model, "text")
    if req.raw or not info.chat_template:
        text = (f"{req.system}\n\n" if req.system else "") + req.prompt
        ids = info.tok().encode(text, add_special=True)
    else:
        msgs: list[dict[str, Any]] = (
            [{"role": "system", "content": req.system}] if req.system else []
        )
        msgs.append({"role": "user", "content": req.prompt})
        _, ids = chat_prompt(info, msgs)

    def chunk(text: str, f: FinishEvent | None) -> OllamaGenerateChunk:
        return OllamaGenerateChunk(req.model, _now(), text, f is not None, **_done_fields(f))

    return await _answer(req, info, engine, ids, "gen", chunk)


@bp.post("/api/chat")
async def chat() -> Response:
    c = ctx()
    req = await body(OllamaChatRequest)
    info, engine = c.state.serve(req.model, "text")
    msgs = [{"role": m.role, "content": m.content} for m in req.messages]
    if not msgs:
        msgs = [{"role": "user", "content": ""}]
    _, ids = chat_prompt(info, msgs, req.tools)
    tool_calls = bool(req.tools) and not req.stream  # streamed text is relayed as it comes

    def chunk(text: str, f: FinishEvent | None) -> OllamaChatChunk:
        msg = _reply(text, tool_calls)
        return OllamaChatChunk(req.model, _now(), msg, f is not None, **_done_fields(f))

    return await _answer(req, info, engine, ids, "chat", chunk)


def _reply(text: str, tools: bool) -> OllamaMessage:
    """The assistant message; with tools, a tool call in the text becomes ``tool_calls``."""
    if tools:
        content, calls = tooling.parse_tool_calls(text)
        parsed = []
        for c in calls:
            try:
                args = json.loads(c.function.arguments)
            except json.JSONDecodeError:
                continue
            if isinstance(args, dict):
                parsed.append(OllamaToolCall(OllamaFunctionCall(c.function.name, args)))
        if parsed:
            return OllamaMessage("assistant", content or "", parsed)
    return OllamaMessage("assistant", text)


@bp.post("/api/embed")
async def embed() -> Response:
    c = ctx()
    req = await body(OllamaEmbedRequest)
    info, engine = c.state.serve(req.model, "embed")
    batch = embed_inputs(req.input, info)
    if req.truncate:
        batch = [b[: info.n_ctx] for b in batch]
    vecs = np.asarray(await engine.embed(batch), np.float32)
    n = sum(len(b) for b in batch)
    record().prompt_tokens = n
    return json_response(OllamaEmbedResponse(req.model, vecs.tolist(), n))


@bp.get("/api/tags")
async def tags() -> Response:
    info = ctx().state.model()
    modified = datetime.fromtimestamp(info.created, UTC).isoformat().replace("+00:00", "Z")
    size = f"{info.n_params / 1e6:.0f}M" if info.n_params < 1e9 else f"{info.n_params / 1e9:.1f}B"
    details = OllamaModelDetails("modelc", info.architecture, size, info.quantization)
    return json_response(
        OllamaTags(
            [OllamaModel(info.model_id, info.model_id, modified, info.file_size, "", details)]
        )
    )
