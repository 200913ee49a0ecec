"""The official ``openai`` client against ``modelc run`` on SmolLM2 and MiniLM."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import openai
import pytest

from modelc.bench.llamacpp import LlamaCppServer
from tests import net
from tests.server_fixtures import Server

MSG = [{"role": "user", "content": "What is the capital of France?"}]


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
def model_id(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_models_list_and_retrieve(client: openai.OpenAI, model_id: str) -> None:
    models = client.models.list()
    assert len(models.data) == 1 and models.data[0].object == "model"
    card = client.models.retrieve(model_id)
    assert card.id == model_id
    assert card.model_extra and card.model_extra["root"].endswith(".modelc")
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_chat_plain(client: openai.OpenAI, model_id: str, llamacpp: LlamaCppServer) -> None:
    # (a question whose greedy answer is no near-tie in either engine's int8 arithmetic)
    msg = [{"role": "user", "content": "What is the capital of France? Answer briefly."}]
    r = client.chat.completions.create(model=model_id, messages=msg, max_tokens=32, temperature=0)
    assert r.object == "chat.completion" and len(r.choices) == 1
    c = r.choices[0]
    # llama.cpp's server on the same GGUF answers the same, and stops at the end of the turn
    ref = net.post(
        f"{llamacpp.url}/v1/chat/completions",
        json={"messages": msg, "max_tokens": 32, "temperature": 0},
        timeout=120,
    ).json()
    assert c.message.role == "assistant"
    assert c.message.content == ref["choices"][0]["message"]["content"]
    assert c.finish_reason == ref["choices"][0]["finish_reason"] == "stop"
    assert r.usage is not None and r.usage.prompt_tokens == ref["usage"]["prompt_tokens"]
    assert r.usage.completion_tokens == ref["usage"]["completion_tokens"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streamed_matches_plain(client: openai.OpenAI, model_id: str) -> None:
    plain = client.chat.completions.create(
        model=model_id, messages=MSG, max_tokens=8, temperature=0
    )
    stream = client.chat.completions.create(
        model=model_id,
        messages=MSG,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens  # type: ignore[union-attr]


def test_chat_n3_seeded(client: openai.OpenAI, model_id: str) -> None:
    r = client.chat.completions.create(
        model=model_id, messages=MSG, max_tokens=6, temperature=1.0, n=3, seed=7
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    # choice i is what a single request seeded 7 + i answers
    singles = [
        client.chat.completions.create(
            model=model_id, messages=MSG, max_tokens=6, temperature=1.0, seed=7 + i
        )
        for i in range(3)
    ]
    assert [c.message.content for c in r.choices] == [s.choices[0].message.content for s in singles]
    assert r.usage is not None
    assert r.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)  # type: ignore[union-attr]


def test_chat_logprobs(client: openai.OpenAI, model_id: str) -> None:
    r = client.chat.completions.create(
        model=model_id, messages=MSG, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content
    assert len(lp.content) == r.usage.completion_tokens  # type: ignore[union-attr]
    for t in lp.content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob, abs=1e-4)
    assert (
        "".join(t.token for t in lp.content).strip() in (r.choices[0].message.content or "") + " "
    )


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def test_chat_tools_required(client: openai.OpenAI, model_id: str) -> None:
    r = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        max_tokens=40,
        temperature=0,
    )
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c.message
    calls = c.message.tool_calls
    assert calls and calls[0].type == "function" and calls[0].function.name == "get_weather"
    args = json.loads(calls[0].function.arguments)
    # the schema's keys only: an object that lists its properties is closed, as llama.cpp's
    # grammar converter closes it (this call added "temperature" while it was open)
    assert set(args) == {"city"} and isinstance(args["city"], str)


def test_chat_tools_named_streamed(client: openai.OpenAI, model_id: str) -> None:
    stream = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Weather in Rome please"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=40,
        temperature=0,
        stream=True,
    )
    name, args, finish = "", "", None
    for ch in stream:
        for d in ch.choices:
            for tc in d.delta.tool_calls or []:
                name += (tc.function.name or "") if tc.function else ""
                args += (tc.function.arguments or "") if tc.function else ""
            finish = d.finish_reason or finish
    assert name == "get_weather" and finish == "tool_calls"
    assert "city" in json.loads(args)


def test_chat_json_schema(client: openai.OpenAI, model_id: str) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Give me a person as JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema},
        },
        max_tokens=40,
        temperature=0,
    )
    obj = json.loads(r.choices[0].message.content or "")
    assert set(obj) == {"name", "age"} and isinstance(obj["age"], int)


OPEN_SCHEMAS = [  # no additionalProperties: each prompt asks for a key the schema lacks
    (
        {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}},
        "Give me a person as JSON with their name, age and city.",
    ),
    (
        {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
        "The weather in Paris for the next 3 days, as JSON with a unit too.",
    ),
    (
        {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "tags": {"type": "array", "items": {"properties": {"name": {"type": "string"}}}},
            },
            "required": ["title", "tags"],
        },
        "A blog post as JSON: title, tags (each with a name and a color), author.",
    ),
]


def _keys(obj: Any) -> set[str]:
    """Every key of every object in ``obj``."""
    if isinstance(obj, dict):
        return set(obj).union(*(_keys(v) for v in obj.values()))
    if isinstance(obj, list):
        return set().union(*(_keys(v) for v in obj))
    return set()


def _declared(schema: Any) -> set[str]:
    """Every property a schema names, at any depth."""
    if not isinstance(schema, dict):
        return set()
    props = schema.get("properties", {})
    return set(props).union(*(_declared(v) for v in [*props.values(), schema.get("items")]))


@pytest.mark.parametrize(("schema", "ask"), OPEN_SCHEMAS)
def test_json_schema_objects_closed_as_llamacpps(
    client: openai.OpenAI, model_id: str, llamacpp: LlamaCppServer, schema: Any, ask: str
) -> None:
    """A schema's objects that list properties without additionalProperties take no other
    key, as llama-server's answer to the same request on the same GGUF (its grammar
    converter's rule; JSON Schema's own would admit any: every answer here added one)."""
    msg = [{"role": "user", "content": ask}]
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    r = client.chat.completions.create(
        model=model_id,
        messages=msg,
        response_format=fmt,
        max_tokens=80,
        temperature=0,  # type: ignore[arg-type]
    )
    ref = net.post(
        f"{llamacpp.url}/v1/chat/completions",
        json={"messages": msg, "max_tokens": 80, "temperature": 0, "response_format": fmt},
        timeout=120,
    ).json()
    got, want = (
        json.loads(r.choices[0].message.content or ""),
        json.loads(ref["choices"][0]["message"]["content"]),
    )
    assert set(got) == set(want) and _keys(got) <= _declared(schema), (got, want)


def test_completions_echo_and_prompt_logprobs(client: openai.OpenAI, model_id: str) -> None:
    prompt = "The sky is"
    plain = client.completions.create(model=model_id, prompt=prompt, max_tokens=4, temperature=0)
    r = client.completions.create(
        model=model_id, prompt=prompt, max_tokens=4, temperature=0, echo=True, logprobs=2
    )
    assert r.object == "text_completion"
    assert r.choices[0].text == prompt + plain.choices[0].text  # the prompt, then the text
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    n_prompt = r.usage.prompt_tokens  # type: ignore[union-attr]
    # the legacy API's echo: the prompt's tokens come first, the first without a log-prob
    assert "".join(lp.tokens[:n_prompt]) == prompt and lp.tokens[n_prompt:] != []
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert lp.text_offset[:n_prompt] == [0, 3, 7][:n_prompt]
    # a prompt token's log-prob is the one the model gives it after the tokens before it:
    # greedily continuing "The" gives " sky"'s log-prob as its top alternative when it is
    # the model's choice, and never more than the best alternative's
    for k in range(1, n_prompt):
        best = max(lp.top_logprobs[k].values())  # type: ignore[union-attr]
        assert lp.token_logprobs[k] <= best + 1e-6
    one = client.completions.create(
        model=model_id, prompt="The", max_tokens=1, temperature=0, logprobs=2
    )
    tops = one.choices[0].logprobs.top_logprobs[0]  # type: ignore[union-attr,index]
    assert lp.top_logprobs[1] == pytest.approx(tops, abs=1e-4)


def test_completions_suffix_needs_fill_in_the_middle(client: openai.OpenAI, model_id: str) -> None:
    # the suffix is the text after the insertion point: SmolLM2 has no FIM tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_id, prompt="def f(", suffix="):", max_tokens=4)
    assert e.value.body["param"] == "suffix"  # type: ignore[index]
    assert "fill-in-the-middle" in e.value.body["message"]  # type: ignore[index]


def test_max_tokens_zero_is_refused(client: openai.OpenAI, model_id: str) -> None:
    for call in (
        lambda: client.completions.create(model=model_id, prompt="Hi", max_tokens=0),
        lambda: client.chat.completions.create(model=model_id, messages=MSG, max_tokens=0),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.body["param"] == "max_tokens"  # type: ignore[index]


def test_completions_best_of(client: openai.OpenAI, model_id: str) -> None:
    kw: dict[str, Any] = {
        "model": model_id,
        "prompt": "Once upon a time",
        "max_tokens": 4,
        "temperature": 1.0,
        "seed": 5,
    }
    # the same three candidates (seeds 5, 6, 7), all returned, with their log-probabilities
    all3 = client.completions.create(n=3, logprobs=0, **kw)
    scores = [sum(c.logprobs.token_logprobs) for c in all3.choices]  # type: ignore[arg-type, union-attr]
    best = all3.choices[scores.index(max(scores))].text
    r = client.completions.create(n=1, best_of=3, **kw)
    assert len(r.choices) == 1 and r.choices[0].text == best
    assert r.choices[0].logprobs is None  # not asked for
    assert r.usage is not None and r.usage.completion_tokens == all3.usage.completion_tokens  # type: ignore[union-attr]
    with_lp = client.completions.create(n=1, best_of=3, logprobs=1, **kw)
    lp = with_lp.choices[0].logprobs
    assert (
        lp is not None
        and lp.token_logprobs
        and all(x is not None and x <= 0 for x in lp.token_logprobs)
    )


def test_completions_batch_and_token_prompt(
    client: openai.OpenAI, model_id: str, smol_server: Server
) -> None:
    r = client.completions.create(
        model=model_id, prompt=["Hello", "One, two,"], max_tokens=3, temperature=0
    )
    assert [c.index for c in r.choices] == [0, 1]
    single = client.completions.create(
        model=model_id, prompt="One, two,", max_tokens=3, temperature=0
    )
    assert r.choices[1].text == single.choices[0].text
    ids = net.post(f"{smol_server.url}/tokenize", json={"content": "One, two,"}).json()["tokens"]
    by_ids = client.completions.create(model=model_id, prompt=ids, max_tokens=3, temperature=0)
    assert by_ids.choices[0].text == single.choices[0].text


def test_completions_stream(client: openai.OpenAI, model_id: str) -> None:
    plain = client.completions.create(
        model=model_id, prompt="Paris is", max_tokens=5, temperature=0
    )
    text = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=model_id, prompt="Paris is", max_tokens=5, temperature=0, stream=True
        )
        if c.choices
    )
    assert text == plain.choices[0].text


def test_stream_events_that_piled_up_go_out_in_one_write(
    client: openai.OpenAI, model_id: str, smol_server: Server
) -> None:
    """With n=4 the choices stream one after another, so the later choices' tokens pile up
    meanwhile: they go out in a few writes, not one write a token, and say the same."""
    kw: dict[str, Any] = dict(
        model=model_id, prompt="Once upon a time", max_tokens=16, temperature=0, n=4
    )
    plain = client.completions.create(**kw, extra_body={"ignore_eos": True})
    writes = smol_server.metric("modelc_stream_writes_total")
    texts = ["", "", "", ""]
    for c in client.completions.create(**kw, stream=True, extra_body={"ignore_eos": True}):
        for ch in c.choices:
            texts[ch.index] += ch.text
    writes = smol_server.metric("modelc_stream_writes_total") - writes
    assert texts == [ch.text for ch in sorted(plain.choices, key=lambda ch: ch.index)]
    assert plain.usage is not None and plain.usage.completion_tokens == 64
    assert writes < 40, f"{writes} writes for 64 streamed tokens"


def test_embeddings_refused_for_llm(client: openai.OpenAI, model_id: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=model_id, input="hi")
    assert "embedding model" in e.value.body["message"]  # type: ignore[index]


# --- MiniLM ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def eclient(minilm_server: Server) -> openai.OpenAI:
    return openai.OpenAI(
        http_client=net.openai_http(),
        base_url=f"{minilm_server.url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=120,
    )


def test_embeddings_float_and_base64(eclient: openai.OpenAI) -> None:
    mid = eclient.models.list().data[0].id
    texts = ["A cat sits on the mat.", "A kitten rests on a rug.", "Stock markets fell today."]
    r = eclient.embeddings.create(model=mid, input=texts, encoding_format="float")
    assert [d.index for d in r.data] == [0, 1, 2]
    v = np.array([d.embedding for d in r.data])
    assert v.shape == (3, 384)
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-3)  # all-MiniLM-L6-v2 normalizes
    sims = v @ v.T
    assert sims[0, 1] > sims[0, 2] + 0.2  # the two cat sentences are closer
    assert r.usage.prompt_tokens == r.usage.total_tokens > 0
    b = eclient.embeddings.with_raw_response.create(
        model=mid, input=texts[0], encoding_format="base64"
    )
    raw = b.http_response.json()["data"][0]["embedding"]
    vb = np.frombuffer(base64.b64decode(raw), "<f4")
    assert np.allclose(vb, v[0], atol=1e-6)
    # the client decodes base64 itself when no format is asked for
    auto = eclient.embeddings.create(model=mid, input=texts[0])
    assert np.allclose(auto.data[0].embedding, v[0], atol=1e-6)


def test_minilm_models_and_chat_refused(eclient: openai.OpenAI) -> None:
    mid = eclient.models.list().data[0].id
    assert eclient.models.retrieve(mid).id == mid
    with pytest.raises(openai.BadRequestError):
        eclient.chat.completions.create(model=mid, messages=MSG, max_tokens=2)


def test_stop_and_logit_bias(client: openai.OpenAI, model_id: str, smol_server: Server) -> None:
    kw: dict[str, Any] = {
        "model": model_id,
        "prompt": "1, 2, 3, 4,",
        "max_tokens": 10,
        "temperature": 0,
    }
    full = client.completions.create(**kw).choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    cut = client.completions.create(stop=[stop], **kw).choices[0]
    assert cut.text == full[: full.index(stop)] and cut.finish_reason == "stop"
    # a +100 bias on one token makes greedy decoding pick it every time
    tid = net.post(f"{smol_server.url}/tokenize", json={"content": " banana"}).json()["tokens"]
    assert len(tid) == 1
    r = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "hi", "name": "alice"}],  # type: ignore[list-item]
        max_tokens=3,
        temperature=0,
        logit_bias={str(tid[0]): 100},
        user="u1",
        presence_penalty=0.5,
        frequency_penalty=0.5,
        extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1},
    )
    assert r.choices[0].message.content == " banana" * 3


def test_chat_stream_prompt_progress(smol_server: Server) -> None:
    """llama.cpp's return_progress: while a long prompt is processed (256-token steps),
    chunks with prompt_progress, processed rising to the total, before the first token."""
    long_text = "The quick brown fox jumps over the lazy dog. " * 70
    body = {
        "messages": [{"role": "user", "content": long_text + "Summarise."}],
        "max_tokens": 2,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_progress": True,
    }
    events = []
    with net.stream("POST", f"{smol_server.url}/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    first_text = next(
        k for k, e in enumerate(events) if e["choices"] and e["choices"][0]["delta"].get("content")
    )
    usage = events[-1]["usage"]
    total = usage["prompt_tokens"]
    assert total > 512  # three prefill steps at least
    assert [p["total"] for p in progress] == [total] * len(progress)
    done = [p["processed"] for p in progress]
    assert len(done) >= 3 and done == sorted(done) and done[-1] == total
    assert done[0] == 256 + progress[0]["cache"]  # one 256-token step (after any cached prefix)
    last_progress = max(k for k, e in enumerate(events) if "prompt_progress" in e)
    assert last_progress < first_text
