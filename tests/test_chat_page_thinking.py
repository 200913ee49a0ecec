"""The chat page shows a reasoning model's trace folded: SmolLM2 given Qwen3's real
template (Ollama's ``/api/create``), its output forced with a ``grammar`` added to the
page's own request, in headless Chromium.  The reference is ``/v1/chat/completions`` for
the same forced output (its ``reasoning_content`` and ``content``); what the page shows
while the reply streams is recorded by a MutationObserver."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import net
from tests.chat_page_support import Page, open_page, send, stored, wait_idle
from tests.server_fixtures import Server

TRACE = (
    "The user asks for the capital of France. France is a country in Europe, and its "
    "capital city, the seat of its government, is Paris. So the answer is Paris."
)
ANSWER = "The capital of France is **Paris**."
FORCED = f"<think>\n{TRACE}\n</think>\n\n{ANSWER}"

# each render of the streaming reply: is the block open, its title, trace and answer
RECORD = """() => {
  window.__shown = [];
  new MutationObserver(() => {
    const body = [...document.querySelectorAll('.msg.assistant .body')].pop();
    if (!body || !document.querySelector('.msg.streaming')) return;
    const box = body.querySelector(':scope > details.reasoning');
    const answer = body.querySelector(':scope > .answer');
    window.__shown.push({
      status: document.getElementById('status').textContent,
      open: box ? box.open : null,
      summary: box ? box.querySelector('summary').textContent : null,
      thinking: box ? box.querySelector('div').textContent : '',
      answer: answer ? answer.textContent : '',
    });
  }).observe(document.getElementById('log'),
             {childList: true, subtree: true, characterData: true, attributes: true});
}"""


@pytest.fixture(scope="module")
def srv(templates_server: Server) -> Server:
    """SmolLM2 as ``smol``, and as ``qwen3`` / ``qwen35`` / ``gptoss`` with those templates."""
    return templates_server


def force(page: Page, text: str) -> None:
    """Every chat request the page sends goes to ``qwen3`` with ``text`` forced."""

    def handle(route: Any) -> None:
        body = json.loads(route.request.post_data or "{}")
        body.update(model="qwen3", grammar=f"root ::= {json.dumps(text)}")
        route.continue_(post_data=json.dumps(body))

    page.route("**/v1/chat/completions", handle)


def test_trace_streams_open_then_folds(page: Page, srv: Server) -> None:
    """The trace streams into an open "Thinking…" block above the answer; the block
    folds when the answer starts, and is kept with the reply (saved, and shown after a
    reload)."""
    ref = net.post(
        f"{srv.url}/v1/chat/completions",
        json={
            "model": "qwen3",
            "messages": [{"role": "user", "content": "Capital of France?"}],
            "grammar": f"root ::= {json.dumps(FORCED)}",
        },
        timeout=300,
    ).json()["choices"][0]["message"]
    assert ref["reasoning_content"] == TRACE + "\n" and ref["content"] == ANSWER
    open_page(page, srv.url)
    force(page, FORCED)
    page.evaluate(RECORD)
    send(page, "Capital of France?")
    assert wait_idle(page) == "done"
    shown = page.evaluate("window.__shown")
    thinking = [s for s in shown if s["thinking"] and not s["answer"].strip()]
    answering = [s for s in shown if s["answer"].strip()]
    # streamed as it comes: several growing traces, each in an open block, before the answer
    assert len({s["thinking"] for s in thinking}) > 1, shown
    assert all(s["open"] and s["summary"] == "Thinking…" for s in thinking), shown
    assert all(s["status"] == "thinking…" for s in thinking[1:]), shown
    assert shown.index(thinking[-1]) < shown.index(answering[0])
    # folded once the answer starts
    assert all(s["open"] is False and s["summary"] == "Thinking" for s in answering), shown
    assert all(s["status"] == "generating…" for s in answering), shown
    box = page.locator(".msg.assistant details.reasoning").last
    assert not box.evaluate("d => d.open")
    assert (box.locator("div").text_content() or "").strip() == TRACE
    assert page.locator(".msg.assistant .answer strong").last.inner_text() == "Paris"
    # the block is above the answer, and opens on a click
    assert page.locator(".msg.assistant .body > details.reasoning + .answer").count() == 1
    box.locator("summary").click()
    assert box.evaluate("d => d.open")
    # kept in the saved conversation, and shown (folded) after a reload
    st = stored(page)
    conv = next(c for c in st["conversations"] if c["id"] == st["current"])
    reply = conv["messages"][-1]["alts"][0]
    assert reply["reasoning"] == ref["reasoning_content"] and reply["content"] == ANSWER
    open_page(page, srv.url)
    box = page.locator(".msg.assistant details.reasoning").last
    assert box.count() == 1 and not box.evaluate("d => d.open")
    assert (box.locator("div").text_content() or "").strip() == TRACE


def test_trace_not_sent_back_and_exported(page: Page, srv: Server) -> None:
    """The next request carries the earlier reply's answer, not its trace (the template
    drops earlier turns' traces); an export keeps the traces, and importing it into a
    fresh profile shows them folded again."""
    bodies: list[dict[str, Any]] = []
    page.on(
        "request",
        lambda r: (
            bodies.append(json.loads(r.post_data or "{}"))
            if r.url.endswith("/v1/chat/completions")
            else None
        ),
    )
    open_page(page, srv.url)
    force(page, FORCED)
    send(page, "Capital of France?")
    assert wait_idle(page) == "done"
    send(page, "And of Italy?")
    assert wait_idle(page) == "done"
    sent = bodies[-1]["messages"]
    assert sent[1] == {"role": "assistant", "content": ANSWER}
    assert all("reasoning" not in json.dumps(m) for m in sent)
    with page.expect_download() as dl:
        page.click("#export")
    exported = Path(dl.value.path()).read_bytes()
    replies = json.loads(exported)["conversations"][0]["messages"][1::2]
    assert [r["alts"][0]["reasoning"] for r in replies] == [TRACE + "\n"] * 2
    page.evaluate("localStorage.clear()")
    open_page(page, srv.url)
    assert page.locator("details.reasoning").count() == 0
    page.set_input_files(
        "#import", files=[{"name": "c.json", "mimeType": "application/json", "buffer": exported}]
    )
    page.wait_for_function("document.querySelectorAll('details.reasoning').length === 2")
    boxes = page.locator(".msg.assistant details.reasoning")
    assert boxes.evaluate_all("ds => ds.map(d => [d.open, d.lastChild.textContent.trim()])") == [
        [False, TRACE],
        [False, TRACE],
    ]
