"""``tool_choice`` ``required`` / a named function forces a call in the family's own
syntax (the grammar of :mod:`modelc.chat.grammar`), which the family's parser reads
back: SmolLM2 given each family's real template (Ollama's ``/api/create`` with
``template``) answers with a call to a tool in the list, its arguments valid for the
tool's schema, through the official ``openai`` client, streamed and not."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from modelc.chat import call_grammar, detect
from modelc.engine.api import Constraint, ConstraintKind
from modelc.engine.constraints import grammar_text
from modelc.formats.gguf import load_gguf
from modelc.runtime.tokenizer import Tokenizer
from tests.assets import smollm2_gguf
from tests.peers import openai_client
from tests.server_fixtures import Server, create_from
from tests.test_chat_constraint import accepts
from tests.test_chat_formats import prompt, template
from tests.test_chat_formats_server import streamed

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
# (a short string: a tiny model may never end a long one)
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 24}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
USER = [{"role": "user", "content": "What is the weather in Paris for the next 2 days?"}]
# template -> the format its forced call is written in (detect's name)
FAMILIES = {
    "Qwen-Qwen2.5-7B-Instruct": "hermes",
    "Qwen-Qwen3-0.6B": "hermes",
    "Qwen3-Coder": "qwen3-coder",
    "meta-llama-Llama-3.1-8B-Instruct": "llama3",
    "mistralai-Mistral-Nemo-Instruct-2407": "mistral",
    "Mistral-Small-3.2-24B-Instruct-2506": "mistral",
    "deepseek-ai-DeepSeek-V3.1": "deepseek",
    "GLM-4.6": "glm-4.5",
    "moonshotai-Kimi-K2": "kimi-k2",
    "ibm-granite-granite-3.3-2B-Instruct": "granite",
    "meetkai-functionary-medium-v3.1": "functionary-v3.1",
    "openai-gpt-oss-120b": "gpt-oss",
}


def model(name: str) -> str:
    return name.lower().replace(".", "-")


@pytest.fixture(scope="module")
def srv(templates_server: Server) -> Server:
    """The shared SmolLM2 server, with ``smol`` under each family's template too."""
    for name in FAMILIES:
        create_from(templates_server, model(name), template(name))
    return templates_server


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_grammar_written_for_the_family(name: str) -> None:
    """Each family has a grammar (not the bare-JSON fallback) that llguidance compiles."""
    fmt = detect(template(name))
    assert fmt.name == FAMILIES[name]
    plain = [{"name": n, "parameters": s} for n, s in SCHEMAS.items()]
    grammar = call_grammar(fmt, template(name), plain)
    assert grammar is not None
    assert grammar_text(Constraint(ConstraintKind.GRAMMAR, grammar))


def check(calls: list[tuple[str, Any]], names: set[str]) -> None:
    assert len(calls) == 1, calls
    fn, args = calls[0]
    assert fn in names
    jsonschema.validate(args, SCHEMAS[fn])


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_required_call_in_the_family_syntax(srv: Server, name: str) -> None:
    client = openai_client(srv)
    kw: dict[str, Any] = {
        "model": model(name),
        "messages": USER,
        "tools": TOOLS,
        "tool_choice": "required",
        "max_tokens": 120,
        "temperature": 0,
        # thinking off (a trace the prompt opens comes first, and a tiny model may
        # never close it)
        "extra_body": {"chat_template_kwargs": {"enable_thinking": False}},
    }
    r = client.chat.completions.create(**kw).choices[0]
    assert r.finish_reason == "tool_calls", r.message
    calls = [
        (t.function.name, json.loads(t.function.arguments)) for t in r.message.tool_calls or []
    ]
    check(calls, set(SCHEMAS))
    _, _, streamed_calls, finish = streamed(client, **kw)
    assert finish == "tool_calls" and streamed_calls == calls  # greedy: the same call
    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(**{**kw, "tool_choice": named}).choices[0]
    calls = [
        (t.function.name, json.loads(t.function.arguments)) for t in r.message.tool_calls or []
    ]
    check(calls, {"get_time"})


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    spec = load_gguf(smollm2_gguf()).tokenizer
    assert spec is not None
    return Tokenizer(spec)


CALL = '<tool_call>\n{"name":"get_time","arguments":{"zone":"CET"}}\n</tool_call>'
CODER = "<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call>"


@pytest.mark.parametrize(
    ("name", "kw", "text", "ok"),
    [
        ("Qwen-Qwen3-0.6B", {}, CALL, True),
        ("Qwen-Qwen3-0.6B", {}, "<think>\nTime.\n</think>\n\n" + CALL, True),  # may think
        ("Qwen-Qwen3-0.6B", {"enable_thinking": False}, "<think>\nx\n</think>\n\n" + CALL, False),
        ("Qwen-Qwen3-0.6B", {}, CALL.replace("CET", "C" * 25), False),  # maxLength
        ("Qwen-Qwen3-0.6B", {}, CALL.replace("get_time", "get_date"), False),
        ("Qwen3.5-4B", {}, "Time.\n</think>\n\n" + CODER, True),  # the prompt opened it
        ("Qwen3.5-4B", {}, CODER, False),  # ... so it comes first
        ("Qwen3.5-4B", {"enable_thinking": False}, CODER, True),
        ("Qwen3.5-4B", {"enable_thinking": False}, CODER.replace("CET", ""), False),  # required
    ],
)
def test_known_texts(tok: Tokenizer, name: str, kw: dict[str, Any], text: str, ok: bool) -> None:
    """The grammar of a call to ``get_time`` takes exactly the family's call (after the
    trace the prompt leaves open or allows), checked over SmolLM2's tokens."""
    fmt = detect(template(name))
    tools = [{"name": "get_time", "parameters": TIME}]
    grammar = call_grammar(fmt, template(name), tools, prompt=prompt(name, **kw))
    assert grammar is not None
    assert accepts(tok, Constraint(ConstraintKind.GRAMMAR, grammar), text) is ok
