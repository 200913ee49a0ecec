"""A conversation and its tools as every chat-like route prepares them.

``/v1/chat/completions``, ``/v1/messages`` and ``/v1/responses`` each turn their own
message shapes into OpenAI-style chat messages, then come here: the tools offered
(none for ``tool_choice: none``), the prompt ids from the engine's prompt format, and
the constraint that makes a required or named call always well formed; then
:func:`answer`: the constraint on the answer and the reader of it in the model's own
format (trace, answer, calls).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modelc.engine.api import Constraint, ConstraintKind
from modelc.errors import UsageError
from modelc.runtime.chat_template import render_chat
from modelc.runtime.reasoning_budget import ReasoningBudget
from modelc.server import tools as tooling
from modelc.server.errors import ParamError
from modelc.server.generation import template_prompt
from modelc.server.schemas import Tool, ToolChoice
from modelc.server.state import ModelInfo, ServerState


@dataclass(slots=True)
class ChatPrompt:
    text: str  # the prompt's text (a trace it opens is read with its marker)
    ids: list[int]  # the prompt's token ids
    tools: list[Tool] | None  # the tools offered to the model (None: none)
    forced: tooling.ForcedCall | None  # a call forced by tool_choice (None: free text)
    media: tuple[int, ...] = ()  # per image, the index of the id it goes before
    images: tuple[bytes, ...] = ()  # the images' encoded bytes (server.images places them)


def chat_prompt(
    info: ModelInfo,
    messages: Sequence[Any],
    tools: list[Tool] | None,
    choice: ToolChoice | None,
    *,
    choice_param: str = "tool_choice",
    template_kwargs: Mapping[str, Any] | None = None,
) -> ChatPrompt:
    """The prompt for ``messages`` (Structs or dicts) offering ``tools`` as ``choice``
    says (``none``: not offered; ``required`` / a named function: a call is forced);
    ``template_kwargs``: extra template variables (``enable_thinking``...)."""
    if choice is not None and choice != "none" and choice != "auto" and not tools:
        raise ParamError(f"{choice_param} requires tools", param=choice_param)
    offered = tools if tools and choice != "none" else None
    prompt = template_prompt(info, messages, offered, template_kwargs=template_kwargs)
    forced = None
    if offered:
        fmt = info.fmt()
        forced = tooling.choice_constraint(
            offered,
            choice,
            template=fmt.template,
            prompt=prompt.text,
            special=fmt.tokenizer.control_id,
        )
    return ChatPrompt(prompt.text, prompt.ids, offered, forced, prompt.media, prompt.images)


def answer(
    info: ModelInfo,
    prompt: ChatPrompt,
    *,
    grammar: str | None = None,
    answer_format: Constraint | None = None,
    reasoning: bool = True,
    parallel: bool = True,
) -> tuple[Constraint | None, tooling.OutputReader]:
    """The constraint on a chat-like answer and the reader of it: the model's format
    (a call forced by ``tool_choice`` in the family's syntax, or bare JSON); a ``grammar`` (llama.cpp's, over the
    raw output, trace and call markup included) replaces the forced call's constraint;
    a JSON ``answer_format`` is let through the model's trace first."""
    forced = None if grammar else prompt.forced
    constraint = forced.constraint if forced is not None else None
    reader = tooling.output_reader(
        info.chat_template,
        prompt.text,
        prompt.tools,
        reasoning=reasoning,
        forced=forced.fmt if forced is not None else None,
        parallel=parallel,
    )
    if grammar:
        constraint = Constraint(ConstraintKind.GRAMMAR, grammar)
    if constraint is None:
        constraint = tooling.after_trace(answer_format, reader)
    return constraint, reader


@functools.lru_cache(maxsize=32)
def end_tag(template: str | None, marker: str) -> str:
    """The end of a trace as the template writes it after an earlier turn's trace (up to
    ``marker``, blanks before it kept: Qwen3's ``\\n</think>``), as llama.cpp's
    differential parser finds it; ``marker`` when the template writes no trace."""
    turn = [
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "ANSWER-7", "reasoning_content": "TRACE-7"},
    ]
    try:
        text = render_chat(template, turn, add_generation_prompt=False, enable_thinking=True)
    except UsageError:
        return marker.strip()
    between = text.partition("TRACE-7")[2].partition("ANSWER-7")[0]
    at = between.find(marker.strip())
    return between[: at + len(marker.strip())].lstrip(" ") if at >= 0 else marker.strip()


def reasoning_budget(
    info: ModelInfo,
    reader: tooling.OutputReader,
    state: ServerState,
    tokens: int | None = None,
    message: str | None = None,
) -> ReasoningBudget | None:
    """llama.cpp's reasoning budget for this answer (:mod:`modelc.runtime.reasoning_budget`):
    ``tokens`` (None or -1: the server's ``--reasoning-budget``) after the format's start
    tag, then ``message`` and the end tag forced; None when unlimited or the format has
    no trace markers.  The generation prompt's open trace (its marker and what follows)
    is the budget's prefill, as llama.cpp feeds it the generation prompt."""
    n = state.reasoning_budget if tokens is None or tokens == -1 else tokens
    fmt = reader.fmt
    if n < 0 or fmt.think is None or fmt.channels:
        return None
    tok = info.fmt().tokenizer

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tok.encode(text, add_special=False, parse_special=True)) if text else ()

    start, end = ids(fmt.think[0].strip()), ids(end_tag(info.chat_template, fmt.think[1]))
    msg = state.reasoning_budget_message if message is None else message
    lead = ids(fmt.lead(reader.prompt))
    return ReasoningBudget(n, start, (end,), ids(msg) + end, lead, tok.incomplete_utf8_ids)
