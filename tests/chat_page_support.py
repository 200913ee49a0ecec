"""Playwright helpers for the chat page tests: Debian's Chromium, headless (the ``browser``
and ``page`` fixtures are in ``tests/conftest.py``), and the page's controls (settings,
sending, waiting for a reply, the stored conversation)."""

from __future__ import annotations

import json
import shutil
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}

try:
    from playwright.sync_api import Page, Route, sync_playwright
except ImportError:  # pragma: no cover - the test extras install it
    sync_playwright = None  # type: ignore[assignment]


def open_page(page: Page, url: str) -> None:
    page.goto(url + "/")
    page.wait_for_function("document.body.dataset.ready === '1'")


def set_settings(page: Page, **values: Any) -> None:
    """Fill the settings dialog (None: clear the field) and save it."""
    page.click("#settings-btn")
    for name, v in values.items():
        page.fill(f"#settings-form [name={name}]", "" if v is None else str(v))
    page.click("#settings-save")
    page.wait_for_function("!document.getElementById('settings').open")
    # saved by the time the dialog has closed (a message sent next goes with them)
    saved = saved_settings(page)
    for name, v in values.items():
        if name in ("system", "apiKey"):
            continue
        assert saved.get(name) == (None if v is None else float(v)), (name, saved)


def send(page: Page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def wait_idle(page: Page, timeout: float = 60_000) -> str:
    """Wait for the reply to end; the page's state: done, error or cancelled."""
    page.wait_for_function(
        "['done', 'error', 'cancelled'].includes(document.body.dataset.state)", timeout=timeout
    )
    return str(page.evaluate("document.body.dataset.state"))


def stored(page: Page) -> dict[str, Any]:
    """The page's saved state (localStorage)."""
    return json.loads(page.evaluate("localStorage.getItem('modelc.chat.v1')"))  # type: ignore[no-any-return]


def saved_settings(page: Page) -> dict[str, Any]:
    """The page's saved settings (localStorage; {} before any save)."""
    return json.loads(page.evaluate("localStorage.getItem('modelc.chat.settings')") or "{}")  # type: ignore[no-any-return]


def shown_messages(page: Page) -> list[dict[str, str]]:
    """The current conversation as stored: role and shown version's content."""
    st = stored(page)
    conv = next(c for c in st["conversations"] if c["id"] == st["current"])
    return [
        {"role": s["role"], "content": s["alts"][s["cur"]]["content"]} for s in conv["messages"]
    ]


def chat_bodies(page: Page) -> list[dict[str, Any]]:
    """Every /v1/chat/completions request body the page sends from now on."""
    bodies: list[dict[str, Any]] = []

    def on_request(req: Any) -> None:
        if req.url.endswith("/v1/chat/completions") and req.method == "POST":
            bodies.append(json.loads(req.post_data or "{}"))

    page.on("request", on_request)
    return bodies


def sse(*pieces: str, finish: str = "stop", error: str | None = None) -> str:
    """A /v1/chat/completions stream carrying ``pieces`` (or an error event after them)."""
    out = []
    for p in pieces:
        chunk = {"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
        out.append(f"data: {json.dumps(chunk)}\n\n: ping\n\n")
    if error is not None:
        out.append(f"data: {json.dumps({'error': {'message': error}})}\n\n")
    else:
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(pieces)}}
        out += [f"data: {json.dumps(end)}\n\n", f"data: {json.dumps(usage)}\n\n"]
    return "".join(out) + "data: [DONE]\n\n"


def fake_answer(page: Page, *pieces: str, **kw: Any) -> None:
    """Answer every chat request with a crafted stream (the model's words, as we choose)."""

    def handle(route: Route) -> None:
        route.fulfill(status=200, content_type="text/event-stream", body=sse(*pieces, **kw))

    page.route("**/v1/chat/completions", handle)
