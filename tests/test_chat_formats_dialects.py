"""Anthropic Messages and OpenAI Responses read the output in the model's own format:
SmolLM2 given Qwen3's and Qwen3.5's real templates (Ollama's ``/api/create`` with
``template``), its output forced with a ``grammar``, answers through the official
``anthropic`` and ``openai`` clients with the known trace split and calls (the same
cases the chat route is held to), streamed and not."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from tests import net
from tests.peers import openai_client
from tests.server_fixtures import Server
from tests.test_chat_formats import CASES, TOOLS

TRACE = "<think>\nX\n</think>\n\nY"  # Qwen3's template: trace "X\n", answer "Y" (llama.cpp)
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
FN = TOOLS[0]["function"]
CALL = CASES["qwen3.5-opened"]  # the prompt opens the trace; the call in Qwen's XML


@pytest.fixture(scope="module")
def srv(templates_server: Server) -> Server:
    """SmolLM2 as ``smol``, and as ``qwen3`` / ``qwen35`` / ``gptoss`` with those templates."""
    return templates_server


def forced(text: str) -> dict[str, Any]:
    return {"grammar": f"root ::= {json.dumps(text)}"}


# --- Anthropic Messages ------------------------------------------------------------------
def _claude(srv: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        http_client=net.anthropic_http(), base_url=srv.url, api_key="x", max_retries=0, timeout=120
    )


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


DELTA_OF = {"thinking": "thinking_delta", "text": "text_delta", "tool_use": "input_json_delta"}


def _messages(srv: Server, **kw: Any) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]], str]:
    """(blocks of the whole answer, blocks joined from the stream's deltas, stop_reason
    of both, checked equal).  Each streamed block holds only its own kind of delta; a
    ``tool_use`` starts with an empty ``input`` and its ``partial_json`` pieces join to its
    input's JSON; a ``thinking`` block ends with one ``signature_delta``, the whole
    answer's signature."""
    client = _claude(srv)
    whole = client.messages.create(**kw)
    pieces: dict[int, list[Any]] = {}
    deltas: dict[int, list[str]] = {}
    with client.messages.stream(**kw) as s:
        for ev in s:
            if ev.type == "content_block_start":
                assert ev.index == len(pieces)  # blocks open in order, one at a time
                assert all(k == "stop" for k in (d[-1] for d in deltas.values()))
                kind = ev.content_block.type
                if kind == "tool_use":
                    assert ev.content_block.input == {}
                pieces[ev.index], deltas[ev.index] = [kind, ""], []
            elif ev.type == "content_block_delta":
                d = ev.delta
                deltas[ev.index].append(d.type)
                if d.type == "signature_delta":
                    pieces[ev.index].append(d.signature)
                    continue
                assert d.type == DELTA_OF[pieces[ev.index][0]], d
                pieces[ev.index][1] += (
                    d.thinking
                    if d.type == "thinking_delta"
                    else d.text
                    if d.type == "text_delta"
                    else d.partial_json
                )
            elif ev.type == "content_block_stop":
                deltas[ev.index].append("stop")
        final = s.get_final_message()
    assert final.stop_reason == whole.stop_reason and _blocks(final.content) == _blocks(
        whole.content
    )
    for i, (kind, *rest) in pieces.items():
        if kind == "thinking":  # the deltas, then one signature_delta just before the stop
            assert deltas[i][-2:] == ["signature_delta", "stop"] and rest[1]
            assert rest[1] == final.content[i].signature == whole.content[i].signature  # type: ignore[union-attr]
    streamed = [
        (k, (final.content[i].name, json.loads(v)) if k == "tool_use" else v)  # type: ignore[union-attr]
        for i, (k, v, *_) in pieces.items()
    ]
    return _blocks(whole.content), streamed, str(whole.stop_reason)


