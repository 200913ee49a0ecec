"""Server pieces that need no running server: tool-call parsing, rate limiting, errors, app config."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from modelc.engine.api import ConstraintKind
from modelc.errors import CapacityError, ModelNotFoundError
from modelc.server.auth import RateLimiter, check_api_key
from modelc.server.errors import AuthError, RateLimitError, to_error
from modelc.server.openai.schemas import ChatCompletionRequest
from modelc.server.schemas import DECODERS, NamedFunction, NamedToolChoice
from modelc.server.tools import choice_constraint, may_be_call, parse_tool_calls
from tests.test_chat_formats import template


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (
            '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
            None,
            [("f", {"x": 1})],
        ),
        ('Sure. <tool_call>{"name": "f", "arguments": {}}</tool_call>', "Sure.", [("f", {})]),
        (
            '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {"y": "z"}}</tool_call>',
            None,
            [("a", {}), ("b", {"y": "z"})],
        ),
        (
            '<tool_call>{"name": "f", "arguments": {"x": 2}}',
            None,
            [("f", {"x": 2})],
        ),  # unclosed at EOS
        ('{"name": "f", "arguments": {"q": "v"}}', None, [("f", {"q": "v"})]),
        ('  [{"name": "f", "parameters": {"q": 1}}]', None, [("f", {"q": 1})]),
        ('{"name": "f", "arguments": "{\\"k\\": 3}"}', None, [("f", {"k": 3})]),
        ("plain answer", "plain answer", []),
        ('{"not": "a call"}', '{"not": "a call"}', []),
        ("<tool_call>{broken</tool_call>", "<tool_call>{broken</tool_call>", []),
    ],
)
def test_parse_tool_calls(
    text: str, content: str | None, calls: list[tuple[str, dict[str, object]]]
) -> None:
    got_content, got = parse_tool_calls(text)
    assert got_content == content
    assert [(c.function.name, json.loads(c.function.arguments)) for c in got] == calls
    assert all(c.id.startswith("call_") and c.type == "function" for c in got)


def test_may_be_call() -> None:
    assert may_be_call("") and may_be_call("  ") and may_be_call("<tool") and may_be_call(' {"na')
    assert may_be_call("<tool_call>{") and not may_be_call("Hello") and not may_be_call("<b>")


def test_choice_constraint_schema() -> None:
    req = DECODERS[ChatCompletionRequest].decode(
        json.dumps(
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "object"}},
                    },
                    {"type": "function", "function": {"name": "g"}},
                ],
            }
        ).encode()
    )
    assert req.tools is not None
    assert choice_constraint(req.tools, "auto") is None
    # a family without a call grammar (Functionary v3.2): bare JSON of the call
    v32 = template("meetkai-functionary-medium-v3.2")
    g = NamedToolChoice("function", NamedFunction("g"))
    named = choice_constraint(req.tools, g, template=v32)
    assert named is not None and named.fmt.name == "json"
    assert json.loads(named.constraint.value)["properties"]["name"] == {"const": "g"}
    required = choice_constraint(req.tools, "required", template=v32)
    assert required is not None and len(json.loads(required.constraint.value)["anyOf"]) == 2
    # Hermes (a template that names no family): its own <tool_call> markup
    hermes = choice_constraint(req.tools, "required")
    assert hermes is not None and hermes.fmt.name == "hermes"
    assert hermes.constraint.kind is ConstraintKind.GRAMMAR
    assert '"<tool_call>' in hermes.constraint.value


def test_rate_limiter_window() -> None:
    rl = RateLimiter(3)
    for t in (0.0, 1.0, 2.0):
        rl.check("a", now=t)
    rl.check("b", now=2.0)  # per client address
    with pytest.raises(RateLimitError) as e:
        rl.check("a", now=30.0)
    assert e.value.retry_after == 30
    rl.check("a", now=60.5)  # the first hit left the window
    RateLimiter(0).check("a")  # off


def test_api_key() -> None:
    check_api_key(None, None, None)
    check_api_key("k", "Bearer k", None)
    check_api_key("k", None, "k")
    for auth in (None, "Bearer x", "Basic k", "k"):
        with pytest.raises(AuthError):
            check_api_key("k", auth, None)


def test_to_error_mapping() -> None:
    try:
        DECODERS[ChatCompletionRequest].decode(b'{"messages": [{"role": "user"}], "n": 99}')
    except msgspec.ValidationError as e:
        status, body, _ = to_error(e)
    assert status == 400 and json.loads(body)["error"]["param"] == "n"
    status, body, headers = to_error(CapacityError("queue full"))
    assert status == 503 and headers["Retry-After"] == "1"
    assert json.loads(body)["error"] == {
        "message": "queue full",
        "type": "server_overloaded",
        "param": None,
        "code": None,
    }
    status, body, _ = to_error(ModelNotFoundError("nope"))
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
    status, body, _ = to_error(RuntimeError("secret internals"))
    assert status == 500 and "secret" not in body.decode()


def test_app_has_no_response_timeout() -> None:
    from modelc.server.app import create_app
    from modelc.server.state import ServerState

    app = create_app(ServerState("x"))
    assert app.config["RESPONSE_TIMEOUT"] is None  # Quart's 60 s would cut long streams
    assert app.config["MAX_CONTENT_LENGTH"] == 8 * 1024 * 1024


@pytest.mark.parametrize(("given", "expected"), [("", True), (', "speculative": false', False)])
def test_a_request_can_opt_out_of_speculation(given: str, expected: bool) -> None:
    from modelc.runtime.sampling import SamplingParams
    from modelc.server.generation import make_requests

    body = f'{{"messages": [{{"role": "user", "content": "hi"}}]{given}}}'
    req = msgspec.json.decode(body, type=ChatCompletionRequest)
    reqs = make_requests("c", [1, 2], SamplingParams(), 2, speculative=req.speculative)
    assert [r.speculative for r in reqs] == [expected, expected]


def _run_engine_options(monkeypatch: pytest.MonkeyPatch, flags: list[str]) -> Any:
    """The engine options ``modelc run some-model *flags`` would serve with."""
    import argparse

    import modelc.cli.run as cli_run
    import modelc.server.serve as serve_mod

    seen: dict[str, Any] = {}

    def fake_serve(opts: Any) -> int:
        seen["opts"] = opts
        return 0

    monkeypatch.setattr(serve_mod, "check_bind", lambda host, port: None)
    monkeypatch.setattr(serve_mod, "serve", fake_serve)
    monkeypatch.setattr(cli_run, "_resolve", lambda arg: arg)
    parser = argparse.ArgumentParser()
    cli_run.register(parser.add_subparsers())
    args = parser.parse_args(["run", "some-model", *flags])
    args.func(args)
    return seen["opts"].engine


@pytest.mark.parametrize(
    ("flags", "speculative", "adaptive", "gamma", "min_prompt"),
    [
        ([], True, True, 8, 128),
        (["--speculate", "off"], False, False, 8, 128),
        (["--speculate", "fixed", "--spec-max", "4"], True, False, 4, 128),
        (["--spec-min-prompt", "64"], True, True, 8, 64),
    ],
)
def test_run_speculation_flags(
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    speculative: bool,
    adaptive: bool,
    gamma: int,
    min_prompt: int,
) -> None:
    """``modelc run --speculate/--spec-max/--spec-min-prompt`` reach the engine options."""
    eng = _run_engine_options(monkeypatch, flags)
    assert (eng.speculative, eng.spec_adaptive, eng.spec_gamma, eng.spec_min_prompt) == (
        speculative,
        adaptive,
        gamma,
        min_prompt,
    )


@pytest.mark.parametrize(("flags", "full"), [([], False), (["--swa-full"], True)])
def test_run_swa_full_flag(monkeypatch: pytest.MonkeyPatch, flags: list[str], full: bool) -> None:
    """``modelc run --swa-full`` reaches the engine options (off by default, as llama.cpp)."""
    assert _run_engine_options(monkeypatch, flags).swa_full is full
