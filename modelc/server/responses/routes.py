"""OpenAI Responses: ``/v1/responses``.

Input (a string, or message / ``function_call`` / ``function_call_output`` items) and
``instructions`` become the chat route's messages, so the prompt is the one
``/v1/chat/completions`` builds for the same conversation; a ``reasoning`` item's
trace is the next assistant turn's ``reasoning_content``.  A response made with ``store`` on (the default) is kept in
a bounded in-memory store (:mod:`.store`): ``previous_response_id`` continues its
conversation, ``GET`` / ``DELETE /v1/responses/{id}`` read and forget it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from quart import Blueprint, Response

from modelc.engine.api import Constraint, ConstraintKind
from modelc.errors import ModelcError
from modelc.server.context import body, ctx, json_response, use_model
from modelc.server.conversation import answer, chat_prompt, reasoning_budget
from modelc.server.errors import ParamError
from modelc.server.generation import make_requests, respond, sampling, submit_all
from modelc.server.image_urls import fetch_image_urls
from modelc.server.images import place_images
from modelc.server.responses.render import ResponsesRenderer, item_id
from modelc.server.responses.schemas import (
    Deleted,
    FunctionChoice,
    InputImage,
    InputItem,
    Parts,
    Reasoning,
    Refusal,
    ResponseObject,
    ResponsesRequest,
    TextConfig,
    TextFormat,
)
from modelc.server.responses.store import CAPACITY
from modelc.server.schemas import (
    FunctionDef,
    NamedFunction,
    NamedToolChoice,
    Sampling,
    Tool,
    ToolChoice,
)
from modelc.vision import ImageError

bp = Blueprint("responses", __name__)


class NotFound(ModelcError):
    """No stored response has this id."""

    http_status = 404
    error_type = "invalid_request_error"

    def __init__(self, rid: str) -> None:
        super().__init__(
            f"no stored response with id {rid!r} (responses are kept in memory, the last {CAPACITY})"
        )


def _text(content: str | Parts) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        p.refusal if isinstance(p, Refusal) else p.text
        for p in content
        if not isinstance(p, InputImage)
    )


def _content(content: str | Parts, where: str) -> str | list[dict[str, Any]]:
    """A message item's content: its text, or with images OpenAI-style parts."""
    if isinstance(content, str) or not any(isinstance(p, InputImage) for p in content):
        return _text(content)
    parts: list[dict[str, Any]] = []
    for k, p in enumerate(content):
        if isinstance(p, InputImage):
            if not p.image_url:
                raise ImageError("an input_image needs an image_url (a data URL)", param=where)
            parts.append({"type": "image_url", "image_url": {"url": p.image_url}})
        else:
            parts.append({"type": "text", "text": _text(content[k : k + 1])})
    return parts


def _trace(it: InputItem) -> str:
    """A reasoning item's trace: its ``reasoning_text`` content, else its summary's text."""
    if it.content:
        return _text(it.content)
    texts = [s.get("text") for s in it.summary or [] if isinstance(s, dict)]
    return "\n".join(t for t in texts if isinstance(t, str))


