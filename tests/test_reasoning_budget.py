"""The reasoning budget (llama.cpp's ``--reasoning-budget`` / ``reasoning_budget_tokens``,
``common/reasoning-budget.cpp``): the state machine on known token sequences, and a
served Qwen3.5 template (the prompt opens the trace) whose forced trace ends equal
llama.cpp's server with the same template file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelc.bench.llamacpp import LlamaCppServer
from modelc.runtime.reasoning_budget import BudgetSampler, BudgetState, ReasoningBudget
from tests import net
from tests.assets import smollm2_gguf
from tests.server_fixtures import Server, start
from tests.test_chat_formats import TEMPLATES

START, END, MSG = (1,), (9, 8), (7,)


def run(budget: int, tokens: list[int], prefill: tuple[int, ...] = ()) -> list[int | None]:
    """The forced token before each of ``tokens`` (None: free), accepting each after."""
    b = BudgetSampler(ReasoningBudget(budget, START, (END,), MSG + END, prefill, frozenset({5})))
    out: list[int | None] = []
    for t in tokens:
        out.append(b.forced_token())
        b.accept(t)
    return out


def test_state_machine_known_answers() -> None:
    # two tokens after the start tag, then the message and the end tag, then free again
    assert run(2, [1, 3, 4, 7, 9, 8, 3]) == [None, None, None, 7, 9, 8, None]
    # a start tag in the prefill (the prompt opened the trace) starts the count there
    assert run(2, [3, 4, 7, 9, 8], prefill=(1,)) == [None, None, 7, 9, 8]
    # 0: forced at once; a prefill token after the tag takes the first forced place
    assert run(0, [7, 9, 8], prefill=(1,)) == [7, 9, 8]
    assert run(0, [9, 8], prefill=(1, 3)) == [9, 8]
    # an end tag within the budget ends the trace; a new start tag opens a new window
    assert run(3, [1, 9, 8, 3, 3, 3, 1, 3, 3, 3, 7]) == [None] * 10 + [7]
    # a token ending inside a UTF-8 character (5) delays the force by one token
    assert run(2, [1, 3, 5, 6, 7], prefill=()) == [None, None, None, None, 7]
    b = BudgetSampler(ReasoningBudget(1, START, (END,), MSG + END))
    assert b.state is BudgetState.IDLE
    b.accept(3)
    assert b.forced_token() is None  # no trace opened: nothing to count


QWEN35 = TEMPLATES / "Qwen3.5-4B.jinja"
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def srv() -> Iterator[Server]:
    """SmolLM2 with Qwen3.5's template, a 1-token budget by default."""
    s = start(
        str(smollm2_gguf()),
        *("--alias", "m", "--chat-template-file", str(QWEN35), "--reasoning-budget", "1"),
    )
    yield s
    s.stop()


def body(budget: int | None, **kw: Any) -> dict[str, Any]:
    b: dict[str, Any] = {"messages": USER, "max_tokens": 12, "temperature": 0}
    b |= {"reasoning_format": "none", **kw}
    return b if budget is None else {**b, "reasoning_budget_tokens": budget}


def content(url: str, b: dict[str, Any]) -> tuple[str, list[int], list[int]]:
    r = net.post(f"{url}/v1/chat/completions", json={"model": "m", **b}, timeout=300)
    assert r.status_code == 200, r.text
    got = r.json()
    choice = got["choices"][0]
    return choice["message"]["content"], got.get("prompt_token_ids"), choice.get("token_ids")


def test_budget_ends_the_trace_as_llamacpp(srv: Server, tmp_path: Path) -> None:
    """Budgets 0 and 1 (the trace's end forced after the prompt's ``<think>\\n``, then
    after one token) give llama.cpp's text up to the end of the trace; the budget leaves
    the prompt alone (the same prompt ids as llama.cpp's for 0); the server's
    ``--reasoning-budget`` is the default (-1 in a request: that default)."""
    with LlamaCppServer(
        smollm2_gguf(),
        threads=1,
        n_parallel=1,
        n_ctx=4096,
        chat_template=QWEN35,
        log=tmp_path / "l",
    ) as peer:
        theirs = {}
        for n in (0, 1):
            r = net.post(f"{peer.url}/v1/chat/completions", json=body(n), timeout=300)
            theirs[n] = r.json()["choices"][0]["message"]["content"]
        text = net.post(f"{peer.url}/apply-template", json={"messages": USER}, timeout=60)
        their_ids = net.post(
            f"{peer.url}/tokenize",
            json={"content": text.json()["prompt"], "add_special": True, "parse_special": True},
            timeout=60,
        ).json()["tokens"]
    for n in (0, 1):
        mine, _, _ = content(srv.url, body(n))
        cut = theirs[n].index("</think>") + len("</think>")
        assert mine[:cut] == theirs[n][:cut], n
    assert theirs[0].startswith("<think>\n</think>")  # 0: nothing but the end
    _, prompt_ids, _ = content(srv.url, body(0, return_token_ids=True))
    assert prompt_ids == their_ids
    assert content(srv.url, body(None))[0] == content(srv.url, body(1))[0]  # the default
    assert content(srv.url, body(-1))[0] == content(srv.url, body(1))[0]


