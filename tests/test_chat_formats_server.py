"""The chat routes read the output in the model's own format: SmolLM2 given a family's
real template (Ollama's ``/api/create`` with ``template``), its output forced with a
``grammar``, answers through the official ``openai`` client with the known trace and
calls, streamed and not; ``enable_thinking`` changes the prompt as llama.cpp's server
renders it (same prompt ids)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from modelc.bench.llamacpp import LlamaCppServer
from tests import net
from tests.assets import smollm2_gguf
from tests.peers import openai_client
from tests.server_fixtures import Server
from tests.test_chat_formats import CASES, TEMPLATES, TOOLS

QWEN3, QWEN35, GPTOSS = "Qwen-Qwen3-0.6B", "Qwen3.5-4B", "openai-gpt-oss-120b"
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def srv(templates_server: Server) -> Server:
    """SmolLM2 as ``smol``, and as ``qwen3`` / ``qwen35`` / ``gptoss`` with those templates."""
    return templates_server


def forced(text: str) -> dict[str, Any]:
    return {"grammar": f"root ::= {json.dumps(text)}", "temperature": 0}


def streamed(client: openai.OpenAI, **kw: Any) -> tuple[str, str, list[tuple[str, Any]], str]:
    """(reasoning, content, calls, finish reason) joined from the stream's deltas."""
    reasoning, content, finish = "", "", ""
    calls: dict[int, list[str]] = {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        d = c.delta
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        content += d.content or ""
        for t in d.tool_calls or []:
            if t.id is not None:
                assert t.index not in calls and t.function is not None
                calls[t.index] = [t.function.name or "", ""]
            calls[t.index][1] += (t.function.arguments if t.function else None) or ""
        finish = c.finish_reason or finish
    return reasoning, content, [(n, json.loads(a)) for n, a in calls.values()], finish


def test_trace_split(srv: Server) -> None:
    """llama.cpp's split for the Qwen3 template: ``<think>\\nX\\n</think>\\n\\nY`` gives
    reasoning_content "X\\n" and content "Y"; reasoning_format none leaves it all."""
    client = openai_client(srv)
    text = "<think>\nX\n</think>\n\nY"
    kw: dict[str, Any] = {"model": "qwen3", "messages": USER, "max_tokens": 40}
    r = client.chat.completions.create(**kw, extra_body=forced(text))
    msg = r.choices[0].message
    assert (msg.model_extra or {}).get("reasoning_content") == "X\n" and msg.content == "Y"
    assert streamed(client, **kw, extra_body=forced(text))[:2] == ("X\n", "Y")
    none = {**forced(text), "reasoning_format": "none"}
    r = client.chat.completions.create(**kw, extra_body=none)
    assert r.choices[0].message.content == text
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})


