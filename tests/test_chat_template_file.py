"""``--chat-template-file`` (llama-server's option): the file replaces the model's
template, for every real template in ``tests/fixtures/templates``, with prompt ids equal
to llama.cpp's server started with the same file, for conversations with tools, tool
calls and results, and earlier thinking turns (``reasoning_content``, as llama.cpp
passes a trace back into the template); a bad file is one line at start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from modelc.bench.llamacpp import LlamaCppServer
from modelc.engine import EngineOptions, build_engine
from modelc.errors import UsageError
from modelc.formats.ir import ModelIR
from modelc.resolve import load_ir
from tests import net
from tests.assets import smollm2_gguf
from tests.server_fixtures import ROOT
from tests.test_chat_formats import TEMPLATES, TOOLS

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
}
# name -> the request's fields (llama.cpp's /apply-template body)
CONVERSATIONS: dict[str, dict[str, Any]] = {
    "plain": {"messages": USER},
    "system": {"messages": [{"role": "system", "content": "Be brief."}, *USER]},
    "tools": {"messages": USER, "tools": TOOLS},
    "thinking turn": {
        "messages": [
            *USER,
            {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Recall."},
            {"role": "user", "content": "And tomorrow?"},
        ]
    },
    "call and result": {
        "messages": [
            *USER,
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        ],
        "tools": TOOLS,
    },
    "thinking call and result": {
        "messages": [
            *USER,
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Look it up.",
                "tool_calls": [CALL],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
            {"role": "assistant", "content": "21 degrees.", "reasoning_content": "Easy."},
            {"role": "user", "content": "And tomorrow?"},
        ],
        "tools": TOOLS,
    },
}
CLI = [sys.executable, "-m", "modelc.cli"]
NAMES = sorted(p.stem for p in TEMPLATES.glob("*.jinja"))


@pytest.fixture(scope="module")
def ir() -> ModelIR:
    return load_ir(str(smollm2_gguf()))


def llamacpp_ids(url: str, body: dict[str, Any]) -> list[int] | None:
    """llama.cpp's prompt ids for a conversation (None: its template refuses it)."""
    r = net.post(f"{url}/apply-template", json=body, timeout=60)
    if r.status_code != 200:
        return None
    text = r.json()["prompt"]
    tokens = net.post(
        f"{url}/tokenize",
        json={"content": text, "add_special": True, "parse_special": True},
        timeout=60,
    ).json()["tokens"]
    return [int(t) for t in tokens]


@pytest.mark.parametrize("name", NAMES)
def test_prompt_ids_equal_llamacpp(ir: ModelIR, name: str, tmp_path: Path) -> None:
    tpl = TEMPLATES / f"{name}.jinja"
    eng = build_engine(ir, EngineOptions(chat_template_file=str(tpl), threads=1))
    source = tpl.read_text()
    assert eng.prompt is not None and eng.prompt.template == source
    compared = 0
    with LlamaCppServer(
        smollm2_gguf(), threads=1, n_parallel=1, n_ctx=4096, chat_template=tpl, log=tmp_path / "l"
    ) as peer:
        for key, body in CONVERSATIONS.items():
            # where the template does not take tools (or calls), modelc offers them
            # Hermes-style (and writes the calls as text), on purpose: not compared
            if "tools" not in source:
                body = {k: v for k, v in body.items() if k != "tools"}
            if "tool_calls" not in source and "call" in key:
                continue
            theirs = llamacpp_ids(peer.url, body)
            if theirs is None:
                continue  # (Mistral's templates want alternating turns ...)
            mine = eng.prompt.chat(body["messages"], tools=body.get("tools")).ids
            assert mine == theirs, key
            compared += 1
    assert compared >= 3  # plain, system or tools: every template takes most of them


