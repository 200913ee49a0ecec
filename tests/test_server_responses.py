"""The official ``openai`` client's ``responses.create`` against ``modelc run`` on SmolLM2.

The reference is the chat route for the same conversation: the greedy text, the prompt
token count (``usage.input_tokens`` against ``prompt_tokens``) and the output token
count; a required function call is checked against its tool's schema; the stream's
event order against the documented sequence.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests import net
from tests.server_fixtures import Server

Q = "What is the capital of France? Answer briefly."
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": SCHEMA,
}
CHAT_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": TOOL["description"], "parameters": SCHEMA},
}


@pytest.fixture(scope="module")
def client(smol_server: Server) -> openai.OpenAI:
    return openai.OpenAI(
        http_client=net.openai_http(),
        base_url=f"{smol_server.url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=120,
    )


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _chat(client: openai.OpenAI, model: str, messages: list[Any], **kw: Any) -> Any:
    return client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=32, **kw
    )


def _create(client: openai.OpenAI, model: str, **kw: Any) -> Any:
    return client.responses.create(model=model, temperature=0, **{"max_output_tokens": 32, **kw})


def test_plain_equals_chat(client: openai.OpenAI, model: str) -> None:
    r = _create(client, model, input=Q)
    ref = _chat(client, model, [{"role": "user", "content": Q}])
    assert r.object == "response" and r.status == "completed" and r.model == model
    assert r.output_text == ref.choices[0].message.content and r.output_text
    assert [o.type for o in r.output] == ["message"]
    assert r.usage.input_tokens == ref.usage.prompt_tokens
    assert r.usage.output_tokens == ref.usage.completion_tokens
    # the same conversation as a message item with input_text parts
    items = [{"role": "user", "content": [{"type": "input_text", "text": Q}]}]
    again = _create(client, model, input=items)
    assert again.output_text == r.output_text and again.usage.input_tokens == r.usage.input_tokens


def test_instructions(client: openai.OpenAI, model: str) -> None:
    system = "You are a pirate. Answer in one sentence."
    r = _create(client, model, instructions=system, input="Where do you live?")
    ref = _chat(
        client,
        model,
        [{"role": "system", "content": system}, {"role": "user", "content": "Where do you live?"}],
    )
    assert r.instructions == system
    assert r.output_text == ref.choices[0].message.content
    assert r.usage.input_tokens == ref.usage.prompt_tokens


def test_stream_events(client: openai.OpenAI, model: str) -> None:
    plain = _create(client, model, input=Q)
    events = list(_create(client, model, input=Q, stream=True))
    kinds = [e.type for e in events]
    head = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    tail = [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert kinds[:4] == head and kinds[-4:] == tail
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == plain.output_text
    done = events[-1].response
    assert done.status == "completed" and done.output_text == plain.output_text
    assert done.usage.input_tokens == plain.usage.input_tokens


def test_required_function_tool(client: openai.OpenAI, model: str) -> None:
    kw: Any = {"input": "What's the weather in Paris?", "tools": [TOOL], "tool_choice": "required"}
    r = _create(client, model, **kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMA)
    events = list(_create(client, model, stream=True, **kw))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.name == "get_weather" and done.arguments == calls[0].arguments
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and kinds[-1] == "response.completed"
    named: Any = {"type": "function", "name": "get_weather"}
    r = _create(client, model, input="Weather in Rome please", tools=[TOOL], tool_choice=named)
    assert [o.type for o in r.output] == ["function_call"] and r.output[0].name == "get_weather"


def test_function_call_round_trip(client: openai.OpenAI, model: str) -> None:
    ask = {"role": "user", "content": "What's the weather in Paris?"}
    first = _create(client, model, input=[ask], tools=[TOOL], tool_choice="required")
    call = next(o for o in first.output if o.type == "function_call")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}
    r = _create(client, model, input=[ask, *first.output, result], tools=[TOOL])
    ref = _chat(
        client,
        model,
        [
            ask,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 24 C"},
        ],
        tools=[CHAT_TOOL],
    )
    assert r.usage.input_tokens == ref.usage.prompt_tokens
    assert r.output_text == (ref.choices[0].message.content or "")


def test_limit_format_and_refusals(client: openai.OpenAI, model: str) -> None:
    r = _create(client, model, input=Q, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3
    person = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    fmt: Any = {"format": {"type": "json_schema", "name": "person", "schema": person}}
    r = _create(client, model, input="Give me a person as JSON.", text=fmt, max_output_tokens=40)
    jsonschema.validate(json.loads(r.output_text), person)
    with pytest.raises(openai.BadRequestError) as e:
        _create(client, model, input=Q, previous_response_id="resp_123")
    assert e.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_previous_response_id(client: openai.OpenAI, model: str) -> None:
    """A stored response continued by id: the same prompt as sending the whole
    conversation again (the stateless round trip above)."""
    ask = {"role": "user", "content": "What's the weather in Paris?"}
    first = _create(client, model, input=[ask], tools=[TOOL], tool_choice="required")
    assert client.responses.retrieve(first.id).output[0].type == "function_call"
    call = next(o for o in first.output if o.type == "function_call")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}
    whole = _create(client, model, input=[ask, *first.output, result], tools=[TOOL])
    cont = _create(client, model, previous_response_id=first.id, input=[result], tools=[TOOL])
    assert cont.previous_response_id == first.id
    assert cont.usage.input_tokens == whole.usage.input_tokens
    assert cont.output_text == whole.output_text
    # a third turn on top of the second: the conversation keeps growing
    more = _create(client, model, previous_response_id=cont.id, input="And in Rome?", tools=[TOOL])
    assert more.usage.input_tokens > cont.usage.input_tokens + cont.usage.output_tokens
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    unkept = _create(client, model, input=Q, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)
