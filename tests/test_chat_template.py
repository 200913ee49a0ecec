"""Chat templates: the real SmolLM2 template (vs transformers' rendering), sandboxing, fallback."""

from __future__ import annotations

import pytest

from modelc.errors import UsageError
from modelc.formats import load_model
from modelc.runtime.chat_template import render_chat
from tests.assets import smollm2_gguf
from tests.runtime_support import golden


@pytest.fixture(scope="module")
def smollm2_template() -> str:
    ir = load_model(smollm2_gguf())
    assert ir.chat_template
    return ir.chat_template


def test_smollm2_template_matches_transformers(smollm2_template: str) -> None:
    chats = [r for r in golden("smollm2.json")["records"] if "chat" in r]
    assert len(chats) >= 4
    for r in chats:
        # the golden prompt text is transformers' apply_chat_template output
        assert render_chat(smollm2_template, r["chat"], add_generation_prompt=True) == r["prompt"]


def test_generation_prompt_flag(smollm2_template: str) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    with_gp = render_chat(smollm2_template, msgs, add_generation_prompt=True)
    without = render_chat(smollm2_template, msgs, add_generation_prompt=False)
    assert with_gp == without + "<|im_start|>assistant\n"


def test_variables_tools_bos_eos_and_tojson() -> None:
    tpl = (
        "{{ bos_token }}{% if tools %}{{ tools | tojson }}|{% endif %}"
        "{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}"
        "{% if add_generation_prompt %}>{% endif %}{{ eos_token }}"
    )
    out = render_chat(
        tpl,
        [{"role": "user", "content": "é<b>"}],
        tools=[{"name": "f", "x": "<é>"}],
        bos_token="<s>",
        eos_token="</s>",
    )
    assert out == '<s>[{"name": "f", "x": "<é>"}]|user=é<b>;></s>'


def test_raise_exception_becomes_usage_error() -> None:
    tpl = "{% if messages[0].role != 'system' %}{{ raise_exception('first must be system') }}{% endif %}"
    with pytest.raises(UsageError, match="first must be system"):
        render_chat(tpl, [{"role": "user", "content": "x"}])


def test_sandbox_blocks_attribute_escapes() -> None:
    tpl = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(UsageError):
        render_chat(tpl, [{"role": "user", "content": "x"}])
    mutate = "{% set _ = messages.clear() %}x"
    with pytest.raises(UsageError, match="unsafe"):
        render_chat(mutate, [{"role": "user", "content": "x"}])


def test_lists_grow_in_the_renders_own_copy() -> None:
    """``append`` / ``pop`` work, as in llama.cpp's Jinja (Kimi K2's template queues call
    ids), on the render's copy of the messages; a list grown forever is stopped."""
    msgs = [{"role": "user", "content": "x", "parts": [1]}]
    tpl = "{% set _ = messages.append(1) %}{% set _ = messages[0].parts.pop() %}"
    assert render_chat(tpl + "{{ messages | length }}", msgs) == "2"
    assert msgs == [{"role": "user", "content": "x", "parts": [1]}]
    grow = "{% set l = [1] %}{% for x in l %}{% set _ = l.append(x) %}{% endfor %}"
    with pytest.raises(UsageError, match="was stopped"):
        render_chat(grow, msgs)


def test_syntax_error_is_usage_error() -> None:
    with pytest.raises(UsageError, match="does not parse"):
        render_chat("{% for m in messages %}", [{"role": "user", "content": "x"}])


def test_fallback_is_llamacpps_chatml() -> None:
    """A model without a template gets llama.cpp's fallback, ChatML (its server's
    ``/apply-template`` answer for a GGUF without one, seen on gemma-3-270m)."""
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    want = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    assert render_chat(None, msgs) == want + "<|im_start|>assistant\n"
    assert render_chat(None, msgs, add_generation_prompt=False) == want
    tool_turn = [{"role": "assistant", "content": None}]
    assert render_chat(None, tool_turn, add_generation_prompt=False) == (
        "<|im_start|>assistant\n<|im_end|>\n"
    )
    with pytest.raises(UsageError):
        render_chat(None, [])
    with pytest.raises(UsageError):
        render_chat(None, [{"content": "no role"}])


HOSTILE = {
    "forever": "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
    "huge string": "{{ 'x' * 1000000000 }}",
    "huge list": "{{ ([1] * 100000000) | length }}",
    "power": "{{ 10 ** 100000000 }}",
    "huge output": "{% for i in range(99999) %}{{ 'abcdefghij' * 10000 }}{% endfor %}",
    "recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "internals": "{{ messages.__class__.__mro__ }}",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_templates_are_stopped(name: str) -> None:
    """A template is a stranger's code: loops that run forever, huge strings and outputs,
    deep recursion and reaching for internals all end promptly in a UsageError."""
    import time

    t0 = time.monotonic()
    with pytest.raises(UsageError, match="chat template"):
        render_chat(HOSTILE[name], [{"role": "user", "content": "x"}])
    assert time.monotonic() - t0 < 10
    # and the next, ordinary render is not affected by the last one's deadline
    assert render_chat("{{ messages[0].content }}", [{"role": "user", "content": "ok"}]) == "ok"


def test_template_internals_stay_out_of_reach() -> None:
    """The sandbox answers unsafe attributes with nothing: no module globals leak."""
    for tpl in ("{{ raise_exception.__globals__ }}", "{{ strftime_now.__code__ }}"):
        assert render_chat(tpl, [{"role": "user", "content": "x"}]) == ""