def test_forced_call_in_the_family_format(srv: Server) -> None:
    """Qwen3.5 (the prompt opens the trace; calls in XML): the known trace and call."""
    case = CASES["qwen3.5-opened"]
    client = openai_client(srv)
    kw: dict[str, Any] = {
        "model": "qwen35",
        "messages": USER,
        "tools": TOOLS,
        "max_tokens": 120,
        "extra_body": forced(case.text),
    }
    r = client.chat.completions.create(**kw)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert (msg.model_extra or {}).get("reasoning_content") == case.reasoning
    calls = [(t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls or []]
    assert calls == case.calls and not msg.content
    assert streamed(client, **kw) == (case.reasoning, "", case.calls, "tool_calls")


def test_smollm2_calls_unchanged(srv: Server) -> None:
    """SmolLM2's own template: a Hermes call forced with a grammar is a tool call."""
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    client = openai_client(srv)
    kw: dict[str, Any] = {"model": "smol", "messages": USER, "tools": TOOLS, "max_tokens": 60}
    r = client.chat.completions.create(**kw, extra_body=forced(text))
    got = [
        (t.function.name, json.loads(t.function.arguments))
        for t in r.choices[0].message.tool_calls or []
    ]
    assert got == [("get_weather", {"city": "Paris"})]
    assert streamed(client, **kw, extra_body=forced(text))[2] == got


def test_ollama_thinking(srv: Server) -> None:
    """/api/chat: ``think`` false renders the template's closed trace (more prompt tokens
    for Qwen3), as ``chat_template_kwargs`` ``enable_thinking: false`` does."""

    def ollama(think: Any) -> int:
        body = {"model": "qwen3", "messages": USER, "stream": False, "options": {"num_predict": 1}}
        r = net.post(f"{srv.url}/api/chat", json={**body, "think": think}, timeout=300)
        r.raise_for_status()
        return int(r.json()["prompt_eval_count"])

    def chat(enable: bool) -> int:
        r = openai_client(srv).chat.completions.create(
            model="qwen3",
            messages=USER,  # type: ignore[arg-type]
            max_tokens=1,
            extra_body={"chat_template_kwargs": {"enable_thinking": enable}},
        )
        assert r.usage is not None
        return r.usage.prompt_tokens

    assert ollama(False) == chat(False) > ollama(True) == chat(True) == ollama(None)


def ollama_lines(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with net.stream("POST", url, json=body, timeout=300) as r:
        return [json.loads(line) for line in r.iter_lines() if line]


def test_ollama_opened_trace_is_thinking(srv: Server) -> None:
    """Qwen3.5's prompt opens the trace, so an answer cut before ``</think>`` is all
    ``thinking`` on /api/chat and /api/generate, streamed and not: the raw output
    (``reasoning_format: none``) less the prompt's ``<think>\n`` and leading blanks."""
    raw = openai_client(srv).chat.completions.create(
        model="qwen35",
        messages=USER,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0,
        extra_body={"reasoning_format": "none"},
    )
    text = raw.choices[0].message.content or ""
    assert text.startswith("<think>\n") and "</think>" not in text
    trace = text.removeprefix("<think>\n").lstrip()
    opts = {"num_predict": 8, "temperature": 0}
    chat = {"model": "qwen35", "messages": USER, "options": opts}
    gen = {"model": "qwen35", "prompt": USER[0]["content"], "options": opts}
    for stream in (False, True):
        lines = ollama_lines(f"{srv.url}/api/chat", {**chat, "stream": stream})
        msgs = [ln["message"] for ln in lines]
        assert "".join(m.get("thinking", "") for m in msgs) == trace
        assert "".join(m["content"] for m in msgs) == ""
        lines = ollama_lines(f"{srv.url}/api/generate", {**gen, "stream": stream})
        assert "".join(ln.get("thinking", "") for ln in lines) == trace
        assert "".join(ln["response"] for ln in lines) == ""


SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}


def _json_answers(srv: Server, model: str, max_tokens: int) -> dict[str, tuple[str, str]]:
    """(trace, answer) of a JSON-schema request on the chat route (``response_format``),
    Ollama's ``/api/chat`` (``format``) and Responses (``text.format``, whole and
    streamed), greedy."""
    client = openai_client(srv)
    rf: Any = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}
    r = client.chat.completions.create(
        model=model,
        messages=USER,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        temperature=0,
        response_format=rf,
    )
    m = r.choices[0].message
    out = {"chat": ((m.model_extra or {}).get("reasoning_content") or "", m.content or "")}
    body = {
        "model": model,
        "messages": USER,
        "stream": False,
        "format": SCHEMA,
        "options": {"num_predict": max_tokens, "temperature": 0},
    }
    got = net.post(f"{srv.url}/api/chat", json=body, timeout=300).json()["message"]
    out["ollama"] = (got.get("thinking", ""), got["content"])
    fmt: Any = {"format": {"type": "json_schema", "name": "w", "schema": SCHEMA}}
    kw: Any = {"model": model, "input": USER, "max_output_tokens": max_tokens, "text": fmt}
    resp = client.responses.create(**kw, temperature=0)
    trace = "".join(
        c.text for it in resp.output if it.type == "reasoning" for c in it.content or []
    )
    out["responses"] = (trace, resp.output_text)
    trace = answer = ""
    for ev in client.responses.create(**kw, temperature=0, stream=True):
        if ev.type == "response.reasoning_text.delta":
            trace += ev.delta
        elif ev.type == "response.output_text.delta":
            answer += ev.delta
    out["responses stream"] = (trace, answer)
    return out


