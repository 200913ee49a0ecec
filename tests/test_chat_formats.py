"""Chat-output formats: detection from the real templates (llama.cpp's copies in
``tests/fixtures/templates``), known-answer parses of each family's forced output, and
the streaming parser held to the full parse for random chunkings."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from modelc.chat import Parsed, StreamParser, detect
from modelc.runtime.chat_template import render_chat

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]
PARIS = ("get_weather", {"city": "Paris", "days": 2})


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def prompt(name: str, **kw: Any) -> str:
    """The real template's generation prompt for one user turn."""
    msgs = [{"role": "user", "content": "hi"}]
    return render_chat(template(name), msgs, bos_token="<s>", eos_token="</s>", **kw)


@pytest.mark.parametrize(
    ("name", "family", "think"),
    [
        ("Qwen-Qwen3-0.6B", "hermes", "<think>"),
        ("Qwen-Qwen2.5-7B-Instruct", "hermes", None),
        ("Qwen3-Coder", "qwen3-coder", None),
        ("Qwen3.5-4B", "qwen3-coder", "<think>"),
        ("meta-llama-Llama-3.1-8B-Instruct", "llama3", None),
        ("meta-llama-Llama-3.2-3B-Instruct", "llama3", None),
        ("mistralai-Mistral-Nemo-Instruct-2407", "mistral", None),
        ("Mistral-Small-3.2-24B-Instruct-2506", "mistral", None),
        ("mistralai-Ministral-3-14B-Reasoning-2512", "mistral", "[THINK]"),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "deepseek", "<think>"),
        ("deepseek-ai-DeepSeek-V3.1", "deepseek", "<think>"),
        ("openai-gpt-oss-120b", "gpt-oss", None),
        ("GLM-4.6", "glm-4.5", "<think>"),
        ("GLM-4.7-Flash", "glm-4.5", "<think>"),
        ("moonshotai-Kimi-K2", "kimi-k2", None),
        ("Kimi-K2-Thinking", "kimi-k2", "<think>"),
        ("ibm-granite-granite-3.3-2B-Instruct", "granite", "<think>"),
        ("ibm-granite-granite-4.0", "hermes", None),
        ("meetkai-functionary-medium-v3.1", "functionary-v3.1", None),
        ("meetkai-functionary-medium-v3.2", "functionary-v3.2", None),
        ("google-gemma-4-31B-it", "gemma4", "<|channel>thought"),
    ],
)
def test_detect(name: str, family: str, think: str | None) -> None:
    fmt = detect(template(name))
    assert fmt.name == family
    assert (fmt.think[0] if fmt.think else None) == think


@pytest.mark.parametrize(
    ("name", "kwargs", "opened"),
    [
        ("Qwen3.5-4B", {}, True),
        ("Qwen3.5-4B", {"enable_thinking": False}, False),
        ("Qwen-Qwen3-0.6B", {}, False),  # Qwen3 lets the model open the trace
        ("Qwen-Qwen3-0.6B", {"enable_thinking": False}, False),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", {"enable_thinking": True}, True),
        ("deepseek-ai-DeepSeek-V3.1", {"thinking": True}, True),
        ("deepseek-ai-DeepSeek-V3.1", {}, False),
        ("GLM-4.7-Flash", {}, True),
        ("GLM-4.7-Flash", {"enable_thinking": False}, False),
    ],
)
def test_generation_prompt_opens_trace(name: str, kwargs: dict[str, Any], opened: bool) -> None:
    assert detect(template(name)).opens_trace(prompt(name, **kwargs)) is opened


@dataclass
class Case:
    template: str
    text: str
    reasoning: str = ""
    content: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    tools: bool = True
    kwargs: dict[str, Any] = field(default_factory=dict)  # for the generation prompt
    ids: list[str | None] | None = None


