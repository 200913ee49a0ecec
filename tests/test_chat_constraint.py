"""A JSON answer constraint lets the thinking trace through first: the grammar
:func:`modelc.server.tools.after_trace` builds, run by the engine's llguidance matcher
over SmolLM2's tokens of known texts."""

from __future__ import annotations

import json

import pytest

from modelc.chat import detect
from modelc.engine.api import Constraint, ConstraintKind
from modelc.engine.constraints import ConstraintState, build_lltokenizer
from modelc.formats.gguf import load_gguf
from modelc.runtime.tokenizer import Tokenizer
from modelc.server.tools import OutputReader, after_trace
from tests.assets import smollm2_gguf
from tests.test_chat_formats import prompt, template

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
ANSWER = '{"city":"Paris","days":2}'


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    spec = load_gguf(smollm2_gguf()).tokenizer
    assert spec is not None
    return Tokenizer(spec)


def accepts(tok: Tokenizer, c: Constraint, text: str) -> bool:
    st = ConstraintState(build_lltokenizer(tok, tok.n_vocab, {tok.eos_id or 0}), c, tok.n_vocab)
    for t in tok.encode(text, add_special=False):
        if not st.matcher.consume_token(t):
            return False
    return st.accepting


def reader(name: str, **kw: bool) -> OutputReader:
    return OutputReader(detect(template(name)), prompt(name, **kw))


@pytest.mark.parametrize(
    ("name", "kw", "text", "ok"),
    [
        ("Qwen3.5-4B", {}, "Need {it} </b>.\n</think>\n\n" + ANSWER, True),  # opened
        ("Qwen3.5-4B", {}, ANSWER, False),  # the opened trace must close first
        ("Qwen3.5-4B", {}, 'Hmm.</think>{"city":1}', False),  # the answer is held
        ("Qwen3.5-4B", {"enable_thinking": False}, ANSWER, True),
        ("Qwen-Qwen3-0.6B", {}, "<think>\nok\n</think>\n\n" + ANSWER, True),
        ("Qwen-Qwen3-0.6B", {}, ANSWER, True),  # the model may skip its trace
        ("Qwen-Qwen3-0.6B", {}, "Sure: " + ANSWER, False),
        ("mistralai-Ministral-3-14B-Reasoning-2512", {}, "[THINK]x[/THINK]" + ANSWER, True),
    ],
)
def test_answer_after_trace(
    tok: Tokenizer, name: str, kw: dict[str, bool], text: str, ok: bool
) -> None:
    c = after_trace(Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA)), reader(name, **kw))
    assert c is not None and c.kind is ConstraintKind.GRAMMAR
    assert accepts(tok, c, text) is ok


def test_traceless_format_keeps_its_constraint() -> None:
    c = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA))
    assert after_trace(c, reader("Qwen-Qwen2.5-7B-Instruct")) is c
    off = OutputReader(detect(template("Qwen-Qwen3-0.6B")), reasoning=False)
    assert after_trace(c, off) is c  # reasoning_format none: the trace is not set apart


def test_objects_closed_as_llamacpps_converter(tok: Tokenizer) -> None:
    """An object that lists its properties and says nothing of additionalProperties takes
    no other key (llama.cpp's common/json-schema.cpp; JSON Schema would take any), at any
    depth; one that says takes what it says; a bare object takes any; the members of an
    allOf stay open (each closed would refuse the keys the others add)."""
    from modelc.json_schema import closed

    def ok(schema: object, text: str) -> bool:
        return accepts(tok, Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema)), text)

    assert ok(SCHEMA, ANSWER) and not ok(SCHEMA, '{"city":"Paris","days":2,"unit":"C"}')
    nested = {"type": "object", "properties": {"a": {"type": "array", "items": SCHEMA}}}
    assert ok(nested, '{"a":[' + ANSWER + "]}")
    assert not ok(nested, '{"a":[{"city":"Paris","days":2,"unit":"C"}]}')
    assert ok({**SCHEMA, "additionalProperties": True}, '{"city":"Paris","days":2,"unit":"C"}')
    assert ok({"type": "object"}, '{"unit":"C"}')
    both = {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}
    assert closed(both) == both
    defs = {"$defs": {"p": SCHEMA}, "properties": {"p": {"$ref": "#/$defs/p"}}}
    assert closed(defs)["$defs"]["p"]["additionalProperties"] is False
    assert closed(defs)["additionalProperties"] is False and "additionalProperties" not in defs
