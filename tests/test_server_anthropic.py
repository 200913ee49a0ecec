"""The official ``anthropic`` client against ``modelc run`` on SmolLM2 (``/v1/messages``).

The reference is the chat route for the same conversation: the greedy text, the prompt
token count (``count_tokens`` and ``usage.input_tokens`` against ``prompt_tokens``) and
the finish; a forced tool call is checked against its tool's schema; the stream's event
order against Anthropic's documented sequence.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from tests import net
from tests.assets import smollm2_gguf
from tests.server_fixtures import Server, start

KEY = "sk-test-anthropic"
# anthropic 2.x has no temperature argument (Claude's newer models take none): sent as is
GREEDY = {"temperature": 0}
Q = "What is the capital of France? Answer briefly."
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CHAT_WEATHER = {
    "type": "function",
    "function": {
        "name": WEATHER["name"],
        "description": WEATHER["description"],
        "parameters": WEATHER["input_schema"],
    },
}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = start(str(smollm2_gguf()), "--api-key", KEY, "--ping-interval", "0.05")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> anthropic.Anthropic:
    # the client sends the key as x-api-key
    return anthropic.Anthropic(
        http_client=net.anthropic_http(),
        base_url=server.url,
        api_key=KEY,
        max_retries=0,
        timeout=120,
    )


@pytest.fixture(scope="module")
def chat(server: Server) -> openai.OpenAI:
    return openai.OpenAI(
        http_client=net.openai_http(),
        base_url=f"{server.url}/v1",
        api_key=KEY,
        max_retries=0,
        timeout=120,
    )


@pytest.fixture(scope="module")
def model(chat: openai.OpenAI) -> str:
    return chat.models.list().data[0].id


def _chat(chat: openai.OpenAI, model: str, messages: list[Any], **kw: Any) -> Any:
    return chat.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=32, **kw
    )


def _text(msg: anthropic.types.Message) -> str:
    return "".join(b.text for b in msg.content if b.type == "text")


def test_create_plain_equals_chat(
    client: anthropic.Anthropic, chat: openai.OpenAI, model: str
) -> None:
    msgs: list[Any] = [{"role": "user", "content": Q}]
    m = client.messages.create(model=model, max_tokens=32, extra_body=GREEDY, messages=msgs)
    ref = _chat(chat, model, msgs)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg")
    assert _text(m) == ref.choices[0].message.content and _text(m)
    assert m.stop_reason == "end_turn" and ref.choices[0].finish_reason == "stop"
    assert m.usage.input_tokens == ref.usage.prompt_tokens
    assert m.usage.output_tokens == ref.usage.completion_tokens
    n = client.messages.count_tokens(model=model, messages=msgs)
    assert n.input_tokens == ref.usage.prompt_tokens


@pytest.mark.parametrize("blocks", [False, True])
def test_system(client: anthropic.Anthropic, chat: openai.OpenAI, model: str, blocks: bool) -> None:
    system = "You are a pirate. Answer in one sentence."
    msgs: list[Any] = [{"role": "user", "content": "Where do you live?"}]
    given: Any = [{"type": "text", "text": system}] if blocks else system
    m = client.messages.create(
        model=model, max_tokens=32, extra_body=GREEDY, system=given, messages=msgs
    )
    ref = _chat(chat, model, [{"role": "system", "content": system}, *msgs])
    assert _text(m) == ref.choices[0].message.content
    assert m.usage.input_tokens == ref.usage.prompt_tokens
    n = client.messages.count_tokens(model=model, system=given, messages=msgs)
    assert n.input_tokens == ref.usage.prompt_tokens


def test_stream_events_and_text(server: Server, client: anthropic.Anthropic, model: str) -> None:
    msgs: list[Any] = [{"role": "user", "content": Q}]
    plain = client.messages.create(model=model, max_tokens=32, extra_body=GREEDY, messages=msgs)
    events = list(
        client.messages.create(
            model=model, max_tokens=32, extra_body=GREEDY, messages=msgs, stream=True
        )
    )
    kinds = [e.type for e in events if e.type != "ping"]
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    # on the wire (the client drops pings): named events, a ping after message_start
    raw = net.post(
        f"{server.url}/v1/messages",
        headers={"x-api-key": KEY},
        json={"model": model, "max_tokens": 32, "messages": msgs, "stream": True, **GREEDY},
        timeout=120,
    ).text
    names = [line[7:] for line in raw.splitlines() if line.startswith("event: ")]
    datas = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    assert names[:2] == ["message_start", "ping"] and [d["type"] for d in datas] == names
    assert [n for n in names if n != "ping"] == kinds
    start = events[0]
    assert (
        start.type == "message_start"
        and start.message.usage.input_tokens == plain.usage.input_tokens
    )
    text = "".join(
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert text == _text(plain)
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.delta.stop_reason == "end_turn"
    assert delta.usage.output_tokens == plain.usage.output_tokens
    # the client's own accumulation of the stream
    with client.messages.stream(model=model, max_tokens=32, extra_body=GREEDY, messages=msgs) as s:
        final = s.get_final_message()
    assert _text(final) == _text(plain) and final.stop_reason == "end_turn"


def test_max_tokens_and_stop_sequence(client: anthropic.Anthropic, model: str) -> None:
    msgs: list[Any] = [{"role": "user", "content": Q}]
    full = _text(
        client.messages.create(model=model, max_tokens=32, extra_body=GREEDY, messages=msgs)
    )
    m = client.messages.create(model=model, max_tokens=3, extra_body=GREEDY, messages=msgs)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    assert full.startswith(_text(m))
    word = full.split()[2]
    m = client.messages.create(
        model=model, max_tokens=32, extra_body=GREEDY, messages=msgs, stop_sequences=[word]
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert _text(m) == full[: full.index(word)]


def test_tool_use_any(client: anthropic.Anthropic, model: str) -> None:
    msgs: list[Any] = [{"role": "user", "content": "What's the weather in Paris?"}]
    kw: Any = {"tools": [WEATHER], "tool_choice": {"type": "any"}}
    m = client.messages.create(model=model, max_tokens=40, extra_body=GREEDY, messages=msgs, **kw)
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, WEATHER["input_schema"])
    with client.messages.stream(
        model=model, max_tokens=40, extra_body=GREEDY, messages=msgs, **kw
    ) as s:
        final = s.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(streamed) == 1
    assert streamed[0].name == "get_weather" and streamed[0].input == uses[0].input


def test_tool_result_round_trip(
    client: anthropic.Anthropic, chat: openai.OpenAI, model: str
) -> None:
    args = {"city": "Paris"}
    msgs: list[Any] = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": args}
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 24 C"}
            ],
        },
    ]
    m = client.messages.create(
        model=model, max_tokens=32, extra_body=GREEDY, messages=msgs, tools=[WEATHER]
    )
    ref = _chat(
        chat,
        model,
        [
            msgs[0],
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": json.dumps(args)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 24 C"},
        ],
        tools=[CHAT_WEATHER],
    )
    assert m.usage.input_tokens == ref.usage.prompt_tokens
    n = client.messages.count_tokens(model=model, messages=msgs, tools=[WEATHER])  # type: ignore[list-item]
    assert n.input_tokens == ref.usage.prompt_tokens
    assert _text(m) == (ref.choices[0].message.content or "")


def test_errors_in_anthropic_shape(server: Server, client: anthropic.Anthropic, model: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(
            model=model, max_tokens=0, messages=[{"role": "user", "content": "hi"}]
        )
    body = e.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert (
        body["error"]["type"] == "invalid_request_error"
        and "max_tokens" in body["error"]["message"]
    )
    bad = anthropic.Anthropic(
        http_client=net.anthropic_http(), base_url=server.url, api_key="wrong", max_retries=0
    )
    with pytest.raises(anthropic.AuthenticationError) as e2:
        bad.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert e2.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    # the same route with the key as a bearer token
    r = net.post(
        f"{server.url}/v1/messages/count_tokens",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
    with pytest.raises(anthropic.NotFoundError) as e3:
        client.messages.create(
            model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert e3.value.body["type"] == "error"  # type: ignore[index]


def test_tool_choice_tool_and_none(client: anthropic.Anthropic, model: str) -> None:
    msgs: list[Any] = [{"role": "user", "content": "Weather in Rome please"}]
    named: Any = {"type": "tool", "name": "get_weather"}
    m = client.messages.create(
        model=model,
        max_tokens=40,
        extra_body=GREEDY,
        messages=msgs,
        tools=[WEATHER],
        tool_choice=named,
    )
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and [u.name for u in uses] == ["get_weather"]
    jsonschema.validate(uses[0].input, WEATHER["input_schema"])
    # none: the tools are not offered, so the prompt is the one without them
    off: Any = {"type": "none"}
    n = client.messages.count_tokens(model=model, messages=msgs, tools=[WEATHER], tool_choice=off)  # type: ignore[list-item]
    assert n.input_tokens == client.messages.count_tokens(model=model, messages=msgs).input_tokens
    with_tools = client.messages.count_tokens(model=model, messages=msgs, tools=[WEATHER])  # type: ignore[list-item]
    assert with_tools.input_tokens > n.input_tokens