J = '{"city": "Paris", "days": 2}'
CASES = {
    "qwen3-think": Case("Qwen-Qwen3-0.6B", "<think>\nX\n</think>\n\nY", "X\n", "Y", tools=False),
    "qwen3-call": Case(
        "Qwen-Qwen3-0.6B",
        f'<think>\nCall it.\n</think>\n\n<tool_call>\n{{"name": "get_weather", "arguments": {J}}}'
        "\n</tool_call>",
        "Call it.\n",
        "",
        [PARIS],
    ),
    "qwen2.5-two-calls": Case(
        "Qwen-Qwen2.5-7B-Instruct",
        f'Checking.\n<tool_call>\n{{"name": "get_weather", "arguments": {J}}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
        "",
        "Checking.\n",
        [PARIS, ("get_weather", {"city": "Rome"})],
    ),
    "qwen2.5-bad-name": Case(  # not a JSON string: the block stays text
        "Qwen-Qwen2.5-7B-Instruct",
        '<tool_call>{"name": "f\\x", "arguments": {}}</tool_call>',
        content='<tool_call>{"name": "f\\x", "arguments": {}}</tool_call>',
    ),
    "qwen2.5-no-tools": Case(
        "Qwen-Qwen2.5-7B-Instruct",
        "<tool_call>\n{}\n</tool_call>",
        "",
        "<tool_call>\n{}\n</tool_call>",
        tools=False,
    ),
    "qwen3-coder": Case(
        "Qwen3-Coder",
        "I will look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        "",
        "I will look.\n",
        [PARIS],
    ),
    "qwen3.5-opened": Case(
        "Qwen3.5-4B",
        "Need the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
        "Paris\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        "Need the weather.\n",
        "",
        [PARIS],
    ),
    "llama3.1-json": Case(
        "meta-llama-Llama-3.1-8B-Instruct",
        f'{{"name": "get_weather", "parameters": {J}}}',
        calls=[PARIS],
    ),
    "llama3.1-python-tag": Case(
        "meta-llama-Llama-3.1-8B-Instruct",
        f'<|python_tag|>{{"name": "get_weather", "parameters": {J}}}',
        calls=[PARIS],
    ),
    "llama3.1-builtin-not-offered": Case(  # llama.cpp leaves it as text
        "meta-llama-Llama-3.1-8B-Instruct",
        '<|python_tag|>brave_search.call(query="weather in Paris")',
        content='<|python_tag|>brave_search.call(query="weather in Paris")',
    ),
    "qwen3-call-only": Case(
        "Qwen-Qwen3-0.6B",
        f'<tool_call>\n{{"name": "get_weather", "arguments": {J}}}\n</tool_call>',
        calls=[PARIS],
    ),
    "qwen3.5-no-thinking": Case(
        "Qwen3.5-4B",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        calls=[PARIS],
        kwargs={"enable_thinking": False},
    ),
    "glm-4.6-call": Case(
        "GLM-4.6",
        "Let me see.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
        "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
        content="Let me see.\n",
        calls=[PARIS],
    ),
    "deepseek-r1-call": Case(
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        f"{J}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        calls=[PARIS],
        kwargs={"enable_thinking": False},
    ),
    "deepseek-v3.1-call": Case(
        "deepseek-ai-DeepSeek-V3.1",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        f"{J}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        calls=[PARIS],
    ),
    "llama3.2-typed": Case(
        "meta-llama-Llama-3.2-3B-Instruct",
        f'{{"type": "function", "name": "get_weather", "parameters": {J}}}',
        calls=[PARIS],
    ),
    "llama3.2-text": Case("meta-llama-Llama-3.2-3B-Instruct", "It is sunny.", "", "It is sunny."),
    "mistral-nemo": Case(
        "mistralai-Mistral-Nemo-Instruct-2407",
        f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {J}, "id": "abcDEF123"}}]',
        calls=[PARIS],
        ids=["abcDEF123"],
    ),
    "mistral-small-3.2": Case(
        "Mistral-Small-3.2-24B-Instruct-2506",
        f'Sure.[TOOL_CALLS]get_weather[ARGS]{J}[TOOL_CALLS]get_weather[ARGS]{{"city": "Rome"}}',
        "",
        "Sure.",
        [PARIS, ("get_weather", {"city": "Rome"})],
    ),
    "mistral-call-id": Case(
        "Mistral-Small-3.2-24B-Instruct-2506",
        f"[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{J}",
        calls=[PARIS],
        ids=["a1b2c3d4e"],
    ),
    "ministral-think": Case(
        "mistralai-Ministral-3-14B-Reasoning-2512",
        f"[THINK]Paris, two days.[/THINK][TOOL_CALLS]get_weather[ARGS]{J}",
        "Paris, two days.",
        "",
        [PARIS],
    ),
    "deepseek-r1": Case(
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
        "Let me call.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
        f"get_weather\n```json\n{J}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "\nLet me call.\n",  # DeepSeek's trace keeps its blanks (llama.cpp's split)
        "",
        [PARIS],
        kwargs={"enable_thinking": True},
    ),
    "deepseek-r1-answer": Case(
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
        "Hmm.\n</think>\n\nIt is 42.",
        "\nHmm.\n",
        "\n\nIt is 42.",
        tools=False,
        kwargs={"enable_thinking": True},
    ),
    "deepseek-v3.1": Case(
        "deepseek-ai-DeepSeek-V3.1",
        "weather first</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        f"{J}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "weather first",
        "",
        [PARIS],
        kwargs={"thinking": True},
    ),
    "gpt-oss-call": Case(
        "openai-gpt-oss-120b",
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
        f"commentary to=functions.get_weather <|constrain|>json<|message|>{J}",
        "Need the weather.",
        "",
        [PARIS],
    ),
    "gpt-oss-final": Case(
        "openai-gpt-oss-120b",
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>"
        "It is 42.",
        "Easy.",
        "It is 42.",
        tools=False,
    ),
    "glm-4.6": Case(
        "GLM-4.6",
        "<think>Paris.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
        "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
        "Paris.",
        "",
        [PARIS],
    ),
    "glm-4.7-opened": Case(
        "GLM-4.7-Flash",
        "Paris.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>",
        "Paris.",
        "",
        [PARIS],
    ),
    "kimi-k2": Case(
        "moonshotai-Kimi-K2",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        f"<|tool_call_argument_begin|>{J}<|tool_call_end|><|tool_calls_section_end|>",
        calls=[PARIS],
        ids=["functions.get_weather:0"],
    ),
    "kimi-k2-thinking": Case(
        "Kimi-K2-Thinking",
        "<think>Look it up.</think>Checking.<|tool_calls_section_begin|><|tool_call_begin|>"
        f"functions.get_weather:0<|tool_call_argument_begin|>{J}<|tool_call_end|>"
        "<|tool_calls_section_end|>",
        "Look it up.",
        "Checking.",
        [PARIS],
    ),
    "granite-3.3": Case(
        "ibm-granite-granite-3.3-2B-Instruct",
        f'<|tool_call|>[{{"name": "get_weather", "arguments": {J}}}]',
        calls=[PARIS],
    ),
    "granite-4.0": Case(
        "ibm-granite-granite-4.0",
        f'<tool_call>\n{{"name": "get_weather", "arguments": {J}}}\n</tool_call>',
        calls=[PARIS],
    ),
    "functionary-v3.1": Case(
        "meetkai-functionary-medium-v3.1", f"<function=get_weather>{J}</function>", calls=[PARIS]
    ),
    "functionary-v3.2": Case(
        "meetkai-functionary-medium-v3.2",
        f"all\nLooking.>>>get_weather\n{J}",
        "",
        "Looking.",
        [PARIS],
    ),
    "gemma4-call": Case(
        "google-gemma-4-31B-it",
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>',
        calls=[PARIS],
    ),
    "gemma4-think": Case(
        "google-gemma-4-31B-it",
        "<|channel>thought\nSimple.<channel|>It is 42.",
        "Simple.",
        "It is 42.",
        tools=False,
    ),
}


