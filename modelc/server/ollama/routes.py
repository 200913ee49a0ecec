"""Ollama's ``/api/generate``, ``/api/chat``, ``/api/embed`` and ``/api/embeddings``.

Streaming is newline-delimited JSON (Ollama's default ``stream: true``); ``options``
map onto the same sampling settings as the OpenAI endpoints, with the model's defaults
where a request gives none.  As Ollama: ``num_predict`` -1 (or none) runs to the end of
the turn; ``num_ctx`` bounds prompt and answer (a chat's oldest messages are dropped, a
raw prompt keeps its end, to fit); ``keep_alive`` sets how long the model stays loaded
after the request, and a request with no prompt or messages only loads the model (or,
with ``keep_alive: 0``, unloads it).  Model management is :mod:`~modelc.server.ollama.routes_models`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import numpy as np
from quart import Blueprint, Response

from modelc.chat import StreamParser, ToolCall
from modelc.engine.api import Constraint, ConstraintKind, Engine, FinishEvent
from modelc.runtime.model import ImageSpan
from modelc.runtime.prompt import ChatPrompt
from modelc.runtime.sampling import SamplingParams
from modelc.server import tools as tooling
from modelc.server.context import body, ctx, json_response, record, use_model
from modelc.server.conversation import reasoning_budget
from modelc.server.generation import (
    embed_inputs,
    make_requests,
    new_id,
    respond,
    sampling,
    submit_all,
    template_prompt,
    text_ids,
)
from modelc.server.images import place_images
from modelc.server.models import parse_keep_alive
from modelc.server.ollama.render import Chunk, OllamaRenderer, done_fields
from modelc.server.ollama.schemas import (
    OllamaChatChunk,
    OllamaChatRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbeddingsResponse,
    OllamaEmbedRequest,
    OllamaEmbedResponse,
    OllamaFunctionCall,
    OllamaGenerateChunk,
    OllamaGenerateRequest,
    OllamaGeneration,
    OllamaMessage,
    OllamaOptions,
    OllamaToolCall,
)
from modelc.server.state import ModelInfo
from modelc.vision import ImageError

bp = Blueprint("ollama", __name__)


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _sampling(o: OllamaOptions | None, info: ModelInfo) -> SamplingParams:
    o = o or OllamaOptions()
    limit = None if o.num_predict is None or o.num_predict < 0 else o.num_predict
    return sampling(info, o.sampling(), max_tokens=limit)


def _format(fmt: str | dict[str, Any] | None) -> Constraint | None:
    if fmt is None:
        return None
    if fmt == "json":
        return Constraint(ConstraintKind.JSON_OBJECT)
    return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(fmt))


def _limit(o: OllamaOptions | None, n_prompt: int) -> int | None:
    """``num_predict`` within ``num_ctx`` (None: to the end of the turn)."""
    limit = None if o is None or o.num_predict is None or o.num_predict < 0 else o.num_predict
    if o is not None and o.num_ctx is not None:
        room = max(o.num_ctx - n_prompt, 0)
        limit = room if limit is None else min(limit, room)
    return limit


async def _answer(
    req: OllamaGeneration,
    info: ModelInfo,
    engine: Engine,
    ids: list[int],
    prefix: str,
    r: OllamaRenderer,
    reader: tooling.OutputReader | None = None,
    images: tuple[ImageSpan, ...] = (),
) -> Response:
    params = _sampling(req.options, info)
    params.max_tokens = _limit(req.options, len(ids))
    constraint = _format(req.format)
    if reader is not None:  # a chat's format constrains the answer, after the trace
        constraint = tooling.after_trace(constraint, reader)
        params.reasoning_budget = reasoning_budget(info, reader, ctx().state)  # the server's
    reqs = make_requests(new_id(prefix), ids, params, 1, constraint, images=images)
    return await respond(submit_all(engine, reqs), r, stream=req.stream, n_prompt=len(ids))


async def _load_only(req: OllamaGeneration, chunk: Callable[[str], Chunk]) -> Response:
    """A request without a prompt: load the model (``keep_alive: 0``: unload it)."""
    keep = parse_keep_alive(req.keep_alive)
    await use_model(req.model, "text", keep)
    return json_response(chunk("unload" if keep == 0 else "load"))


@bp.post("/api/generate")
async def generate() -> Response:
    req = await body(OllamaGenerateRequest)
    if not req.prompt and not req.system:
        return await _load_only(
            req, lambda why: OllamaGenerateChunk(req.model, _now(), "", True, done_reason=why)
        )
    info, engine = await use_model(req.model, "text", parse_keep_alive(req.keep_alive))
    reader = None
    images: tuple[ImageSpan, ...] = ()
    if req.raw or not info.chat_template:
        if req.images:
            raise ImageError("images go through the chat template; leave raw off", param="images")
        text = (f"{req.system}\n\n" if req.system else "") + req.prompt
        ids = text_ids(info, text)
        ctx_len = req.options.num_ctx if req.options else None
        if ctx_len is not None and len(ids) >= ctx_len:  # the runner keeps the prompt's end
            ids = ids[len(ids) - ctx_len + 1 :]
    else:
        msgs: list[dict[str, Any]] = (
            [{"role": "system", "content": req.system}] if req.system else []
        )
        msgs.append({"role": "user", "content": req.prompt, "images": req.images})
        prompt = template_prompt(info, msgs, template_kwargs=_think_kwargs(req.think))
        ids, images = await place_images(info, engine, prompt.ids, prompt.media, prompt.images)
        reader = tooling.output_reader(info.chat_template, prompt.text, None)
    parser = reader.parser() if reader is not None else None

    def chunk(text: str, f: FinishEvent | None, out: list[int]) -> OllamaGenerateChunk:
        context = [*ids, *out] if f is not None else None
        thinking = ""
        if parser is not None:
            text, thinking, _ = _read(parser, text, f, req.stream)
        return OllamaGenerateChunk(
            req.model,
            _now(),
            text,
            f is not None,
            **done_fields(f),
            context=context,
            thinking=thinking or None,
        )

    return await _answer(req, info, engine, ids, "gen", OllamaRenderer(chunk), reader, images)


def _read(
    parser: StreamParser, text: str, f: FinishEvent | None, stream: bool
) -> tuple[str, str, list[ToolCall]]:
    """(answer, trace, calls) of a streamed piece (``f`` None), of the stream's end, or
    of the whole text."""
    if f is None:
        d = parser.feed(text)
        return d.content, d.reasoning, []
    if stream:
        parser.feed(text)
        last, whole = parser.finish()
        return last.content, last.reasoning, whole.calls
    got = parser.full(text)
    return got.content, got.reasoning, got.calls


def _fit(
    info: ModelInfo, msgs: list[Any], tools: Any, num_ctx: int | None, kwargs: dict[str, Any]
) -> ChatPrompt:
    """The chat's prompt; over ``num_ctx``, the oldest non-system messages go first (Ollama)."""
    prompt = template_prompt(info, msgs, tools, template_kwargs=kwargs)
    while num_ctx is not None and len(prompt.ids) >= num_ctx:
        drop = next((k for k, m in enumerate(msgs[:-1]) if _role(m) != "system"), None)
        if drop is None:
            break  # only the last message (and system) left: the engine says it is too long
        msgs = msgs[:drop] + msgs[drop + 1 :]
        prompt = template_prompt(info, msgs, tools, template_kwargs=kwargs)
    return prompt


