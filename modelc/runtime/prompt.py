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

Sampling defaults (:class:`SamplingDefaults`): a request's value, else the model's
recommendation (GGUF ``general.sampling.*``, HF ``generation_config.json``), else the
server's configuration, else llama-server's defaults.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from modelc.errors import UnsupportedError, UsageError
from modelc.formats.ir import TokenizerSpec
from modelc.runtime.chat_template import render_chat
from modelc.runtime.gemma4_turns import gemma4_tool_turns
from modelc.runtime.prompt_guard import ControlGuard, strings
from modelc.runtime.prompt_media import encode_around, images_of, part_text
from modelc.runtime.sampling import FURTHER_SAMPLERS, SamplingParams
from modelc.runtime.template_caps import adapt, extra_context
from modelc.runtime.tokenizer import Tokenizer

__all__ = [
    "LLAMA_SERVER_DEFAULTS",
    "ChatPrompt",
    "PromptFormat",
    "SamplingDefaults",
    "model_sampling",
]

# llama-server's defaults (common/common.h, common_params_sampling)
LLAMA_SERVER_DEFAULTS: dict[str, float | int] = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "repetition_penalty": 1.0,
    "repeat_last_n": 64,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
SAMPLING_FIELDS = tuple(LLAMA_SERVER_DEFAULTS)
DEFAULT_MAX_TOKENS = 4096  # a request without max_tokens stops at end of turn or here
# GGUF general.sampling.* keys -> SamplingParams fields
GGUF_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
    "general.sampling.penalty_last_n": "repeat_last_n",
}
_VALID: dict[str, Any] = {
    "temperature": lambda v: 0 <= v <= 10,
    "top_k": lambda v: v >= 0 and float(v).is_integer(),
    "top_p": lambda v: 0 < v <= 1,
    "min_p": lambda v: 0 <= v <= 1,
    "repetition_penalty": lambda v: 0 < v <= 10,
    "repeat_last_n": lambda v: v >= 0 and float(v).is_integer(),
    "presence_penalty": lambda v: -2 <= v <= 2,
    "frequency_penalty": lambda v: -2 <= v <= 2,
}
_INTEGER = {"top_k", "repeat_last_n"}


def _clean(values: Mapping[str, Any]) -> dict[str, float | int]:
    """The valid sampling settings among ``values`` (others are ignored)."""
    out: dict[str, float | int] = {}
    for k, v in values.items():
        if k not in _VALID or isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if v != v or not _VALID[k](v):  # NaN or out of range
            continue
        out[k] = int(v) if k in _INTEGER else float(v)
    return out


def model_sampling(generation: Mapping[str, Any], metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A model's own sampling recommendation: ``generation`` (HF generation_config values,
    or what a GGUF reader put there) and any GGUF ``general.sampling.*`` metadata."""
    found = {GGUF_SAMPLING_KEYS[k]: v for k, v in metadata.items() if k in GGUF_SAMPLING_KEYS}
    found.update(generation)
    return _clean(found)


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """The sampling settings a request gets for the fields it leaves out.

    ``values`` holds every field of :data:`SAMPLING_FIELDS`; ``origin`` says where each
    came from (``model``, ``config`` or ``llama-server``).  ``max_tokens`` caps a request
    that gives no limit of its own (it still stops at the end of its turn).
    """

    values: Mapping[str, float | int]
    origin: Mapping[str, str]
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()  # stop strings every request gets (a Modelfile's PARAMETER stop)

    @classmethod
    def resolve(
        cls,
        model: Mapping[str, Any] | None = None,
        config: Mapping[str, Any] | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        stop: Sequence[str] = (),
    ) -> SamplingDefaults:
        """Model recommendation over the server's config over llama-server's defaults."""
        values: dict[str, float | int] = dict(LLAMA_SERVER_DEFAULTS)
        origin = dict.fromkeys(values, "llama-server")
        for name, layer in (("config", _clean(config or {})), ("model", _clean(model or {}))):
            values.update(layer)
            origin.update(dict.fromkeys(layer, name))
        if max_tokens < 1:
            raise UsageError(f"the default max_tokens must be at least 1, got {max_tokens}")
        return cls(values, origin, max_tokens, tuple(s for s in stop if s))

    def params(
        self,
        given: Mapping[str, Any] | None = None,
        *,
        max_tokens: int | None = None,
        stop: Sequence[str] = (),
        stop_token_ids: Iterable[int] = (),
        logit_bias: Mapping[int, float] | None = None,
        seed: int | None = None,
        logprobs: int | None = None,
    ) -> SamplingParams:
        """SamplingParams from a request's ``given`` settings (None or absent: the default).

        ``max_tokens`` None means: until the end of the turn, at most ``self.max_tokens``.
        """
        g = given or {}
        vals = {k: (g[k] if g.get(k) is not None else self.values[k]) for k in SAMPLING_FIELDS}
        further = {k: g[k] for k in FURTHER_SAMPLERS if g.get(k) is not None}
        return SamplingParams(
            temperature=float(vals["temperature"]),
            top_k=int(vals["top_k"]),
            top_p=float(vals["top_p"]),
            min_p=float(vals["min_p"]),
            repetition_penalty=float(vals["repetition_penalty"]),
            repeat_last_n=int(vals["repeat_last_n"]),
            presence_penalty=float(vals["presence_penalty"]),
            frequency_penalty=float(vals["frequency_penalty"]),
            logit_bias=dict(logit_bias or {}),
            seed=seed,
            logprobs=logprobs,
            max_tokens=max_tokens,
            stop=[s for s in (*self.stop, *stop) if s],
            stop_token_ids=list(stop_token_ids),
            **further,
        )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.values, "max_tokens": self.max_tokens}
        if self.stop:
            out["stop"] = list(self.stop)
        return out


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
        return cls(
            Tokenizer(spec), template, defaults, extra, system if isinstance(system, str) else None
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
        msgs = gemma4_tool_turns(
            self.template, [self._message(i, m) for i, m in enumerate(messages)]
        )
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