def parser(case: Case) -> StreamParser:
    return StreamParser(
        detect(template(case.template)),
        tools=TOOLS if case.tools else None,
        prompt=prompt(case.template, **case.kwargs),
    )


def check(case: Case, got: Parsed) -> None:
    assert got.reasoning == case.reasoning
    assert got.content == case.content
    assert [(c.name, json.loads(c.arguments)) for c in got.calls] == case.calls
    if case.ids is not None:
        assert [c.id for c in got.calls] == case.ids
    assert all(c.id for c in got.calls)


@pytest.mark.parametrize("key", sorted(CASES))
def test_known_answer(key: str) -> None:
    case = CASES[key]
    check(case, parser(case).full(case.text))


@pytest.mark.parametrize("key", sorted(CASES))
def test_streamed_equals_full(key: str) -> None:
    """Random chunkings of the forced text stream to the known answer; no delta ever
    carries a piece of a marker (deltas are never taken back, so the joined deltas
    equal to the answer prove it)."""
    case = CASES[key]
    rng = random.Random(key)
    for chunking in range(8):
        p = parser(case)
        pos, parts = 0, []
        while pos < len(case.text):
            n = 1 if chunking == 0 else rng.randint(1, 9)
            parts.append(case.text[pos : pos + n])
            pos += n
        reasoning, content = "", ""
        calls: dict[int, list[str]] = {}
        for piece in parts:
            d = p.feed(piece)
            reasoning += d.reasoning
            content += d.content
            for c in d.calls:
                if c.name is not None:
                    assert c.index not in calls
                    calls[c.index] = [c.name, c.id or "", ""]
                calls[c.index][2] += c.arguments
        last, whole = p.finish()
        for c in last.calls:
            if c.name is not None:
                calls[c.index] = [c.name, c.id or "", ""]
            calls[c.index][2] += c.arguments
        got = Parsed(reasoning + last.reasoning, content + last.content)
        got.calls = [type(whole.calls[0])(n, a, i) for n, i, a in (calls[k] for k in sorted(calls))]
        check(case, got)
        check(case, whole)


