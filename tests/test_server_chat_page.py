"""The built-in chat page (``/``) in headless Chromium (Debian's, driven by Playwright)
against real ``modelc run`` servers: each streamed answer is compared with the
``/v1/chat/completions`` answer for the same messages and settings, stopping is checked
on the server's ``/metrics``, and the request bodies the page sends are intercepted.
Rendering tests fake the model's stream with ``page.route``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelc.bench.llamacpp import LlamaCppServer
from tests import net
from tests.assets import smollm2_gguf
from tests.chat_page_support import (
    PHONE,
    Page,
    chat_bodies,
    fake_answer,
    open_page,
    saved_settings,
    send,
    set_settings,
    shown_messages,
    stored,
    wait_idle,
)
from tests.server_fixtures import Server, start

SAMPLING = {"temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_tokens", "seed"}


def api_reply(srv: Server, messages: list[dict[str, str]], **params: Any) -> dict[str, Any]:
    r = net.post(
        f"{srv.url}/v1/chat/completions", json={"messages": messages, **params}, timeout=120
    )
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def last_reply_text(page: Page) -> str:
    return page.locator(".msg.assistant .body").last.inner_text()


def test_static_files_served_with_types(smol_server: Server) -> None:
    for path, kind in [
        ("/", "text/html"),
        ("/static/js/main.js", "text/javascript"),
        ("/static/chat.css", "text/css"),
        ("/static/vendor/marked.esm.js", "text/javascript"),
        ("/static/vendor/LICENSE.dompurify.txt", "text/plain"),
    ]:
        r = net.get(smol_server.url + path)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind), path
        assert "cache-control" in r.headers
    for bad in ["/static/../app.py", "/static/js/../../app.py", "/static/nope.js"]:
        assert net.get(smol_server.url + bad).status_code == 404


@pytest.mark.slow
def test_streamed_answer_equals_api(
    page: Page, smol_server: Server, llamacpp: LlamaCppServer
) -> None:
    bodies = chat_bodies(page)
    open_page(page, smol_server.url)
    # the server's defaults are the settings' placeholders; nothing unset is sent
    props = net.get(f"{smol_server.url}/props").json()["default_generation_settings"]["params"]
    page.click("#settings-btn")
    for name, key in [
        ("temperature", "temperature"),
        ("top_k", "top_k"),
        ("top_p", "top_p"),
        ("min_p", "min_p"),
        ("repetition_penalty", "repeat_penalty"),
        ("max_tokens", "max_tokens"),
    ]:
        shown = page.get_attribute(f"[name={name}]", "placeholder")
        assert shown is not None and float(shown) == props[key], name
    page.fill("[name=temperature]", "0")
    page.fill("[name=max_tokens]", "24")
    page.click("#settings-save")
    send(page, "What is the capital of France?")
    assert page.evaluate("document.getElementById('send').disabled")  # while streaming
    assert wait_idle(page) == "done"
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ref = api_reply(smol_server, messages, temperature=0, max_tokens=24)
    content = ref["choices"][0]["message"]["content"]
    assert shown_messages(page) == [*messages, {"role": "assistant", "content": content}]
    assert last_reply_text(page).strip() == content.strip()
    body = bodies[-1]
    assert body["messages"] == messages and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert {k for k in body if k in SAMPLING} == {"temperature", "max_tokens"}
    stats = page.locator(".msg.assistant .stats").last.inner_text()
    assert (
        stats.startswith(f"{ref['usage']['completion_tokens']} tokens · ") and "tokens/s" in stats
    )
    # the page's conversation is fed to the model as llama.cpp's server feeds it (its
    # template and tokenizer on the same GGUF): the prompt tokens the page shows
    text = net.post(f"{llamacpp.url}/apply-template", json={"messages": messages}).json()
    ids = net.post(
        f"{llamacpp.url}/tokenize",
        json={"content": text["prompt"], "add_special": True, "parse_special": True},
    ).json()["tokens"]
    assert f"prompt {len(ids)} tokens" in stats
    assert ref["usage"]["prompt_tokens"] == len(ids)
    assert not page.evaluate("document.getElementById('send').disabled")
    assert page.evaluate("document.activeElement.id") == "prompt"


@pytest.mark.slow
def test_stop_cancels_on_the_server(page: Page, smol_server: Server) -> None:
    open_page(page, smol_server.url)
    set_settings(page, temperature=0, max_tokens=400)
    send(page, "Write a long story about a dragon and a knight.")
    page.wait_for_function(
        "(document.querySelector('.msg.assistant .body')?.textContent || '').length > 40",
        timeout=60_000,
    )
    assert page.is_visible("#stop")
    page.click("#stop")
    assert wait_idle(page) == "cancelled"
    assert page.locator(".note.finish-cancelled").inner_text() == "request cancelled"
    deadline = time.monotonic() + 15
    while smol_server.metric("modelc_requests_active") != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert smol_server.metric("modelc_requests_active") == 0
    partial = shown_messages(page)[-1]["content"]
    full = api_reply(smol_server, shown_messages(page)[:1], temperature=0, max_tokens=400)[
        "choices"
    ][0]["message"]["content"]
    assert len(partial) < len(full) and full.startswith(partial)  # cut, not finished
    assert page.is_hidden("#stop") and not page.is_disabled("#send")
    assert page.evaluate("document.activeElement.id") == "prompt"
    # Escape stops too
    send(page, "Tell me another long story.")
    page.wait_for_function("document.body.dataset.state === 'streaming'")
    page.keyboard.press("Escape")
    assert wait_idle(page) == "cancelled"


@pytest.mark.slow
def test_max_tokens_then_continue(page: Page, smol_server: Server) -> None:
    bodies = chat_bodies(page)
    open_page(page, smol_server.url)
    set_settings(page, temperature=0, max_tokens=8)
    user = {"role": "user", "content": "Write a story about a cat."}
    send(page, user["content"])
    assert wait_idle(page) == "done"
    note = page.locator(".note.finish-length")
    assert note.inner_text() == "stopped at max tokens — continue?"
    partial = shown_messages(page)[-1]["content"]
    page.click(".msg.assistant .continue")
    assert wait_idle(page) == "done"
    # the conversation goes back with the partial reply last: the server continues it
    assert bodies[-1]["messages"] == [user, {"role": "assistant", "content": partial}]
    more = api_reply(smol_server, bodies[-1]["messages"], temperature=0, max_tokens=8)["choices"][
        0
    ]["message"]["content"]
    assert shown_messages(page) == [user, {"role": "assistant", "content": partial + more}]


@pytest.mark.slow
def test_reload_keeps_conversations(page: Page, smol_server: Server) -> None:
    open_page(page, smol_server.url)
    set_settings(page, temperature=0, max_tokens=6)
    send(page, "Hello")
    wait_idle(page)
    send(page, "How are you?")
    wait_idle(page)
    before = page.inner_text("#log")
    page.reload()
    page.wait_for_function("document.body.dataset.ready === '1'")
    assert page.inner_text("#log") == before
    assert page.inner_text("#title") == "Hello"
    # a second conversation; rename it, switch, delete
    page.click("#new-chat")
    send(page, "Second")
    wait_idle(page)
    assert page.locator(".conv").count() == 2
    page.once("dialog", lambda d: d.accept("Renamed chat"))
    page.locator(".conv.active .conv-rename").click()
    assert page.locator(".conv.active .conv-open").inner_text() == "Renamed chat"
    page.locator(".conv-open", has_text="Hello").click()
    assert page.inner_text("#log") == before
    # export, then import into a fresh browser profile: the same conversation
    with page.expect_download() as dl:
        page.click("#export")
    exported = json.loads(Path(dl.value.path()).read_text())
    assert [c["title"] for c in exported["conversations"]] == ["Renamed chat", "Hello"]
    page.once("dialog", lambda d: d.accept())
    page.locator(".conv", has_text="Renamed chat").locator(".conv-delete").click()
    assert page.locator(".conv").count() == 1
    page.evaluate("localStorage.clear()")
    page.reload()
    page.wait_for_function("document.body.dataset.ready === '1'")
    page.set_input_files(
        "#import",
        files=[
            {
                "name": "c.json",
                "mimeType": "application/json",
                "buffer": json.dumps(exported).encode(),
            }
        ],
    )
    page.locator(".conv-open", has_text="Hello").click()
    assert page.inner_text("#log") == before


@pytest.mark.slow
def test_refused_message_is_not_resent(page: Page, smol_server: Server) -> None:
    bodies = chat_bodies(page)
    open_page(page, smol_server.url)
    set_settings(page, temperature=0, max_tokens=100_000_000)  # the server refuses it (400)
    send(page, "Refused one")
    assert wait_idle(page) == "error"
    assert "max_tokens" in page.locator("#log .error").inner_text()
    assert page.locator(".msg").count() == 0
    assert page.input_value("#prompt") == "Refused one"  # given back to fix and resend
    set_settings(page, max_tokens=4)
    # an error event in the stream: shown, dropped as well
    fake_answer(page, "Partial", error="the engine failed")
    send(page, "Broken one")
    assert wait_idle(page) == "error"
    assert "the engine failed" in page.locator("#log .error").inner_text()
    page.unroute("**/v1/chat/completions")
    page.fill("#prompt", "")
    send(page, "Hello")
    assert wait_idle(page) == "done"
    assert bodies[-1]["messages"] == [{"role": "user", "content": "Hello"}]
    assert page.locator("#log .error").count() == 0
    assert shown_messages(page)[0]["content"] == "Hello"
    assert "Refused" not in json.dumps(stored(page)) and "Broken" not in json.dumps(stored(page))


@pytest.mark.slow
def test_edit_and_resend(page: Page, smol_server: Server) -> None:
    bodies = chat_bodies(page)
    open_page(page, smol_server.url)
    set_settings(page, temperature=0, max_tokens=12)
    send(page, "Hello")
    wait_idle(page)
    first = shown_messages(page)
    page.click(".msg.user .edit")
    page.fill(".edit-box", "What is 2+2?")
    page.click(".edit-send")
    assert wait_idle(page) == "done"
    edited = [{"role": "user", "content": "What is 2+2?"}]
    assert bodies[-1]["messages"] == edited
    ref = api_reply(smol_server, edited, temperature=0, max_tokens=12)
    assert shown_messages(page) == [
        *edited,
        {"role": "assistant", "content": ref["choices"][0]["message"]["content"]},
    ]
    assert page.inner_text(".msg.user .pos") == "2/2"
    page.click(".msg.user .prev")
    assert page.inner_text(".msg.user .pos") == "1/2"
    assert shown_messages(page) == first


@pytest.mark.slow
def test_regenerate_with_seed(page: Page, smol_server: Server) -> None:
    open_page(page, smol_server.url)
    set_settings(page, temperature=0, seed=42, max_tokens=16)
    send(page, "Name a fruit.")
    wait_idle(page)
    first = shown_messages(page)
    page.click(".msg.assistant .regenerate")
    assert wait_idle(page) == "done"
    assert shown_messages(page) == first
    assert page.inner_text(".msg.assistant .pos") == "2/2"
    page.click(".msg.assistant .prev")
    assert page.inner_text(".msg.assistant .pos") == "1/2"
    assert shown_messages(page) == first


def test_enter_in_a_setting_saves_escape_cancels(page: Page, smol_server: Server) -> None:
    open_page(page, smol_server.url)
    page.click("#settings-btn")
    page.fill("#settings-form [name=temperature]", "0.3")
    page.press("#settings-form [name=temperature]", "Enter")
    page.wait_for_function("!document.getElementById('settings').open")
    saved = saved_settings(page)
    assert saved["temperature"] == 0.3
    page.wait_for_function("document.activeElement.id === 'prompt'")  # on the close event
    page.click("#settings-btn")
    page.fill("#settings-form [name=max_tokens]", "7")
    page.press("#settings-form [name=max_tokens]", "Escape")
    page.wait_for_function("!document.getElementById('settings').open")
    saved = saved_settings(page)
    assert "max_tokens" not in saved and saved["temperature"] == 0.3


CODE = "def add(a, b):\n    return a + b\n"


def test_code_block_highlighted_with_copy(page: Page, smol_server: Server) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    open_page(page, smol_server.url)
    fake_answer(page, "Here:\n\n", "```python\n", CODE[:10], CODE[10:], "```\n", "Done.")
    send(page, "Write add")
    assert wait_idle(page) == "done"
    code = page.locator(".msg.assistant pre code")
    assert code.inner_text() == CODE.rstrip("\n") or code.inner_text() == CODE
    assert page.locator(".msg.assistant pre code .hljs-keyword").count() >= 1  # highlighted
    assert page.inner_text(".code-bar span") == "python"
    page.click(".code-bar .copy")
    assert page.evaluate("navigator.clipboard.readText()") == CODE
    assert page.inner_text(".code-bar .copy") == "Copied"


HOSTILE = (
    "<img src=x onerror=\"alert('img')\"> <script>alert('script')</script>\n\n"
    "[x](javascript:alert('link')) <a href=\"javascript:alert('a')\">y</a> "
    "<svg onload=\"alert('svg')\"></svg> <b onmouseover=\"alert('b')\">bold</b>"
)


def test_hostile_answer_is_inert(page: Page, smol_server: Server) -> None:
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    open_page(page, smol_server.url)
    fake_answer(page, HOSTILE[:30], HOSTILE[30:])
    send(page, "<img src=x onerror=\"alert('user')\">")
    assert wait_idle(page) == "done"
    page.wait_for_timeout(300)
    for sel in ["script", "img", "svg", "[onerror]", "[onload]", "[onmouseover]"]:
        assert page.locator(f"#log {sel}").count() == 0, sel
    hrefs = page.eval_on_selector_all("#log a", "as => as.map(a => a.getAttribute('href'))")
    assert all(not (h or "").lower().startswith("javascript:") for h in hrefs), hrefs
    page.locator("#log a", has_text="x").click()
    page.locator("#log b", has_text="bold").hover()
    # the user's own text is shown as text
    assert page.inner_text(".msg.user .body") == "<img src=x onerror=\"alert('user')\">"
    page.reload()  # stored, rendered again: still inert
    page.wait_for_function("document.body.dataset.ready === '1'")
    assert page.locator("#log [onerror], #log script").count() == 0
    page.wait_for_timeout(200)
    assert dialogs == []


def test_phone_layout(browser: Any, smol_server: Server) -> None:
    context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    pg = context.new_page()
    try:
        open_page(pg, smol_server.url)
        long_line = "x = " + "'abcdefghij' + " * 30 + "''\n"
        fake_answer(pg, "A" * 300 + "\n\n```python\n" + long_line + "```\n")
        send(pg, "B" * 200)
        assert wait_idle(pg) == "done"
        assert pg.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
        assert pg.evaluate("document.body.scrollWidth") <= PHONE["width"]
        box = pg.locator("#send").bounding_box()
        assert pg.is_visible("#send") and box is not None
        assert box["x"] + box["width"] <= PHONE["width"] and box["y"] + box["height"] <= 844
        # the conversation list opens from the menu button
        assert not pg.locator("#new-chat").is_visible() or pg.evaluate(
            "document.getElementById('sidebar').getBoundingClientRect().right <= 0"
        )
        pg.click("#menu")
        pg.wait_for_timeout(250)
        assert pg.evaluate("document.getElementById('sidebar').getBoundingClientRect().left") >= 0
    finally:
        context.close()


def test_dark_mode(browser: Any, smol_server: Server) -> None:
    context = browser.new_context(viewport={"width": 800, "height": 600}, color_scheme="dark")
    pg = context.new_page()
    try:
        open_page(pg, smol_server.url)
        theme = "document.documentElement.dataset.theme"
        assert pg.evaluate(theme) == "dark"  # the system's choice
        bg = "getComputedStyle(document.body).backgroundColor"
        dark_bg = pg.evaluate(bg)
        pg.click("#theme")
        assert pg.evaluate(theme) == "light" and pg.evaluate(bg) != dark_bg
        pg.reload()
        pg.wait_for_function("document.body.dataset.ready === '1'")
        assert pg.evaluate(theme) == "light"  # the toggle is remembered
        for sel in ["#settings-btn", "#theme", "#send", "#prompt", "#attach"]:  # labelled controls
            name = pg.evaluate(
                f"(e => e.getAttribute('aria-label') || e.labels?.[0]?.textContent || "
                f"e.textContent)(document.querySelector('{sel}'))"
            )
            assert name and name.strip(), sel
    finally:
        context.close()


@pytest.fixture(scope="module")
def key_server() -> Iterator[Server]:
    srv = start(str(smollm2_gguf()), "--api-key", "sekret-key")
    yield srv
    srv.stop()


@pytest.mark.slow
def test_api_key_flow(page: Page, key_server: Server) -> None:
    auth: list[str | None] = []
    page.on("request", lambda r: auth.append(r.headers.get("authorization")))
    open_page(page, key_server.url)
    assert page.is_visible("#key-banner")
    assert page.inner_text("#model") == "model: ?"
    model_id = net.get(
        f"{key_server.url}/v1/models", headers={"Authorization": "Bearer sekret-key"}
    ).json()["data"][0]["id"]
    page.fill("#key-input", "sekret-key")
    page.click("#key-banner button")
    page.wait_for_function(f"document.getElementById('model').textContent === 'model: {model_id}'")
    assert page.is_hidden("#key-banner")
    page.reload()
    page.wait_for_function("document.body.dataset.ready === '1'")
    assert page.inner_text("#model") == f"model: {model_id}"
    assert page.is_hidden("#key-banner")
    set_settings(page, temperature=0, max_tokens=4)
    auth.clear()
    send(page, "Hello")
    assert wait_idle(page) == "done"
    assert "Bearer sekret-key" in auth
    # the settings dialog shows the stored key
    page.click("#settings-btn")
    assert page.input_value("#s-key") == "sekret-key"


@pytest.mark.slow
def test_model_picker(page: Page, two_text_server: Server) -> None:
    bodies = chat_bodies(page)
    open_page(page, two_text_server.url)
    ids = [m["id"] for m in net.get(f"{two_text_server.url}/v1/models").json()["data"]]
    assert len(ids) == 2 and page.is_visible("#model-select")
    options = page.eval_on_selector_all("#model-select option", "os => os.map(o => o.value)")
    assert options == ids
    page.select_option("#model-select", ids[1])
    assert page.inner_text("#model") == f"model: {ids[1]}"
    set_settings(page, temperature=0, max_tokens=6)
    send(page, "Hello")
    assert wait_idle(page) == "done"
    assert bodies[-1]["model"] == ids[1]
    messages = [{"role": "user", "content": "Hello"}]
    ref = api_reply(two_text_server, messages, model=ids[1], temperature=0, max_tokens=6)
    assert shown_messages(page)[-1]["content"] == ref["choices"][0]["message"]["content"]
    page.reload()  # the choice is remembered
    page.wait_for_function("document.body.dataset.ready === '1'")
    assert page.input_value("#model-select") == ids[1]


@pytest.mark.slow
def test_auto_scroll_follows_the_answer(page: Page, smol_server: Server) -> None:
    open_page(page, smol_server.url)
    fake_answer(page, *[f"Line {i}.\n\n" for i in range(120)])
    send(page, "Count")
    assert wait_idle(page) == "done"
    log = "document.getElementById('log')"
    at_bottom = f"(l => l.scrollHeight - l.scrollTop - l.clientHeight < 4)({log})"
    assert page.evaluate(at_bottom)
    page.unroute("**/v1/chat/completions")
    set_settings(page, temperature=0, max_tokens=300)
    send(page, "Write a long story about a dragon.")
    page.wait_for_function(  # the view follows the streamed answer
        f"({log}.querySelector('.streaming .body')?.textContent || '').length > 60 && {at_bottom}",
        timeout=60_000,
    )
    # the reader scrolls up: the view stays there while the answer goes on
    page.evaluate(f"{log}.scrollTop = 0")
    page.wait_for_timeout(100)
    grown = page.evaluate(f"{log}.scrollHeight")
    page.wait_for_function(f"{log}.scrollHeight > {grown} + 40", timeout=60_000)
    assert page.evaluate(f"{log}.scrollTop") == 0
    page.click("#stop")
    assert wait_idle(page) == "cancelled"


def test_import_validates_and_escapes(page: Page, smol_server: Server) -> None:
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    open_page(page, smol_server.url)

    def load(data: Any) -> None:
        raw = data if isinstance(data, bytes) else json.dumps(data).encode()
        page.set_input_files(
            "#import", files=[{"name": "x.json", "mimeType": "application/json", "buffer": raw}]
        )

    load(b"{not json")
    page.wait_for_function(
        "document.getElementById('status').textContent.startsWith('import failed')"
    )
    load({"conversations": [{"title": "nothing"}]})
    page.wait_for_function(
        "document.getElementById('status').textContent.includes('no conversation')"
    )
    # a plain OpenAI messages array; a hostile title and bad entries are kept inert / dropped
    load(
        [
            {"role": "user", "content": "Hi <b>there</b>"},
            {"role": "tool", "content": "dropped"},
            {"role": "assistant", "content": "Hello! <img src=x onerror=alert(1)>"},
        ]
    )
    page.wait_for_function(
        "document.getElementById('status').textContent === 'imported 1 conversation'"
    )
    assert shown_messages(page) == [
        {"role": "user", "content": "Hi <b>there</b>"},
        {"role": "assistant", "content": "Hello! <img src=x onerror=alert(1)>"},
    ]
    assert page.inner_text("#title") == "Hi <b>there</b>"
    load({"title": "<img src=x onerror=alert(2)>", "messages": [{"role": "user", "content": "a"}]})
    page.wait_for_function("document.querySelectorAll('.conv').length === 2")
    assert page.inner_text(".conv.active .conv-open") == "<img src=x onerror=alert(2)>"
    assert page.locator("img, [onerror]").count() == 0
    page.wait_for_timeout(200)
    assert dialogs == []


def test_reasoning_is_a_collapsible_block(page: Page, smol_server: Server) -> None:
    """A reply that starts with <think>...</think> (Qwen3, DeepSeek-R1) shows the reasoning
    in a closed <details> block and the answer after it; hostile markup inside stays inert."""
    open_page(page, smol_server.url)
    fake_answer(
        page,
        "<think>First, ",
        'recall **Paris**. <img src=x onerror="alert(1)"></think>',
        "It is *Paris*.",
    )
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    send(page, "Capital of France?")
    assert wait_idle(page) == "done"
    box = page.locator(".msg.assistant details.reasoning").last
    assert box.count() == 1 and not box.evaluate("d => d.open")
    assert box.locator("summary").inner_text() == "Thinking"
    assert box.locator("strong").text_content() == "Paris"  # its markdown is rendered too
    assert box.locator("img").count() == 0 and dialogs == []
    body = page.locator(".msg.assistant .body").last
    assert body.locator("details + div em").inner_text() == "Paris"


@pytest.mark.slow
def test_long_prompt_shows_its_progress(page: Page, smol_server: Server) -> None:
    """The page asks for prompt_progress and shows it while a long prompt is processed."""
    bodies = chat_bodies(page)
    open_page(page, smol_server.url)
    page.evaluate(
        """() => { window.__statuses = [];
        new MutationObserver(() => window.__statuses.push(
            document.getElementById('status').textContent))
          .observe(document.getElementById('status'), {childList: true, characterData: true,
                                                       subtree: true}); }"""
    )
    set_settings(page, max_tokens=2)
    send(page, "Summarise: " + "The quick brown fox jumps over the lazy dog. " * 90)
    assert wait_idle(page) == "done"
    assert bodies[-1]["return_progress"] is True
    seen = [s for s in page.evaluate("window.__statuses") if "tokens" in s]
    assert any(s.startswith("processing prompt… 256/") for s in seen), seen
    totals = {s.split("/")[1] for s in seen}
    assert len(totals) == 1  # one prompt, its total throughout
