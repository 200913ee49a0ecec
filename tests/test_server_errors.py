"""Malformed requests: each gets a 4xx with an OpenAI error object; valid ones keep working."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests import net
from tests.server_fixtures import Server

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
CMPL = {"prompt": "hi", "max_tokens": 1}

# (path, body, the param the error must name or None)
Case = tuple[str, Any, str | None]


def _with(base: dict[str, Any], **kv: Any) -> dict[str, Any]:
    return {**base, **kv}


def _without(base: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in base.items() if k != key}


def chat_cases() -> list[Case]:
    bad: list[tuple[str, Any]] = [
        ("temperature", -0.1),
        ("temperature", 2.5),
        ("temperature", "hot"),
        ("top_p", 0),
        ("top_p", 1.5),
        ("top_p", [1]),
        ("top_k", -1),
        ("top_k", 1.5),
        ("min_p", -0.1),
        ("min_p", 2),
        ("presence_penalty", 3),
        ("presence_penalty", -2.1),
        ("frequency_penalty", 9),
        ("repetition_penalty", 0),
        ("repetition_penalty", -1),
        ("max_tokens", -1),
        ("max_tokens", "10"),
        ("max_tokens", 1.5),
        ("max_tokens", 10**9),
        ("max_completion_tokens", -5),
        ("n", 0),
        ("n", 17),
        ("n", "2"),
        ("logprobs", "yes"),
        ("top_logprobs", 21),
        ("top_logprobs", -1),
        ("stop", 5),
        ("stop", [1, 2]),
        ("stop", ["a"] * 17),
        ("stream", "yes"),
        ("seed", "abc"),
        ("seed", 1.5),
        ("logit_bias", {"1": 101}),
        ("logit_bias", {"1": "x"}),
        ("logit_bias", [1, 2]),
        ("tools", "none"),
        ("tools", [{"type": "function"}]),
        ("tools", [{"type": "retrieval", "function": {"name": "f"}}]),
        ("tools", [{"type": "function", "function": {"name": "bad name!"}}]),
        ("tool_choice", "sometimes"),
        ("tool_choice", {"type": "function"}),
        ("response_format", {"type": "xml"}),
        ("response_format", "json"),
        ("stream_options", {"include_usage": "yes"}),
        ("user", 5),
        ("model", 7),
    ]
    cases: list[Case] = [("/v1/chat/completions", _with(CHAT, **{k: v}), k) for k, v in bad]
    msg_bad: list[tuple[Any, str]] = [
        ([], "messages"),
        ("hello", "messages"),
        ([{"content": "no role"}], "messages[0]"),
        ([{"role": "wizard", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        (
            [{"role": "user", "content": [{"type": "image_url"}]}],
            "messages[0].content[0].image_url",
        ),
        ([{"role": "user", "content": [{"text": "x"}]}], "messages[0].content[0]"),
        ([{"role": "user", "content": "x", "name": 3}], "messages[0].name"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {}}]}],
            "messages[0].tool_calls[0].function",
        ),
        ([["user", "hi"]], "messages[0]"),
    ]
    cases += [("/v1/chat/completions", _with(CHAT, messages=m), p) for m, p in msg_bad]
    cases += [
        ("/v1/chat/completions", _without(CHAT, "messages"), None),
        ("/v1/chat/completions", _with(CHAT, top_logprobs=2), "top_logprobs"),
        ("/v1/chat/completions", _with(CHAT, tool_choice="required"), "tool_choice"),
        ("/v1/chat/completions", _with(CHAT, logit_bias={"99999999": 1}), "logit_bias"),
        ("/v1/chat/completions", _with(CHAT, logit_bias={"abc": 1}), "logit_bias"),
        (
            "/v1/chat/completions",
            _with(CHAT, response_format={"type": "json_schema"}),
            "response_format.json_schema",
        ),
        ("/v1/chat/completions", _with(CHAT, model="gpt-17"), None),
        (
            "/v1/chat/completions",
            _with(
                CHAT,
                tools=[{"type": "function", "function": {"name": "f"}}],
                tool_choice={"type": "function", "function": {"name": "g"}},
            ),
            "tool_choice",
        ),
    ]
    return cases


def completion_cases() -> list[Case]:
    bad: list[tuple[str, Any]] = [
        ("prompt", 5),
        ("prompt", []),
        ("prompt", None),
        ("prompt", [{"a": 1}]),
        ("prompt", [-1]),
        ("prompt", [[1, 2], "x"]),
        ("prompt", [999999999]),
        ("prompt", [[]]),
        ("best_of", 0),
        ("best_of", 30),
        ("echo", "no"),
        ("suffix", 3),
        ("logprobs", 6),
        ("logprobs", -1),
        ("n", 100),
        ("max_tokens", -3),
        ("temperature", 3),
        ("stop", {"a": 1}),
    ]
    cases: list[Case] = [("/v1/completions", _with(CMPL, **{k: v}), k) for k, v in bad]
    cases += [
        ("/v1/completions", _with(CMPL, n=3, best_of=2), "best_of"),
        ("/v1/completions", _with(CMPL, best_of=2, stream=True), "best_of"),
        ("/v1/completions", _with(CMPL, model="nope"), None),
        ("/v1/completions", _without(CMPL, "prompt"), None),
        ("/v1/completions", _with(CMPL, prompt="word " * 9000), "prompt"),
    ]
    return cases


def other_cases() -> list[Case]:
    return [
        ("/v1/embeddings", {"input": "x"}, "model"),  # SmolLM2 is not an embedding model
        ("/v1/embeddings", {"input": 5}, "input"),
        ("/v1/embeddings", {"input": "x", "encoding_format": "hex"}, "encoding_format"),
        ("/v1/embeddings", {}, None),
        ("/tokenize", {"content": 5}, "content"),
        ("/tokenize", {}, "content"),
        ("/tokenize", {"content": "x", "add_special": "yes"}, "add_special"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens[0]"),
        ("/detokenize", {"tokens": [10**8]}, "tokens"),
        ("/detokenize", {}, None),
        ("/complete", {"prompt": 1}, "prompt"),
        ("/complete", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
        ("/chat", {"messages": "hi"}, "messages"),
        ("/chat/stream", {"messages": [{"role": "x"}]}, "messages[0].role"),
        ("/infer", {"inputs": [[1.0, 2.0]]}, "inputs"),
        ("/infer", {"inputs": "x"}, "inputs"),
        ("/embeddings", {"input": "x"}, "model"),
        ("/embedding", {"content": "x"}, "model"),
        ("/embedding", {"content": "x", "embd_normalize": "l2"}, "embd_normalize"),
        ("/lora/load", {"path": "/tmp/x"}, None),
        ("/lora/load", {"path": ""}, "path"),
        ("/api/generate", {"prompt": "x"}, None),
        ("/api/generate", {"model": "other", "prompt": "x"}, None),
        ("/api/generate", {"model": "x", "options": {"temperature": "hot"}}, "options.temperature"),
        ("/api/chat", {"model": "x", "messages": 5}, "messages"),
        ("/api/embed", {"model": "x"}, None),
    ]


def raw_cases() -> list[tuple[str, bytes, dict[str, str]]]:
    """Bodies that are not JSON objects at all."""
    bodies = [
        b"",
        b"{",
        b"not json",
        b'{"messages": [}',
        b"[]",
        b"null",
        b"42",
        b'"str"',
        b"\xff\xfe\x00",
        b'{"messages": [{"role": "user", "content": "hi"}]',
        b"{}{}",
    ]
    out = [("/v1/chat/completions", b, {"Content-Type": "application/json"}) for b in bodies]
    out += [("/v1/completions", b, {}) for b in bodies[:4]]
    return out


def check_error(r: httpx.Response, param: str | None) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    body = r.json()
    if r.url.path.startswith("/api/"):  # Ollama's routes answer in Ollama's shape
        assert list(body) == ["error"] and isinstance(body["error"], str) and body["error"]
        assert param is None or param in body["error"], (param, body)
        return
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    assert "param" in err and "code" in err
    if param is not None:  # the field, or a part of it (stop -> stop[0])
        got = err["param"] or ""
        assert got == param or got.startswith((f"{param}[", f"{param}.")), (param, err)


def test_malformed_requests(smol_server: Server) -> None:
    url = smol_server.url
    n = 0
    with net.client(base_url=url, timeout=60) as c:

        def valid() -> None:
            r = c.post("/v1/chat/completions", json=_with(CHAT, temperature=0))
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] is not None

        for path, body, param in chat_cases() + completion_cases() + other_cases():
            check_error(c.post(path, content=json.dumps(body)), param)
            n += 1
            if n % 20 == 0:
                valid()
        for path, raw, headers in raw_cases():
            r = c.post(path, content=raw, headers=headers)
            check_error(r, None)
            assert r.status_code == 400
            n += 1
        big = b'{"prompt": "' + b"a" * (9 * 1024 * 1024) + b'"}'
        r = c.post("/v1/completions", content=big)
        assert r.status_code == 413
        check_error(r, None)
        for method, path in [
            ("GET", "/v1/chat/completions"),
            ("DELETE", "/v1/models"),
            ("GET", "/nope"),
        ]:
            check_error(c.request(method, path), None)
        n += 4
        r = c.get("/v1/models/unknown-model")
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        n += 1
        valid()
    assert n >= 100


@pytest.mark.parametrize("param", ["temperature", "messages[0].role"])
def test_error_names_field_in_message(smol_server: Server, param: str) -> None:
    body = (
        _with(CHAT, temperature=9)
        if param == "temperature"
        else _with(CHAT, messages=[{"role": "x"}])
    )
    r = net.post(f"{smol_server.url}/v1/chat/completions", json=body)
    assert r.status_code == 400
    assert param in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "extreme",
    [
        {"repetition_penalty": 1e-300},
        {"repetition_penalty": 10.0},
        {"temperature": 1e-9},
        {"temperature": 2.0, "top_p": 1e-9},
        {"min_p": 1.0},
        {"top_k": 1_000_000},
        {"logit_bias": {"1": 100.0, "2": -100.0}},
        {"presence_penalty": 2.0, "frequency_penalty": -2.0},
    ],
)
def test_schema_valid_extremes_are_served(smol_server: Server, extreme: dict[str, Any]) -> None:
    """Every value the schema admits is served (issue 15: repetition_penalty 1e-300 was a
    500 'Probabilities contain NaN'); the same body twice with a seed answers the same."""
    body = {"prompt": "The capital of France is", "max_tokens": 4, "seed": 3, **extreme}
    r = net.post(f"{smol_server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    again = net.post(f"{smol_server.url}/v1/completions", json=body, timeout=60).json()
    assert again["choices"][0]["text"] == r.json()["choices"][0]["text"]
    assert r.json()["usage"]["completion_tokens"] in range(1, 5)