def _json_pieces(srv: Server, body: dict[str, Any]) -> list[list[str]]:
    """Each ``tool_use`` block's ``partial_json`` pieces on the wire."""
    raw = net.post(f"{srv.url}/v1/messages", json={**body, "stream": True}, timeout=300).text
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    out: dict[int, list[str]] = {}
    for ev in events:
        if ev["type"] == "content_block_start" and ev["content_block"]["type"] == "tool_use":
            out[ev["index"]] = []
        elif ev["type"] == "content_block_delta" and ev["index"] in out:
            out[ev["index"]].append(ev["delta"]["partial_json"])
    return list(out.values())


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


# an item's events between its output_item.added and .done: (first, each delta, last)
PART = ["content_part.added"]
ITEM_EVENTS = {
    "reasoning": (PART, "reasoning_text.delta", ["reasoning_text.done", "content_part.done"]),
    "message": (PART, "output_text.delta", ["output_text.done", "content_part.done"]),
    "function_call": ([], "function_call_arguments.delta", ["function_call_arguments.done"]),
}


def _order(kind: str, names: list[str]) -> None:
    """An item's events in OpenAI's order: added, its deltas (at least one), done."""
    head, delta, tail = ITEM_EVENTS[kind]
    n = len(names) - 2 - len(head) - len(tail)
    assert n >= 1 and names == ["output_item.added", *head, *[delta] * n, *tail, "output_item.done"]


def _responses(srv: Server, **kw: Any) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """(items of the whole answer, items joined from the stream's deltas), through the
    ``openai`` client's ``responses.stream`` helper (which accumulates the events and
    checks their identities): its final response equals the whole one, each item's
    events come in OpenAI's order, one item at a time, and a ``function_call`` is added
    with empty ``arguments`` that its deltas then fill."""
    client = openai_client(srv)
    whole = client.responses.create(**kw)
    items: dict[int, list[Any]] = {}
    done: dict[int, list[Any]] = {}
    names: dict[int, list[str]] = {}
    seqs: list[int] = []
    with client.responses.stream(**kw) as stream:
        for ev in stream:
            seqs.append(ev.sequence_number)
            at = getattr(ev, "output_index", None)
            if at is not None:
                names.setdefault(at, []).append(ev.type.removeprefix("response."))
            if ev.type == "response.output_item.added":
                assert ev.output_index == len(items)
                assert all(n[-1] == "output_item.done" for i, n in names.items() if i < at)
                items[ev.output_index] = [ev.item.type, ""]
                if ev.item.type == "function_call":
                    assert ev.item.arguments == "" and ev.item.status == "in_progress"
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
            elif ev.type == "response.function_call_arguments.delta":
                assert items[ev.output_index][0] == "function_call"
                items[ev.output_index][1] += ev.delta
            elif ev.type == "response.function_call_arguments.done":
                assert ev.arguments == items[ev.output_index][1]
                item = items[ev.output_index]
                item[1] = (ev.name, json.loads(ev.arguments))
                done[ev.output_index] = item
            elif ev.type == "response.output_item.done" and ev.item.type == "function_call":
                assert json.loads(ev.item.arguments) == items[ev.output_index][1][1]
        final = stream.get_final_response()
    assert seqs == list(range(len(seqs)))
    for i, (kind, _) in items.items():
        _order(kind, names[i])
    assert _items(final.output) == _items(whole.output)
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


# --- calls streamed piece by piece -------------------------------------------------------
TOOL_CALL = CASES["qwen3-call"]  # a trace, then a Hermes call (Qwen3's template)
TWO_CALLS = CASES["qwen2.5-two-calls"]  # text, then two Hermes calls


