"""Anthropic Messages: ``/v1/messages`` and ``/v1/messages/count_tokens``.

A conversation in Anthropic's blocks becomes OpenAI-style chat messages (``tool_use``
blocks an assistant's ``tool_calls``, ``tool_result`` blocks ``tool`` messages, the
``system`` text a system message, ``thinking`` blocks the turn's ``reasoning_content``),
so the prompt is the one the chat route builds for the same conversation.  Errors on
these routes come in Anthropic's shape (:func:`~modelc.server.errors.error_shape`);
``x-api-key`` is accepted as well as ``Authorization: Bearer``.
"""

from __future__ import annotations

import json
from typing import Any

from quart import Blueprint, Response

from modelc.server.anthropic.render import MessagesRenderer
from modelc.server.anthropic.schemas import (
    AnthropicTool,
    AnthropicToolChoice,
    CountTokensRequest,
    CountTokensResponse,
    ImageBlock,
    MessageParam,
    MessagesRequest,
    System,
    TextBlock,
    ThinkingBlock,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
)
from modelc.server.context import body, ctx, json_response, use_model
from modelc.server.conversation import ChatPrompt, answer, chat_prompt, reasoning_budget
from modelc.server.generation import make_requests, new_id, respond, sampling, submit_all
from modelc.server.image_urls import fetch_image_urls
from modelc.server.images import place_images
from modelc.server.schemas import (
    FunctionDef,
    NamedFunction,
    NamedToolChoice,
    Sampling,
    Tool,
    ToolChoice,
)
from modelc.server.state import ModelInfo

bp = Blueprint("anthropic", __name__)


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "\n".join(b.text for b in content)


def chat_messages(system: System | None, messages: list[MessageParam]) -> list[dict[str, Any]]:
    """Anthropic's conversation as OpenAI-style chat messages (tool results first, as
    Anthropic puts them first in a user turn)."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": _text(system)})
    for m in messages:
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        texts: list[str] = []
        parts: list[dict[str, Any]] = []  # text and images in order, when there are images
        calls: list[dict[str, Any]] = []
        thinking: list[str] = []
        for b in m.content:
            if isinstance(b, TextBlock):
                texts.append(b.text)
                parts.append({"type": "text", "text": b.text})
            elif isinstance(b, ImageBlock):  # as an OpenAI image_url part (server.images)
                src = b.source
                url = src.url or f"data:{src.media_type or 'image/png'};base64,{src.data or ''}"
                parts.append({"type": "image_url", "image_url": {"url": url}})
            elif isinstance(b, ThinkingBlock):
                thinking.append(b.thinking)
            elif isinstance(b, ToolUseBlock):
                args = json.dumps(b.input, ensure_ascii=False)
                calls.append(
                    {
                        "id": b.id,
                        "type": "function",
                        "function": {"name": b.name, "arguments": args},
                    }
                )
            elif isinstance(b, ToolResultBlock):
                out.append(
                    {"role": "tool", "tool_call_id": b.tool_use_id, "content": _text(b.content)}
                )
        images = len(parts) > len(texts)
        if texts or calls or thinking or images:
            content = parts if images else ("\n".join(texts) if texts else None)
            msg: dict[str, Any] = {"role": m.role, "content": content}
            if calls:
                msg["tool_calls"] = calls
            if thinking:  # back into the template, as llama.cpp passes reasoning_content
                msg["reasoning_content"] = "\n".join(thinking)
            out.append(msg)
    return out


def _tools(tools: list[AnthropicTool] | None) -> list[Tool] | None:
    if not tools:
        return None
    return [
        Tool(
            type="function",
            function=FunctionDef(name=t.name, description=t.description, parameters=t.input_schema),
        )
        for t in tools
    ]


def _choice(choice: AnthropicToolChoice | None) -> ToolChoice | None:
    """Anthropic's ``tool_choice`` as the chat route's: any -> required, tool -> named."""
    if choice is None:
        return None
    if isinstance(choice, ToolChoiceAny):
        return "required"
    if isinstance(choice, ToolChoiceTool):
        return NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    if isinstance(choice, ToolChoiceNone):
        return "none"
    return "auto"


def _thinking(thinking: dict[str, Any] | None) -> dict[str, Any]:
    """Anthropic's ``thinking`` as the template's ``enable_thinking`` (unset: the
    template's own choice)."""
    kind = (thinking or {}).get("type")
    return {"enable_thinking": kind == "enabled"} if kind in ("enabled", "disabled") else {}


async def _prompt(info: ModelInfo, req: CountTokensRequest) -> ChatPrompt:
    conversation = chat_messages(req.system, req.messages)
    conversation = await fetch_image_urls(conversation, ctx().state.allow_image_urls)
    return chat_prompt(
        info,
        conversation,
        _tools(req.tools),
        _choice(req.tool_choice),
        template_kwargs=_thinking(req.thinking),
    )


@bp.post("/v1/messages")
async def messages() -> Response:
    req = await body(MessagesRequest)
    info, engine = await use_model(req.model, "text")
    prompt = await _prompt(info, req)
    stops = list(req.stop_sequences or [])
    given = Sampling(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, stop=stops)
    params = sampling(info, given, max_tokens=req.max_tokens)
    mid = new_id("msg")
    constraint, reader = answer(info, prompt, grammar=req.grammar)
    budget = (req.thinking or {}).get("budget_tokens")  # {"type": "enabled", "budget_tokens": N}
    tokens = budget if isinstance(budget, int) and not isinstance(budget, bool) else None
    params.reasoning_budget = reasoning_budget(info, reader, ctx().state, tokens)
    ids, images = await place_images(info, engine, prompt.ids, prompt.media, prompt.images)
    reqs = make_requests(mid, ids, params, 1, constraint, images=images)
    handles = submit_all(engine, reqs, prompt_param="messages")
    r = MessagesRenderer(mid, info.model_id, len(ids), reader=reader, stops=stops)
    return await respond(handles, r, stream=req.stream, n_prompt=len(ids))


@bp.post("/v1/messages/count_tokens")
async def count_tokens() -> Response:
    req = await body(CountTokensRequest)
    info, engine = await use_model(req.model, "text")
    prompt = await _prompt(info, req)
    ids, _ = await place_images(info, engine, prompt.ids, prompt.media, prompt.images)
    return json_response(CountTokensResponse(input_tokens=len(ids)))