def test_budget_known_answer_with_a_message(srv: Server) -> None:
    """Budget 3 with a message: the prompt's ``\\n`` and two free tokens (the unbudgeted
    answer's first two), then the message and ``\\n</think>`` forced; the trace splits
    into ``reasoning_content`` there."""
    free = content(srv.url, body(1000, return_token_ids=True))[2]
    forced = [  # the message's tokens, then the end tag's (as llama.cpp)
        t
        for text in ("Done.", "\n</think>")
        for t in net.post(f"{srv.url}/tokenize", json={"model": "m", "content": text}).json()[
            "tokens"
        ]
    ]
    _, _, ids = content(srv.url, body(3, return_token_ids=True, reasoning_budget_message="Done."))
    assert ids[: 2 + len(forced)] == free[:2] + forced
    r = net.post(
        f"{srv.url}/v1/chat/completions",
        json={
            "model": "m",
            **body(3, reasoning_budget_message="Done."),
            "reasoning_format": "auto",
        },
        timeout=300,
    ).json()["choices"][0]["message"]
    assert r["reasoning_content"].endswith("Done.\n")  # (the split keeps the newline)


def test_messages_thinking_budget_tokens(srv: Server) -> None:
    """Messages' ``thinking.budget_tokens`` is the same budget: its ``thinking`` block is
    the chat route's ``reasoning_content`` for that budget."""
    chat = net.post(
        f"{srv.url}/v1/chat/completions",
        json={"model": "m", **body(4)} | {"reasoning_format": "auto"},
        timeout=300,
    ).json()["choices"][0]["message"]
    msg = net.post(
        f"{srv.url}/v1/messages",
        json={
            "model": "m",
            "messages": USER,
            "max_tokens": 12,
            "temperature": 0,
            "thinking": {"type": "enabled", "budget_tokens": 4},
        },
        timeout=300,
    ).json()
    thinking = [b["thinking"] for b in msg["content"] if b["type"] == "thinking"]
    assert thinking == [chat["reasoning_content"]] and chat["reasoning_content"]


def test_ollama_gets_the_server_budget(srv: Server) -> None:
    """Ollama's routes take the server's ``--reasoning-budget`` (1 here): the trace ends
    after one token, so 12 tokens reach an answer, as on the chat route (unbudgeted,
    they are all trace)."""
    chat = net.post(
        f"{srv.url}/v1/chat/completions",
        json={"model": "m", **body(None)} | {"reasoning_format": "auto"},
        timeout=300,
    ).json()["choices"][0]["message"]
    opts = {"num_predict": 12, "temperature": 0}
    got = net.post(
        f"{srv.url}/api/chat",
        json={"model": "m", "messages": USER, "stream": False, "options": opts},
        timeout=300,
    ).json()["message"]
    assert got["content"] and got["content"] == chat["content"]
    assert (got.get("thinking") or "") == (chat.get("reasoning_content") or "")
    unbudgeted = content(srv.url, body(1000) | {"reasoning_format": "auto"})[0]
    assert not unbudgeted


SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}


@pytest.fixture(scope="module")
def srv4() -> Iterator[Server]:
    """As ``srv``, with a budget of 4 tokens: the trace SmolLM2 writes in them is text."""
    s = start(
        str(smollm2_gguf()),
        *("--alias", "m", "--chat-template-file", str(QWEN35), "--reasoning-budget", "4"),
    )
    yield s
    s.stop()


def test_json_answer_after_a_trace_the_model_wrote(srv4: Server) -> None:
    """Issue 33, must-show 4 with a trace the model itself writes: the prompt opens the
    trace (Qwen3.5), the model writes four tokens of it, the budget ends it, and the
    JSON-schema constraint then holds the answer: valid JSON of the schema after a
    non-empty trace, the same on the chat route (``response_format``), Ollama's
    ``/api/chat`` (``format``) and Responses (``text.format``)."""
    srv = srv4
    rf = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}
    chat = net.post(
        f"{srv.url}/v1/chat/completions",
        json={"model": "m", **body(None, response_format=rf, max_tokens=40)}
        | {"reasoning_format": "auto"},
        timeout=300,
    ).json()["choices"][0]["message"]
    opts = {"num_predict": 40, "temperature": 0}
    ollama = net.post(
        f"{srv.url}/api/chat",
        json={"model": "m", "messages": USER, "stream": False, "format": SCHEMA, "options": opts},
        timeout=300,
    ).json()["message"]
    fmt = {"format": {"type": "json_schema", "name": "w", "schema": SCHEMA}}
    resp = net.post(
        f"{srv.url}/v1/responses",
        json={"model": "m", "input": USER, "max_output_tokens": 40, "temperature": 0, "text": fmt},
        timeout=300,
    ).json()
    trace = "".join(
        c["text"] for it in resp["output"] if it["type"] == "reasoning" for c in it["content"]
    )
    answer = "".join(
        c["text"]
        for it in resp["output"]
        if it["type"] == "message"
        for c in it["content"]
        if c["type"] == "output_text"
    )
    got = {
        "chat": (chat["reasoning_content"], chat["content"]),
        "ollama": (ollama["thinking"], ollama["content"]),
        "responses": (trace, answer),
    }
    for route, (thought, text) in got.items():
        assert thought.strip(), route  # the model wrote a trace
        value = json.loads(text)  # and then an answer of the schema
        assert set(value) == {"city", "days"} and isinstance(value["days"], int), route
    assert len(set(got.values())) == 1, got