def test_json_answer_with_a_trace_template(srv: Server) -> None:
    """A reasoning template (Qwen3: the trace is optional) still gets a valid JSON-schema
    answer, the same on the chat route, Ollama's ``format`` and Responses' ``text.format``
    (the trace-then-answer grammar itself is held to known texts in
    ``test_chat_constraint``)."""
    got = _json_answers(srv, "qwen3", 60)
    for _, text in got.values():
        answer = json.loads(text)
        assert set(answer) == {"city", "days"} and isinstance(answer["days"], int)
    assert len(set(got.values())) == 1, got


def test_json_constraint_leaves_an_opened_trace_free(srv: Server) -> None:
    """When the prompt opens the trace (Qwen3.5), a JSON-schema request lets the model
    think first: the trace is free text in the trace's field on every route (SmolLM2 does
    not end it within the limit, so no answer comes), never JSON forced into it, nor text
    in the answer."""
    got = _json_answers(srv, "qwen35", 24)
    trace = got["chat"][0]
    assert trace.strip() and not trace.lstrip().startswith("{")
    assert set(got.values()) == {(trace, "")}, got


# a call, its result and an earlier trace, back through the template
ROUND_TRIP: list[dict[str, Any]] = [
    *USER,
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Look it up.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "user", "content": "And tomorrow?"},
]
# template -> (the model created with it, the requests' fields)
PROMPTS: dict[str, tuple[str, list[dict[str, Any]]]] = {
    QWEN3: (
        "qwen3",
        [
            {},
            {"chat_template_kwargs": {"enable_thinking": False}},
            {"chat_template_kwargs": {"enable_thinking": True}},
            {"messages": ROUND_TRIP, "tools": TOOLS},
        ],
    ),
    GPTOSS: (
        "gptoss",
        [{}, {"reasoning_effort": "high"}, {"chat_template_kwargs": {"reasoning_effort": "low"}}],
    ),
}


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_prompt_ids_equal_llamacpp(srv: Server, name: str, tmp_path: Path) -> None:
    """``enable_thinking`` / ``reasoning_effort`` change the prompt as llama.cpp's server
    renders it: the same text (``/apply-template``) and the same prompt ids."""
    model, extras = PROMPTS[name]
    tpl = TEMPLATES / f"{name}.jinja"
    with LlamaCppServer(
        smollm2_gguf(), threads=1, n_parallel=1, n_ctx=4096, chat_template=tpl, log=tmp_path / "l"
    ) as peer:
        texts = set()
        for extra in extras:
            body = {"messages": USER, **extra}  # extra may set other messages
            text = net.post(f"{peer.url}/apply-template", json=body, timeout=60).json()["prompt"]
            theirs = net.post(
                f"{peer.url}/tokenize",
                json={"content": text, "add_special": True, "parse_special": True},
                timeout=60,
            ).json()["tokens"]
            mine = net.post(
                f"{srv.url}/v1/chat/completions",
                json={"model": model, **body, "max_tokens": 1, "return_token_ids": True},
                timeout=300,
            ).json()["prompt_token_ids"]
            assert mine == theirs, extra
            mine_text = net.post(
                f"{srv.url}/apply-template", json={"model": model, **body}, timeout=60
            ).json()["prompt"]
            assert mine_text == text, extra
            texts.add(text)
        assert len(texts) >= 2  # the variables do change the prompt