def chat_messages(
    given: str | list[InputItem], history: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The input after ``history`` (a stored conversation) as OpenAI-style chat messages
    (consecutive ``function_call`` items are one assistant turn's calls)."""
    out: list[dict[str, Any]] = [dict(m) for m in history or []]
    if isinstance(given, str):
        return [*out, {"role": "user", "content": given}]
    trace = ""  # a reasoning item's, for the assistant turn that follows it
    for j, it in enumerate(given):
        where = f"input[{j}]"
        if it.type == "reasoning":
            trace += _trace(it)
        elif it.type == "message":
            if it.role is None or it.content is None:
                raise ParamError(f"{where}: a message item needs role and content", param=where)
            out.append({"role": it.role, "content": _content(it.content, f"{where}.content")})
        elif it.type == "function_call":
            if not it.call_id or not it.name:
                raise ParamError(
                    f"{where}: a function_call item needs call_id and name", param=where
                )
            fn = {"name": it.name, "arguments": it.arguments or "{}"}
            call = {"id": it.call_id, "type": "function", "function": fn}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif it.type == "function_call_output":
            if not it.call_id or it.output is None:
                raise ParamError(
                    f"{where}: a function_call_output item needs call_id and output", param=where
                )
            out.append({"role": "tool", "tool_call_id": it.call_id, "content": _text(it.output)})
        if trace and it.type != "reasoning" and out[-1]["role"] == "assistant":
            out[-1]["reasoning_content"] = trace  # the template takes it back, as llama.cpp
            trace = ""
    return out


def _format(fmt: TextFormat | None) -> Constraint | None:
    """``text.format``'s constraint on the answer (None: free text)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return Constraint(ConstraintKind.JSON_OBJECT)
    if fmt.schema is None:
        raise ParamError(
            "text.format json_schema needs schema (a JSON Schema object)",
            param="text.format.schema",
        )
    return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(fmt.schema))


def _effort(reasoning: Reasoning | None) -> dict[str, Any]:
    """``reasoning.effort`` as template variables: ``none`` turns thinking off, a level
    is gpt-oss's ``reasoning_effort``; unset: the template's own choice."""
    effort = reasoning.effort if reasoning is not None else None
    if effort is None:
        return {}
    if effort == "none":
        return {"enable_thinking": False}
    return {"reasoning_effort": "high" if effort == "xhigh" else effort}


@bp.post("/v1/responses")
async def responses() -> Response:
    req = await body(ResponsesRequest)
    if req.background:
        raise ParamError("background responses are not supported", param="background")
    kept = ctx().responses
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        prev = kept.get(req.previous_response_id)
        if prev is None:
            raise ParamError(
                f"previous response {req.previous_response_id!r} is not stored here (only the "
                f"last {kept.capacity} with store on, until a restart); send the whole "
                "conversation as input items",
                param="previous_response_id",
            )
        history = prev.messages
    info, engine = await use_model(req.model, "text")
    tools = [
        Tool(
            type="function",
            function=FunctionDef(
                name=t.name, description=t.description, parameters=t.parameters, strict=t.strict
            ),
        )
        for t in req.tools or []
    ]
    choice: ToolChoice | None = (
        NamedToolChoice(type="function", function=NamedFunction(name=req.tool_choice.name))
        if isinstance(req.tool_choice, FunctionChoice)
        else req.tool_choice
    )
    conversation = chat_messages(req.input, history)
    conversation = await fetch_image_urls(conversation, ctx().state.allow_image_urls)
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    kwargs = _effort(req.reasoning)
    prompt = chat_prompt(
        info, [*system, *conversation], tools or None, choice, template_kwargs=kwargs
    )
    text = req.text or TextConfig()
    constraint, reader = answer(
        info,
        prompt,
        grammar=req.grammar,
        answer_format=_format(text.format),
        parallel=req.parallel_tool_calls is not False,
    )
    given = Sampling(temperature=req.temperature, top_p=req.top_p)
    params = sampling(info, given, max_tokens=req.max_output_tokens)
    params.reasoning_budget = reasoning_budget(info, reader, ctx().state)  # the server's
    rid = item_id("resp")
    ids, images = await place_images(info, engine, prompt.ids, prompt.media, prompt.images)
    reqs = make_requests(rid, ids, params, 1, constraint, images=images)
    handles = submit_all(engine, reqs, prompt_param="input")
    base = ResponseObject(
        id=rid,
        created_at=int(time.time()),
        status="in_progress",
        model=info.model_id,
        output=[],
        usage=None,
        incomplete_details=None,
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        tools=list(req.tools or []),
        tool_choice=req.tool_choice or "auto",
        parallel_tool_calls=req.parallel_tool_calls is not False,
        text=TextConfig(format=text.format or TextFormat()),
        reasoning=req.reasoning,
        metadata=req.metadata or {},
        previous_response_id=req.previous_response_id,
        store=req.store is not False,
    )

    def keep(resp: ResponseObject) -> None:
        if req.store is not False:
            kept.put(resp, conversation)

    r = ResponsesRenderer(base, len(ids), reader=reader, keep=keep)
    return await respond(handles, r, stream=req.stream, n_prompt=len(ids))


@bp.get("/v1/responses/<response_id>")
async def get_response(response_id: str) -> Response:
    found = ctx().responses.get(response_id)
    if found is None:
        raise NotFound(response_id)
    return json_response(found.response)


@bp.delete("/v1/responses/<response_id>")
async def delete_response(response_id: str) -> Response:
    if not ctx().responses.delete(response_id):
        raise NotFound(response_id)
    return json_response(Deleted(id=response_id))
