"""How one model's text becomes token ids and back: the rules every entry point shares.

:class:`PromptFormat` holds the model's tokenizer, chat template, end-of-generation ids
and sampling defaults.  The engine builds one per model and every entry point (the
OpenAI, Ollama, llama.cpp-style and native routes, the chat page, ``modelc generate``)
goes through it, so they cannot disagree about a prompt.

Chat prompts (:meth:`PromptFormat.chat`) follow llama.cpp's server:

* the template renders the messages (developer -> system, text content parts joined
  by newlines, a final assistant message is continued rather than closed);
* control tokens the *template* writes (``<|im_start|>``...) become their special ids;
  BOS is added when the tokenizer says so (a template's own leading BOS text is then
  dropped, so it is never there twice);
* text the *client* sent stays text: a message containing ``<|im_end|>`` is tokenized
  as those characters and cannot end its own turn.  (llama.cpp's server parses such
  text as the control token; here the control texts in message fields are marked
  before rendering and tokenized as plain text after it.)

Raw prompts (:meth:`PromptFormat.encode`) parse special tokens, as llama.cpp's
``/completion`` and ``/v1/completions`` do: a client writing its own template gets it.

Sampling defaults: :mod:`modelc.runtime.sampling_defaults` (re-exported here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from modelc.errors import UnsupportedError, UsageError
from modelc.formats.ir import TokenizerSpec
from modelc.runtime.chat_template import render_chat
from modelc.runtime.gemma4_turns import gemma4_tool_turns
from modelc.runtime.prompt_guard import ControlGuard, strings
from modelc.runtime.prompt_media import encode_around, images_of, part_text
from modelc.runtime.sampling_defaults import (
    DEFAULT_MAX_TOKENS,
    LLAMA_SERVER_DEFAULTS,
    SAMPLING_FIELDS,
    SamplingDefaults,
    model_sampling,
)
from modelc.runtime.template_caps import adapt, extra_context
from modelc.runtime.tokenizer import Tokenizer

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "LLAMA_SERVER_DEFAULTS",
    "SAMPLING_FIELDS",
    "ChatPrompt",
    "PromptFormat",
    "SamplingDefaults",
    "model_sampling",
]


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A rendered conversation: the template's text and the ids the model is fed; with
    images, each one's bytes and the index of the id it goes before (``modelc.vision``)."""

    text: str
    ids: list[int]
    media: tuple[int, ...] = ()
    images: tuple[bytes, ...] = ()


# fill-in-the-middle control tokens (prefix, suffix, middle) of the families that have them
FIM_TEXTS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, Granite
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, Refact
    ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
    ("▁<PRE>", "▁<SUF>", "▁<MID>"),  # CodeLlama
    ("<PRE>", "<SUF>", "<MID>"),
)

# tool offering for templates that do not take ``tools`` (Hermes style, as SmolLM2 and
# Qwen were trained); the model answers with <tool_call>{...}</tool_call>
HERMES_PROMPT = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user query. "
    "Don't make assumptions about what values to plug into functions. Here are the available "
    "tools: <tools> {tools} </tools> For each function call return a json object with function "
    "name and arguments within <tool_call></tool_call> XML tags as follows:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-dict>}}\n</tool_call>'
)


# template variables the renderer sets itself (not overridable by chat_template_kwargs)
_TEMPLATE_NAMES = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
)


def _tool(t: Mapping[str, Any]) -> dict[str, Any]:
    fn = t.get("function")
    if not isinstance(fn, Mapping):
        return dict(t)
    return {
        "type": "function",
        "function": {
            "name": fn.get("name", ""),
            "description": fn.get("description") or "",
            "parameters": fn.get("parameters") or {},
        },
    }