def test_parallel_false_keeps_the_first_call() -> None:
    case = CASES["qwen2.5-two-calls"]
    fmt = detect(template(case.template))
    p = StreamParser(fmt, tools=TOOLS, parallel=False)
    assert [(c.name, json.loads(c.arguments)) for c in p.full(case.text).calls] == [PARIS]
    for piece in case.text:
        assert all(c.index == 0 for c in p.feed(piece).calls)
    assert len(p.finish()[1].calls) == 1


RUNS = 200
PIECES = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<function=", "<parameter=", "</parameter>",
    "</function>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]", "<|python_tag|>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
    "<|channel|>", "<|message|>", "<|end|>", "<|start|>", "analysis", "final", " to=functions.f",
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call|>", ">>>", "all\n",
    "<|tool_call>", "<tool_call|>", "call:f", '<|"|>', "<|channel>thought", "<channel|>",
    '{"name": "f", "arguments": ', '{"name": "f\\x", "arguments": ', '{"a": 1}', "}", "]", "[", "{", '"', "\\x", "\\", "\n", " ",
    "f", "x", "<", ">", ":", ",", "2",
]  # fmt: skip


@pytest.mark.parametrize(
    "name", sorted({c.template for c in CASES.values()} | {"Kimi-K2-Thinking", "GLM-4.6"})
)
def test_random_text_never_breaks_the_parser(name: str) -> None:
    """Random runs of every family's marker pieces: no exception, and the streamed
    deltas (in random chunks) equal the full parse."""
    rng = random.Random(name)
    fmt = detect(template(name))
    for _ in range(RUNS):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 14)))
        for tools in (TOOLS, None):
            p = StreamParser(fmt, tools=tools, prompt=prompt(name))
            whole = StreamParser(fmt, tools=tools, prompt=prompt(name)).full(text)
            reasoning = content = ""
            calls: dict[int, list[str]] = {}
            pos = 0
            deltas = []
            while pos < len(text):
                n = rng.randint(1, 6)
                deltas.append(p.feed(text[pos : pos + n]))
                pos += n
            last, streamed = p.finish()
            for d in [*deltas, last]:
                reasoning += d.reasoning
                content += d.content
                for c in d.calls:
                    calls.setdefault(c.index, [c.name or "", ""])[1] += c.arguments
            assert (reasoning, content) == (streamed.reasoning, streamed.content), text
            assert [(c.name, c.arguments) for c in streamed.calls] == [
                (n, a) for n, a in calls.values()
            ], text
            got = [(c.name, c.arguments) for c in whole.calls]
            assert (whole.reasoning, whole.content, got) == (
                streamed.reasoning,
                streamed.content,
                [(c.name, c.arguments) for c in streamed.calls],
            ), text


@pytest.mark.parametrize(
    ("name", "kw", "pieces", "n"),
    [
        ("Qwen-Qwen3-0.6B", {}, ["<think>", "\n", "X", "\n</think>", "\n\n", "Y"], 4),
        ("Qwen-Qwen3-0.6B", {}, ["<think>", "\nX"], 2),  # cut while thinking: all of it
        ("Qwen-Qwen3-0.6B", {}, ["Y", " <think>"], 0),  # no trace at the start
        ("Qwen-Qwen3-0.6B", {"reasoning": False}, ["<think>", "X</think>", "Y"], 0),
        ("Qwen3.5-4B", {}, ["Need", " it.", "\n</", "think>", "\n\n", "Y"], 4),  # opened
        (
            "openai-gpt-oss-120b",
            {},
            ["<|channel|>analysis<|message|>", "Hm", "<|end|>", "<|start|>assistant", "Hi"],
            3,
        ),
    ],
)
def test_trace_tokens(name: str, kw: dict[str, Any], pieces: list[str], n: int) -> None:
    """The tokens that wrote the trace, its end marker's last piece included."""
    fmt = detect(template(name))
    assert StreamParser(fmt, prompt=prompt(name), **kw).trace_tokens(pieces) == n