def _think_kwargs(think: bool | str | None) -> dict[str, Any]:
    """Ollama's ``think`` as template variables: true/false -> ``enable_thinking``, a
    level -> ``reasoning_effort`` (gpt-oss) with thinking on; unset -> the template's own."""
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"enable_thinking": think}
    return {"enable_thinking": True, "reasoning_effort": think}


def _role(m: Any) -> str:
    return str(m["role"] if isinstance(m, dict) else m.role)


@bp.post("/api/chat")
async def chat() -> Response:
    req = await body(OllamaChatRequest)
    if not req.messages:
        empty = OllamaMessage("assistant", "")
        return await _load_only(
            req, lambda why: OllamaChatChunk(req.model, _now(), empty, True, done_reason=why)
        )
    info, engine = await use_model(req.model, "text", parse_keep_alive(req.keep_alive))
    num_ctx = req.options.num_ctx if req.options else None
    prompt = _fit(info, list(req.messages), req.tools, num_ctx, _think_kwargs(req.think))
    # the trace goes to ``thinking`` and calls to ``tool_calls`` (streamed: with the last chunk)
    reader = tooling.output_reader(info.chat_template, prompt.text, req.tools)
    parser = reader.parser()

    def chunk(text: str, f: FinishEvent | None, out: list[int]) -> OllamaChatChunk:
        msg = _reply(*_read(parser, text, f, req.stream))
        return OllamaChatChunk(req.model, _now(), msg, f is not None, **done_fields(f))

    ids, images = await place_images(info, engine, prompt.ids, prompt.media, prompt.images)
    return await _answer(req, info, engine, ids, "chat", OllamaRenderer(chunk), reader, images)


def _reply(content: str, thinking: str, calls: list[ToolCall]) -> OllamaMessage:
    """The assistant message; Ollama's calls carry their arguments as objects."""
    parsed = []
    for c in calls:
        try:
            args = json.loads(c.arguments)
        except json.JSONDecodeError:
            continue
        if isinstance(args, dict):
            parsed.append(OllamaToolCall(OllamaFunctionCall(c.name, args)))
    return OllamaMessage("assistant", content, parsed or None, thinking or None)


@bp.post("/api/embed")
async def embed() -> Response:
    req = await body(OllamaEmbedRequest)
    info, engine = await use_model(req.model, "embed", parse_keep_alive(req.keep_alive))
    batch = embed_inputs(req.input, info, truncate=req.truncate)
    vecs = np.asarray(await engine.embed(batch), np.float32)
    n = sum(len(b) for b in batch)
    record().prompt_tokens = n
    return json_response(OllamaEmbedResponse(req.model, vecs.tolist(), n))


@bp.post("/api/embeddings")
async def embeddings() -> Response:
    """The older single-text form: ``{"model", "prompt"}`` -> ``{"embedding": [...]}``."""
    req = await body(OllamaEmbeddingsRequest)
    info, engine = await use_model(req.model, "embed", parse_keep_alive(req.keep_alive))
    if not req.prompt:
        return json_response(OllamaEmbeddingsResponse([]))
    batch = embed_inputs(req.prompt, info, param="prompt")
    vecs = np.asarray(await engine.embed(batch), np.float32)
    record().prompt_tokens = len(batch[0])
    return json_response(OllamaEmbeddingsResponse(vecs[0].tolist()))