def test_bad_file_is_one_line_at_start(tmp_path: Path) -> None:
    """A missing file and a template that does not parse: one line naming the file,
    exit status 2, before the model is loaded."""
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }")
    for path, why in ((tmp_path / "none.jinja", "No such file"), (broken, "does not parse")):
        with pytest.raises(UsageError, match=why):
            EngineOptions(chat_template_file=str(path)).validate()
        p = subprocess.run(
            [*CLI, "generate", "nowhere-model", "hi", "--chat-template-file", str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 2
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0] and why in lines[0], p.stderr


THINKING_CALL = [
    *USER,
    {"role": "assistant", "content": "", "reasoning_content": "Look it up.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
]
ARGS = {"city": "Paris", "days": 2}
PARAMS = TOOLS[0]["function"]["parameters"]


def dialect_counts(url: str) -> dict[str, int]:
    """The prompt tokens of THINKING_CALL sent in each dialect's own shapes."""
    ollama = {
        "model": "m",
        "stream": False,
        "options": {"num_predict": 1},
        "tools": TOOLS,
        "messages": [
            *USER,
            {
                "role": "assistant",
                "content": "",
                "thinking": "Look it up.",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": ARGS}}],
            },
            {"role": "tool", "content": '{"temp": 21}'},
        ],
    }
    messages = {
        "model": "m",
        "tools": [{"name": "get_weather", "input_schema": PARAMS}],
        "messages": [
            *USER,
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Look it up.", "signature": "s"},
                    {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": ARGS},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": '{"temp": 21}'}
                ],
            },
        ],
    }
    responses = {
        "model": "m",
        "max_output_tokens": 16,
        "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMS}],
        "input": [
            {"role": "user", "content": USER[0]["content"]},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "Look it up."}],
            },
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris", "days": 2}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": '{"temp": 21}'},
        ],
    }

    def post(path: str, body: dict[str, Any]) -> Any:
        r = net.post(f"{url}{path}", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()

    return {
        "ollama": int(post("/api/chat", ollama)["prompt_eval_count"]),
        "messages": int(post("/v1/messages/count_tokens", messages)["input_tokens"]),
        "responses": int(post("/v1/responses", responses)["usage"]["input_tokens"]),
    }


FORCED = "root ::= " + json.dumps(
    "<think>\nLook it up.\n</think>\n\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
)


def responses(url: str, body: dict[str, Any]) -> Any:
    tools = [{"type": "function", "name": "get_weather", "parameters": PARAMS}]
    full = {"model": "m", "tools": tools, "max_output_tokens": 80, "temperature": 0, **body}
    r = net.post(f"{url}/v1/responses", json=full, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_served_template_file_and_thinking_turns(tmp_path: Path) -> None:
    """``modelc run --chat-template-file`` (Qwen3's): a trace sent back with a call and
    its result gives llama.cpp's prompt ids on the chat route, and the same prompt from
    Ollama's ``thinking``, a Messages ``thinking`` block and a Responses reasoning item."""
    from tests.server_fixtures import start

    tpl = TEMPLATES / "Qwen-Qwen3-0.6B.jinja"
    body = {"messages": THINKING_CALL, "tools": TOOLS}
    with LlamaCppServer(
        smollm2_gguf(), threads=1, n_parallel=1, n_ctx=4096, chat_template=tpl, log=tmp_path / "l"
    ) as peer:
        theirs = llamacpp_ids(peer.url, body)
    srv = start(str(smollm2_gguf()), "--alias", "m", "--chat-template-file", str(tpl))
    try:

        def ids(messages: list[dict[str, Any]]) -> list[int]:
            r = net.post(
                f"{srv.url}/v1/chat/completions",
                json={"model": "m", "messages": messages, "tools": TOOLS}
                | {"max_tokens": 1, "return_token_ids": True},
                timeout=300,
            )
            return [int(i) for i in r.json()["prompt_token_ids"]]

        mine = ids(THINKING_CALL)
        assert mine == theirs
        without = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in THINKING_CALL]
        assert len(ids(without)) < len(mine)  # the trace is in the prompt
        counts = dialect_counts(srv.url)
        assert counts == dict.fromkeys(counts, len(mine))
        # a stored response's trace goes back too: a forced trace and call, then its
        # result through previous_response_id, is the same prompt
        first = responses(srv.url, {"input": USER[0]["content"], "grammar": FORCED})
        kinds = [o["type"] for o in first["output"]]
        assert kinds == ["reasoning", "function_call"], first["output"]
        call_id = first["output"][1]["call_id"]
        result = {"type": "function_call_output", "call_id": call_id, "output": '{"temp": 21}'}
        second = responses(srv.url, {"previous_response_id": first["id"], "input": [result]})
        assert second["usage"]["input_tokens"] == len(mine)
    finally:
        srv.stop()
