"""modelc's parse of a forced output held to llama.cpp's server (``xllamacpp``) on the
SmolLM2 GGUF with the family's real template (``--jinja --chat-template-file``).

* A thinking trace: the output is forced with a ``grammar`` (llama.cpp refuses a grammar
  together with tools), and ``reasoning_content`` / ``content`` compared, with
  ``reasoning_format`` ``auto`` and ``none``.
* A tool call: the forced text is the assistant message the model continues, and the
  end of text is forced with ``logit_bias``; llama.cpp then parses that text with the
  tools offered, and its ``content`` / ``tool_calls`` are compared.  (Its continuation
  reads a trace as content, so the calls are compared on call-only texts; the
  thinking-and-call cases are held to known answers in ``test_chat_formats``.)

Where modelc parts from llama.cpp on purpose, known answers hold it instead: llama.cpp
leaves Llama 3.1's ``<|python_tag|>`` in ``content`` before the JSON call it parses;
modelc drops the tag.  Mistral Small 3.2's forced call, Granite 3.3's ``<|tool_call|>``,
Functionary v3.2 and gpt-oss calls are not read by llama.cpp's continuation (500 or
content), so they too are held to known answers only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from modelc.bench.llamacpp import LlamaCppServer
from modelc.chat import StreamParser, detect
from tests import net
from tests.assets import smollm2_gguf
from tests.test_chat_formats import CASES, TEMPLATES, TOOLS, parser, prompt

# (template, forced text, chat_template_kwargs)
TRACES: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "Qwen-Qwen3-0.6B": [("<think>\nX\n</think>\n\nY", {}), ("Just Y", {})],
    "Qwen3.5-4B": [("Need it.\n</think>\n\nAnswer.", {})],
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": [("Hmm.\n</think>\n\nIt is 42.", {})],
    "deepseek-ai-DeepSeek-V3.1": [("weather first</think>It is 42.", {"thinking": True})],
    "GLM-4.6": [("<think>Paris.</think>\nIt is 42.", {})],
    "GLM-4.7-Flash": [("Paris.</think>It is 42.", {})],
    "Kimi-K2-Thinking": [("<think>Look.</think>It is 42.", {})],
    "mistralai-Ministral-3-14B-Reasoning-2512": [("[THINK]Paris.[/THINK]It is 42.", {})],
    "openai-gpt-oss-120b": [
        (
            "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final"
            "<|message|>It is 42.",
            {},
        )
    ],
    "google-gemma-4-31B-it": [("<|channel>thought\nSimple.<channel|>It is 42.", {})],
    "ibm-granite-granite-3.3-2B-Instruct": [
        ("<think>Hmm.</think><response>It is 42.</response>", {"thinking": True})
    ],
}
CALLS = [
    "qwen2.5-two-calls",
    "qwen3-call-only",
    "qwen3-coder",
    "qwen3.5-no-thinking",
    "llama3.1-json",
    "llama3.1-builtin-not-offered",
    "llama3.2-typed",
    "llama3.2-text",
    "mistral-nemo",
    "glm-4.6-call",
    "deepseek-r1-call",
    "deepseek-v3.1-call",
    "kimi-k2",
    "granite-4.0",
    "functionary-v3.1",
    "gemma4-call",
]
END_OF_TEXT = [[0, 100], [2, 100]]  # SmolLM2's <|endoftext|> and <|im_end|>, forced


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llamacpp-templates")


def peer(name: str, log_dir: Path) -> LlamaCppServer:
    """llama.cpp's server with the family's template (``with peer(...) as srv``)."""
    tpl = TEMPLATES / f"{name}.jinja"
    log = log_dir / f"{name}.log"
    return LlamaCppServer(
        smollm2_gguf(), threads=1, n_parallel=1, n_ctx=4096, chat_template=tpl, log=log
    )


def chat(url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = net.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    r.raise_for_status()
    msg: dict[str, Any] = r.json()["choices"][0]["message"]
    return msg


def calls_of(msg: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        (t["function"]["name"], json.loads(t["function"]["arguments"]))
        for t in msg.get("tool_calls") or []
    ]


def names() -> list[str]:
    return sorted(set(TRACES) | {CASES[k].template for k in CALLS})


@pytest.mark.parametrize("name", names())
def test_parse_equals_llamacpp(name: str, log_dir: Path) -> None:
    user = [{"role": "user", "content": "hi"}]
    fmt = detect((TEMPLATES / f"{name}.jinja").read_text())
    with peer(name, log_dir) as srv:
        for text, kw in TRACES.get(name, []):
            for rf in ("auto", "none"):
                body: dict[str, Any] = {
                    "messages": user,
                    "grammar": f"root ::= {json.dumps(text)}",
                    "temperature": 0,
                    "max_tokens": 200,
                    "reasoning_format": rf,
                    "chat_template_kwargs": kw,
                }
                theirs = chat(srv.url, body)
                p = StreamParser(
                    fmt, reasoning=rf != "none", prompt=prompt(name, enable_thinking=True, **kw)
                )
                got = p.full(text)
                assert (got.reasoning or None, got.content) == (
                    theirs.get("reasoning_content"),
                    theirs.get("content"),
                ), (text, rf)
        for key in (k for k in CALLS if CASES[k].template == name):
            case = CASES[key]
            body = {
                "messages": [*user, {"role": "assistant", "content": case.text}],
                "tools": TOOLS,
                "logit_bias": END_OF_TEXT,
                "temperature": 0,
                "max_tokens": 3,
                "chat_template_kwargs": case.kwargs,
            }
            theirs = chat(srv.url, body)
            got = parser(case).full(case.text)
            mine = [(c.name, json.loads(c.arguments)) for c in got.calls]
            assert (got.content, mine) == (theirs.get("content") or "", calls_of(theirs)), key
            assert mine == case.calls  # and both equal the known answer
