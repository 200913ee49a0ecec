"""A conversation and its tools as every chat-like route prepares them.

``/v1/chat/completions``, ``/v1/messages`` and ``/v1/responses`` each turn their own
message shapes into OpenAI-style chat messages, then come here: the tools offered
(none for ``tool_choice: none``), the prompt ids from the engine's prompt format, and
the constraint that makes a required or named call always well formed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modelc.engine.api import Constraint
from modelc.server import tools as tooling
from modelc.server.errors import ParamError
from modelc.server.generation import template_prompt
from modelc.server.schemas import Tool, ToolCallOut, ToolChoice
from modelc.server.state import ModelInfo


@dataclass(slots=True)
class ChatPrompt:
    text: str  # the prompt's text (a trace it opens is read with its marker)
    ids: list[int]  # the prompt's token ids
    tools: list[Tool] | None  # the tools offered to the model (None: none)
    constraint: Constraint | None  # a forced call's constraint (None: free text)


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
    constraint = tooling.choice_constraint(offered, choice) if offered else None
    return ChatPrompt(prompt.text, prompt.ids, offered, constraint)


@dataclass(slots=True)
class CallHold:
    """Streamed text held back while it may still be a tool call (``active``: tools
    were offered); the Messages and Responses renderers stream through one."""

    active: bool = False
    held: str = ""

    def feed(self, text: str) -> str:
        """The text to send now ("" while what was held may still be a call)."""
        if not self.active:
            return text
        self.held += text
        if tooling.may_be_call(self.held):
            return ""
        self.active = False
        text, self.held = self.held, ""
        return text

    def end(self, text: str) -> tuple[str, list[ToolCallOut]]:
        """At the end of the text: what is still to send, and the calls in what was held."""
        held, self.held = self.held + text, ""
        if not self.active or not held:
            return held, []
        content, calls = tooling.parse_tool_calls(held)
        return ((content or "") if calls else held), calls
