"""Ollama's ``/api/generate``, ``/api/chat``, ``/api/embed`` and ``/api/tags``.

Streaming is newline-delimited JSON (Ollama's default ``stream: true``); ``options``
map onto the same sampling settings as the OpenAI endpoints, with the model's defaults
where a request gives none.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
from quart import Blueprint, Response

from modelc.engine.api import Constraint, ConstraintKind, Engine, FinishEvent, TokenEvent
from modelc.runtime.sampling import SamplingParams
from modelc.server import sse
from modelc.server import tools as tooling
from modelc.server.context import body, ctx, json_response, record
from modelc.server.generation import (
    FINISH,
    Outcome,
    chat_ids,
    embed_inputs,
    make_requests,
    new_id,
    respond,
    sampling,
    submit_all,
    text_ids,
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
    OllamaShowDetails,
    OllamaShowRequest,
    OllamaShowResponse,
    OllamaTags,
    OllamaToolCall,
)
from modelc.server.state import ModelInfo

bp = Blueprint("ollama", __name__)


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _sampling(o: OllamaOptions | None, info: ModelInfo) -> SamplingParams:
    o = o or OllamaOptions()
    limit = None if o.num_predict is None or o.num_predict < 0 else o.num_predict
    return sampling(
        info,
        o,
        max_tokens=limit,
        repetition_penalty=o.repeat_penalty,
        stop=list(o.stop or []),
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


Chunk = OllamaGenerateChunk | OllamaChatChunk


@dataclass(slots=True)
class OllamaRenderer:
    """NDJSON chunks, or the final chunk alone with the whole text.

    ``chunk(text, finish, ids)`` builds a chunk; ``finish`` is None until the last one,
    which also gets every token id generated (for ``/api/generate``'s ``context``).
    """

    chunk: Callable[[str, FinishEvent | None, list[int]], Chunk]
    headers: dict[str, str] = field(default_factory=lambda: sse.NDJSON_HEADERS)
    ping: bytes | None = None
    _ids: list[int] = field(default_factory=list)

    def start(self, i: int) -> list[bytes]:
        return []

    def token(self, i: int, ev: TokenEvent) -> list[bytes]:
        self._ids.append(ev.token_id)
        return [sse.ndjson(self.chunk(ev.text, None, []))] if ev.text else []

    def finish(self, i: int, ev: FinishEvent) -> list[bytes]:
        return [sse.ndjson(self.chunk(ev.text, ev, self._ids))]

    def end(self) -> list[bytes]:
        return []

    def body(self, outs: list[Outcome]) -> Chunk:
        o = outs[0]
        return self.chunk(o.text, o.finish, [t.token_id for t in o.tokens])


async def _answer(
    req: OllamaGeneration,
    info: ModelInfo,
    engine: Engine,
    ids: list[int],
    prefix: str,
    r: OllamaRenderer,
) -> Response:
    reqs = make_requests(new_id(prefix), ids, _sampling(req.options, info), 1, _format(req.format))
    return await respond(submit_all(engine, reqs), r, stream=req.stream, n_prompt=len(ids))


@bp.post("/api/generate")
async def generate() -> Response:
    c = ctx()
    req = await body(OllamaGenerateRequest)
    info, engine = c.state.serve(req.model, "text")
    if req.raw or not info.chat_template:
        text = (f"{req.system}\n\n" if req.system else "") + req.prompt
        ids = text_ids(info, text)
    else:
        msgs: list[dict[str, Any]] = (
            [{"role": "system", "content": req.system}] if req.system else []
        )
        msgs.append({"role": "user", "content": req.prompt})
        ids = chat_ids(info, msgs)

    def chunk(text: str, f: FinishEvent | None, out: list[int]) -> OllamaGenerateChunk:
        context = [*ids, *out] if f is not None else None
        return OllamaGenerateChunk(
            req.model, _now(), text, f is not None, **_done_fields(f), context=context
        )

    return await _answer(req, info, engine, ids, "gen", OllamaRenderer(chunk))


@bp.post("/api/chat")
async def chat() -> Response:
    c = ctx()
    req = await body(OllamaChatRequest)
    info, engine = c.state.serve(req.model, "text")
    msgs: list[Any] = list(req.messages) or [{"role": "user", "content": ""}]
    ids = chat_ids(info, msgs, req.tools)
    tool_calls = bool(req.tools) and not req.stream  # streamed text is relayed as it comes

    def chunk(text: str, f: FinishEvent | None, out: list[int]) -> OllamaChatChunk:
        msg = _reply(text, tool_calls)
        return OllamaChatChunk(req.model, _now(), msg, f is not None, **_done_fields(f))

    return await _answer(req, info, engine, ids, "chat", OllamaRenderer(chunk))


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


def _modified(info: ModelInfo) -> str:
    return datetime.fromtimestamp(info.created, UTC).isoformat().replace("+00:00", "Z")


def _size(info: ModelInfo) -> str:
    return f"{info.n_params / 1e6:.0f}M" if info.n_params < 1e9 else f"{info.n_params / 1e9:.1f}B"


@bp.get("/api/tags")
async def tags() -> Response:
    info = ctx().state.model()
    details = OllamaModelDetails("modelc", info.architecture, _size(info), info.quantization)
    model = OllamaModel(info.model_id, info.model_id, _modified(info), info.file_size, "", details)
    return json_response(OllamaTags([model]))


# Modelfile PARAMETER names of the sampling defaults (Ollama's spelling)
_PARAMETERS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repetition_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


@bp.post("/api/show")
async def show() -> Response:
    """The model's details, template and the sampling defaults in effect (``parameters``)."""
    req = await body(OllamaShowRequest)
    info = ctx().state.check_model(req.model or req.name)
    fmt = info.prompt
    lines = []
    if fmt is not None:
        d = fmt.defaults
        lines = [f"{_PARAMETERS[k]:<30} {v}" for k, v in d.values.items()]
        lines.append(f"{'num_predict':<30} {d.max_tokens}")
        lines += [
            f"{'stop':<30} {json.dumps(fmt.tokenizer.tokens[i])}" for i in sorted(fmt.eog_ids)
        ]
    params = "\n".join(lines)
    template = info.chat_template or ""
    modelfile = "\n".join(
        [f"# Modelfile of {info.model_id} (modelc)", f"FROM {info.path}"]
        + ([f'TEMPLATE """{template}"""'] if template else [])
        + [f"PARAMETER {line}" for line in lines]
    )
    details = OllamaShowDetails(
        "", "modelc", info.architecture, [info.architecture], _size(info), info.quantization
    )
    model_info: dict[str, Any] = {
        "general.architecture": info.architecture,
        "general.parameter_count": info.n_params,
        f"{info.architecture}.context_length": info.n_ctx,
        f"{info.architecture}.vocab_size": info.n_vocab,
    }
    return json_response(
        OllamaShowResponse(
            modelfile, params, template, details, model_info, info.capabilities(), _modified(info)
        )
    )