def _call_text(calls: Sequence[Mapping[str, Any]]) -> str:
    return "\n".join(
        "<tool_call>\n"
        + json.dumps(
            {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
            ensure_ascii=False,
        )
        + "\n</tool_call>"
        for c in calls
    )


@dataclass(slots=True)
class PromptFormat:
    """The model's tokenizer, chat template, end-of-generation ids and sampling defaults."""

    tokenizer: Tokenizer
    template: str | None = None
    defaults: SamplingDefaults = field(default_factory=SamplingDefaults.resolve)
    extra_stop_ids: frozenset[int] = frozenset()
    system: str | None = None  # the system message of a conversation that has none
    # the conversation every chat starts with (Ollama's MESSAGE / /api/create ``messages``)
    messages: tuple[Mapping[str, Any], ...] = ()
    eog_ids: frozenset[int] = field(init=False)
    bos_text: str = field(init=False)
    eos_text: str = field(init=False)
    _control: list[str] = field(init=False)
    _breakers: dict[tuple[str, ...], list[int]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        tok = self.tokenizer
        self.eog_ids = frozenset(tok.eot_ids) | self.extra_stop_ids
        self.bos_text = self._text(tok.bos_id)
        self.eos_text = self._text(tok.eos_id)
        self._control = tok.control_texts()

    @classmethod
    def build(
        cls,
        spec: TokenizerSpec,
        template: str | None = None,
        *,
        generation: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        config: Mapping[str, Any] | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> PromptFormat:
        """From a model's tokenizer spec, chat template and metadata (``generation``:
        generation_config values; ``config``: the server's sampling settings)."""
        gen = dict(generation or {})
        stops = gen.get("stop_token_ids")
        extra = frozenset(
            i for i in (stops if isinstance(stops, list) else []) if isinstance(i, int)
        )
        texts = gen.get("stop")
        defaults = SamplingDefaults.resolve(
            model_sampling(gen, metadata or {}),
            config,
            max_tokens=max_tokens,
            stop=[t for t in (texts if isinstance(texts, list) else []) if isinstance(t, str)],
        )
        n_predict = gen.get("num_predict")  # the model's own limit (Ollama's PARAMETER)
        if isinstance(n_predict, int) and not isinstance(n_predict, bool) and n_predict > 0:
            defaults = dataclasses.replace(defaults, max_tokens=n_predict)
        system = gen.get("system")
        given = gen.get("messages")
        opening = tuple(m for m in given if isinstance(m, dict)) if isinstance(given, list) else ()
        return cls(
            Tokenizer(spec),
            template,
            defaults,
            extra,
            system if isinstance(system, str) else None,
            opening,
        )

    def breaker_ids(self, breakers: Sequence[str]) -> list[int]:
        """DRY's sequence breakers as token ids: every token whose text contains one of
        ``breakers`` (llama.cpp's single-token breakers; cached per list)."""
        key = tuple(breakers)
        if key not in self._breakers:
            texts = [b.encode() for b in key if b]
            tok = self.tokenizer
            self._breakers[key] = [
                i for i in range(tok.n_vocab) if any(b in tok.token_to_piece(i) for b in texts)
            ]
        return self._breakers[key]

    def _text(self, i: int | None) -> str:
        tok = self.tokenizer
        return tok.tokens[i] if i is not None and 0 <= i < tok.n_vocab else ""

    # -- raw prompts ----------------------------------------------------------------
    def encode(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        """A raw prompt's ids, as llama.cpp tokenizes a completion prompt."""
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def infill(self, prefix: str, suffix: str) -> list[int]:
        """Fill-in-the-middle ids (llama.cpp's PSM order): [BOS] PRE prefix SUF suffix MID."""
        tok = self.tokenizer
        ids = {t: i for i, t in enumerate(tok.tokens)}
        for pre, suf, mid in FIM_TEXTS:
            if pre in ids and suf in ids and mid in ids:
                out = [tok.bos_id] if tok.adds_bos and tok.bos_id is not None else []
                out += [ids[pre], *tok.encode(prefix, add_special=False)]
                out += [ids[suf], *tok.encode(suffix, add_special=False), ids[mid]]
                return out
        raise UnsupportedError(
            "this model has no fill-in-the-middle tokens (prefix/suffix/middle), so it cannot "
            "infill; use a code model that has them (Qwen2.5-Coder, StarCoder, CodeLlama...)",
            param="suffix",
        )

    # -- chat -----------------------------------------------------------------------
    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final: bool | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> ChatPrompt:
        """The prompt for a conversation (see the module docstring for the rules).

        A final assistant message is continued rather than closed when
        ``continue_final`` (default: when a generation prompt is asked for).
        ``template_kwargs``: extra template variables (``chat_template_kwargs``:
        ``enable_thinking``, ``reasoning_effort``...); ``enable_thinking`` is true unless
        given, as llama.cpp's server renders.

        ``messages``: dicts with ``role``, ``content`` (a string, or a list of
        ``{"type": "text", "text": ...}`` parts), and optionally ``name``,
        ``tool_calls`` (OpenAI shape; arguments as a JSON text or an object) and
        ``tool_call_id``.  ``tools``: OpenAI tool objects.
        """
        given = [self._message(i, m) for i, m in enumerate(messages)]
        if self.messages:  # the model's opening turns, after the request's system messages
            k0 = next((k for k, m in enumerate(given) if m["role"] != "system"), len(given))
            given[k0:k0] = [self._message(i, m) for i, m in enumerate(self.messages)]
        msgs = gemma4_tool_turns(self.template, given)
        if self.system and not any(m["role"] == "system" for m in msgs):
            msgs.insert(0, {"role": "system", "content": self.system})
        tool_list = [dict(t) for t in tools] if tools else None
        if tool_list and not self._template_has("tools"):
            offer = HERMES_PROMPT.format(tools=json.dumps(tool_list, ensure_ascii=False))
            if msgs and msgs[0]["role"] == "system":
                msgs[0] = {**msgs[0], "content": f"{msgs[0]['content']}\n\n{offer}"}
            else:
                msgs.insert(0, {"role": "system", "content": offer})
            tool_list = None
        elif tool_list:  # as llama.cpp hands them to a template: name, description, parameters
            tool_list = [_tool(t) for t in tool_list]
        prefill = ""
        last = msgs[-1] if msgs else None
        if continue_final is None:
            continue_final = add_generation_prompt
        if (
            continue_final
            and last is not None
            and last["role"] == "assistant"
            and not last.get("tool_calls")
            and len(msgs) > 1
        ):  # continue the final assistant message (llama.cpp's assistant prefill)
            prefill = str(last["content"])
            msgs = msgs[:-1]
        msgs = adapt(self.template, msgs)  # as llama.cpp reshapes them for this template
        guard = ControlGuard(self._control, [*strings(msgs), prefill], self.template or "")
        clash = sorted(set(template_kwargs or {}) & _TEMPLATE_NAMES)
        if clash:
            raise UsageError(
                f"chat_template_kwargs may not set {clash[0]!r}; the server sets it",
                param="chat_template_kwargs",
            )
        extra = {**extra_context(), "enable_thinking": True, **(template_kwargs or {})}
        text = self._render(
            guard.protect(msgs), tool_list, add_generation_prompt or bool(prefill), extra
        )
        text += guard.protect(prefill)
        add_bos = self.tokenizer.adds_bos
        if add_bos and self.bos_text and text.startswith(self.bos_text):
            text = text[len(self.bos_text) :]  # the tokenizer adds it: never twice
        images = images_of(messages)
        ids, at = encode_around(
            lambda t: self.tokenizer.encode(
                t, add_special=False, parse_special=True, literals=guard.originals
            ),
            text,
            len(images),
        )
        if add_bos and self.tokenizer.bos_id is not None:
            ids.insert(0, self.tokenizer.bos_id)
            at = tuple(a + 1 for a in at)
        return ChatPrompt(guard.restore(text), ids, at, images)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final: bool | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of a conversation (llama.cpp's ``/apply-template``)."""
        return self.chat(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            continue_final=continue_final,
            template_kwargs=template_kwargs,
        ).text

    def _template_has(self, word: str) -> bool:
        return bool(self.template) and word in (self.template or "")

    def _message(self, i: int, m: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise UsageError(
                f"message {i} must be an object with a 'role' and 'content'", param=f"messages[{i}]"
            )
        role = m["role"]
        d: dict[str, Any] = {"role": "system" if role == "developer" else role}
        content = m.get("content")
        if isinstance(content, list):  # text parts, images as markers
            content = part_text(i, content)
        d["content"] = content if isinstance(content, str) else ""
        for key in ("name", "tool_call_id", "reasoning_content"):
            if m.get(key):
                d[key] = m[key]
        if m.get("thinking") and "reasoning_content" not in d:  # Ollama's name for it
            d["reasoning_content"] = m["thinking"]
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = c.get("function") or {}
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    with contextlib.suppress(json.JSONDecodeError):
                        args = json.loads(args)
                call = {
                    "type": "function",
                    "function": {"name": fn.get("name", ""), "arguments": args},
                }
                # the call's id: templates match a tool's result to its call by it (gemma4)
                calls.append({"id": c["id"], **call} if c.get("id") else call)
            d["tool_calls"] = calls
            if not d["content"] and not self._template_has("tool_calls"):
                d["content"] = _call_text(calls)  # the template would drop them
        return d

    def _render(
        self,
        msgs: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        extra: Mapping[str, Any],
    ) -> str:
        return render_chat(
            self.template,
            msgs,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            bos_token=self.bos_text,
            eos_token=self.eos_text,
            **extra,
        )
