"""Anthropic Messages and OpenAI Responses read the output in the model's own format:
SmolLM2 given Qwen3's and Qwen3.5's real templates (Ollama's ``/api/create`` with
``template``), its output forced with a ``grammar``, answers through the official
``anthropic`` and ``openai`` clients with the known trace split and calls (the same
cases the chat route is held to), streamed and not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.assets import smollm2_gguf
from tests.peers import openai_client
from tests.server_fixtures import Server, start
from tests.test_chat_formats import CASES, TOOLS, template

TRACE = "<think>\nX\n</think>\n\nY"  # Qwen3's template: trace "X\n", answer "Y" (llama.cpp)
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
FN = TOOLS[0]["function"]
CALL = CASES["qwen3.5-opened"]  # the prompt opens the trace; the call in Qwen's XML


@pytest.fixture(scope="module")
def srv() -> Iterator[Server]:
    """SmolLM2 as ``smol``, and as ``qwen3`` / ``qwen35`` with those templates."""
    s = start(None, str(smollm2_gguf()), "--alias", "smol")
    for name, tpl in (("qwen3", "Qwen-Qwen3-0.6B"), ("qwen35", "Qwen3.5-4B")):
        r = httpx.post(
            f"{s.url}/api/create",
            json={"model": name, "from": "smol", "template": template(tpl), "stream": False},
            timeout=300,
        )
        assert r.status_code == 200 and r.json()["status"] == "success", r.text
    yield s
    s.stop()


def forced(text: str) -> dict[str, Any]:
    return {"grammar": f"root ::= {json.dumps(text)}"}


# --- Anthropic Messages ------------------------------------------------------------------
def _claude(srv: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=120)


def _blocks(content: list[Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for b in content:
        if b.type == "thinking":
            out.append(("thinking", b.thinking))
        elif b.type == "text":
            out.append(("text", b.text))
        else:
            out.append(("tool_use", (b.name, b.input)))
    return out


def _messages(srv: Server, **kw: Any) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]], str]:
    """(blocks of the whole answer, blocks joined from the stream's deltas, stop_reason
    of both, checked equal)."""
    client = _claude(srv)
    whole = client.messages.create(**kw)
    pieces: dict[int, list[Any]] = {}
    with client.messages.stream(**kw) as s:
        for ev in s:
            if ev.type == "content_block_start":
                assert ev.index == len(pieces)  # blocks open in order, one at a time
                kind = ev.content_block.type
                pieces[ev.index] = [kind, ""]
            elif ev.type == "content_block_delta":
                d = ev.delta
                if d.type == "thinking_delta":
                    assert pieces[ev.index][0] == "thinking"
                    pieces[ev.index][1] += d.thinking
                elif d.type == "text_delta":
                    assert pieces[ev.index][0] == "text"
                    pieces[ev.index][1] += d.text
                elif d.type == "input_json_delta":
                    pieces[ev.index][1] += d.partial_json
        final = s.get_final_message()
    assert final.stop_reason == whole.stop_reason and _blocks(final.content) == _blocks(
        whole.content
    )
    streamed = [
        (k, (final.content[i].name, json.loads(v)) if k == "tool_use" else v)
        for i, (k, v) in pieces.items()
    ]
    return _blocks(whole.content), streamed, str(whole.stop_reason)


def test_messages_thinking_block(srv: Server) -> None:
    """The trace is a ``thinking`` block before the answer's ``text`` block (streamed
    as ``thinking_delta`` in its own block)."""
    kw = {"model": "qwen3", "max_tokens": 40, "messages": USER, "extra_body": forced(TRACE)}
    whole, streamed, stop = _messages(srv, **kw)
    assert whole == [("thinking", "X\n"), ("text", "Y")] and stop == "end_turn"
    assert streamed == whole


def test_messages_family_call(srv: Server) -> None:
    """Qwen3.5's opened trace and XML call: a ``thinking`` block and a ``tool_use``."""
    tools = [{"name": FN["name"], "input_schema": FN["parameters"]}]
    kw = {
        "model": "qwen35",
        "max_tokens": 120,
        "messages": USER,
        "tools": tools,
        "extra_body": forced(CALL.text),
    }
    whole, streamed, stop = _messages(srv, **kw)
    assert whole == [("thinking", CALL.reasoning), *(("tool_use", c) for c in CALL.calls)]
    assert stop == "tool_use" and streamed == whole


# --- OpenAI Responses --------------------------------------------------------------------
def _items(output: list[Any]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for it in output:
        if it.type == "reasoning":
            out.append(("reasoning", "".join(c.text for c in it.content or [])))
        elif it.type == "message":
            out.append(("message", "".join(c.text for c in it.content)))
        else:
            out.append(("function_call", (it.name, json.loads(it.arguments))))
    return out


def _responses(srv: Server, **kw: Any) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """(items of the whole answer, items joined from the stream's deltas), the stream's
    completed response checked equal to the whole one."""
    client = openai_client(srv)
    whole = client.responses.create(**kw)
    items: dict[int, list[Any]] = {}
    done: dict[int, list[Any]] = {}
    final = None
    for ev in client.responses.create(stream=True, **kw):
        if ev.type == "response.output_item.added":
            assert ev.output_index == len(items)
            items[ev.output_index] = [ev.item.type, ""]
        elif ev.type == "response.reasoning_text.delta":
            assert items[ev.output_index][0] == "reasoning"
            items[ev.output_index][1] += ev.delta
        elif ev.type == "response.reasoning_text.done":
            done[ev.output_index] = ["reasoning", ev.text]
        elif ev.type == "response.output_text.delta":
            assert items[ev.output_index][0] == "message"
            items[ev.output_index][1] += ev.delta
        elif ev.type == "response.output_text.done":
            done[ev.output_index] = ["message", ev.text]
        elif ev.type == "response.function_call_arguments.done":
            items[ev.output_index][1] = (ev.name, json.loads(ev.arguments))
            done[ev.output_index] = items[ev.output_index]
        elif ev.type == "response.completed":
            final = ev.response
    assert final is not None and _items(final.output) == _items(whole.output)
    assert done == items
    return _items(whole.output), [(k, v) for k, v in items.values()]


def test_responses_reasoning_item(srv: Server) -> None:
    """The trace is a ``reasoning`` item before the ``message`` (streamed as
    ``response.reasoning_text.delta`` / ``.done``)."""
    kw = {"model": "qwen3", "input": USER, "max_output_tokens": 40, "extra_body": forced(TRACE)}
    whole, streamed = _responses(srv, **kw)
    assert whole == [("reasoning", "X\n"), ("message", "Y")] and streamed == whole


def test_responses_family_call(srv: Server) -> None:
    """Qwen3.5's opened trace and XML call: a ``reasoning`` item and a ``function_call``."""
    tools = [{"type": "function", "name": FN["name"], "parameters": FN["parameters"]}]
    kw = {
        "model": "qwen35",
        "input": USER,
        "tools": tools,
        "max_output_tokens": 120,
        "extra_body": forced(CALL.text),
    }
    whole, streamed = _responses(srv, **kw)
    assert whole == [("reasoning", CALL.reasoning), *(("function_call", c) for c in CALL.calls)]
    assert streamed == whole
