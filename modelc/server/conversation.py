"""A conversation and its tools as every chat-like route prepares them.

``/v1/chat/completions``, ``/v1/messages`` and ``/v1/responses`` each turn their own
message shapes into OpenAI-style chat messages, then come here: the tools offered
(none for ``tool_choice: none``), the prompt ids from the engine's prompt format, and
the constraint that makes a required or named call always well formed; then
:func:`answer`: the constraint on the answer and the reader of it in the model's own
format (trace, answer, calls).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modelc.engine.api import Constraint, ConstraintKind
from modelc.server import tools as tooling
from modelc.server.errors import ParamError
from modelc.server.generation import template_prompt
from modelc.server.schemas import Tool, ToolChoice
from modelc.server.state import ModelInfo


@dataclass(slots=True)
class ChatPrompt:
    text: str  # the prompt's text (a trace it opens is read with its marker)
    ids: list[int]  # the prompt's token ids
    tools: list[Tool] | None  # the tools offered to the model (None: none)
    forced: tooling.ForcedCall | None  # a call forced by tool_choice (None: free text)


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
    return ChatPrompt(prompt.text, prompt.ids, offered, forced)


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