@pytest.mark.parametrize("case", [TOOL_CALL, TWO_CALLS], ids=["trace-call", "text-two-calls"])
def test_messages_tool_use_streams_its_input(srv: Server, case: Any) -> None:
    """Each ``tool_use`` block streams its input as ``input_json_delta`` pieces (more than
    one: as the call is parsed, not at the end) that join to the call's JSON; the
    client's ``messages.stream`` accumulates them into the whole answer's input."""
    tools = [{"name": FN["name"], "input_schema": FN["parameters"]}]
    body = {"model": "qwen3", "max_tokens": 120, "messages": USER, "tools": tools}
    whole, streamed, stop = _messages(srv, **body, extra_body=forced(case.text))
    want = [("thinking", case.reasoning)] if case.reasoning else [("text", case.content)]
    assert whole == [*want, *(("tool_use", c) for c in case.calls)]
    assert stop == "tool_use" and streamed == whole
    pieces = _json_pieces(srv, {**body, **forced(case.text)})
    assert [json.loads("".join(p)) for p in pieces] == [args for _, args in case.calls]
    assert all(len(p) > 1 for p in pieces), pieces


@pytest.mark.parametrize("case", [TOOL_CALL, TWO_CALLS], ids=["trace-call", "text-two-calls"])
def test_responses_function_call_streams_its_arguments(srv: Server, case: Any) -> None:
    """Each ``function_call`` item is added with empty arguments, streams them as
    ``response.function_call_arguments.delta`` pieces (more than one), then ``.done``
    and ``output_item.done`` (the order is checked in ``_responses``)."""
    tools = [{"type": "function", "name": FN["name"], "parameters": FN["parameters"]}]
    kw = {"model": "qwen3", "input": USER, "tools": tools, "max_output_tokens": 120}
    whole, streamed = _responses(srv, **kw, extra_body=forced(case.text))
    want = [("reasoning", case.reasoning)] if case.reasoning else [("message", case.content)]
    assert whole == [*want, *(("function_call", c) for c in case.calls)] and streamed == whole
    raw = net.post(
        f"{srv.url}/v1/responses", json={**kw, **forced(case.text), "stream": True}, timeout=300
    ).text
    deltas: dict[int, int] = {}
    for line in raw.splitlines():
        ev = json.loads(line[6:]) if line.startswith("data: ") else {}
        if ev.get("type") == "response.function_call_arguments.delta":
            deltas[ev["output_index"]] = deltas.get(ev["output_index"], 0) + 1
    assert len(deltas) == len(case.calls) and min(deltas.values()) > 1, deltas


def test_responses_count_reasoning_tokens(srv: Server) -> None:
    """``usage.output_tokens_details.reasoning_tokens`` counts the tokens that wrote the
    trace (its markers included), whole and streamed: the tokens the chat route lists
    (``logprobs``) for the same forced output, up to the one that ends ``</think>``."""
    ref = net.post(
        f"{srv.url}/v1/chat/completions",
        json={"model": "qwen3", "messages": USER, "max_tokens": 40, "logprobs": True}
        | forced(TRACE),
        timeout=300,
    ).json()
    tokens = [t["token"] for t in ref["choices"][0]["logprobs"]["content"]]
    assert "".join(tokens) == TRACE
    end, at, want = TRACE.index("</think>") + len("</think>"), 0, 0
    for t in tokens:
        if at < end:
            want, at = want + 1, at + len(t)
    assert 0 < want < len(tokens)
    client = openai_client(srv)
    kw: Any = {"model": "qwen3", "input": USER, "max_output_tokens": 40}
    whole = client.responses.create(**kw, extra_body=forced(TRACE))
    assert whole.usage is not None and whole.usage.output_tokens_details.reasoning_tokens == want
    done = [
        ev
        for ev in client.responses.create(**kw, extra_body=forced(TRACE), stream=True)
        if ev.type == "response.completed"
    ]
    usage = done[0].response.usage
    assert usage is not None and usage.output_tokens_details.reasoning_tokens == want
    plain = client.responses.create(**kw, extra_body=forced("Y"))
    assert plain.usage is not None and plain.usage.output_tokens_details.reasoning_tokens == 0
