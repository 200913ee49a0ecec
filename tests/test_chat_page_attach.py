"""The chat page's image attachments, in headless Chromium, against a real ``modelc run
--mmproj`` serving the tiny Gemma 3 VLM (``tests/gen_gemma3vl.py``, ``exact`` mode) and a
text model (the tiny Qwen3, no vision part) side by side.

The reference for an answer is the official ``openai`` client sending the same
``image_url`` data URL and question (greedy); the page's request must carry exactly
that image part.  Picking, pasting and dropping each attach an image; a big one is
downscaled (JPEG, at most 1024 pixels a side) before it is kept; the thumbnails show in
the composer, then in the conversation, and after a reload; a model without vision
shows the attach button disabled with a tooltip saying why.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chat_page_support import (
    Page,
    chat_bodies,
    open_page,
    send,
    set_settings,
    shown_messages,
    stored,
    wait_idle,
)
from tests.gen_families import ensure_family
from tests.gen_gemma3vl import ensure_model
from tests.peers import openai_client
from tests.server_fixtures import Server, start

IMAGES = Path(__file__).parent / "fixtures" / "vision"
QUESTION = "What is in the picture?"
N = 8

# a file put into the page as the clipboard's or a drag's (a DataTransfer of one File)
TRANSFER = """([kind, name, type, b64]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const dt = new DataTransfer();
  dt.items.add(new File([bytes], name, {type}));
  const init = {bubbles: true, cancelable: true};
  const ev = kind === 'paste'
    ? new ClipboardEvent('paste', {...init, clipboardData: dt})
    : new DragEvent('drop', {...init, dataTransfer: dt});
  document.getElementById(kind === 'paste' ? 'prompt' : 'log').dispatchEvent(ev);
}"""


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def srv() -> Iterator[Server]:
    _, gg, mm = ensure_model()
    _, text = ensure_family("qwen3")
    s = start(
        None,
        str(gg),
        str(text),
        "--mmproj",
        str(mm),
        "--kv-cache",
        "f32",
        env={"MODELC_MATMUL": "exact"},
    )
    yield s
    s.stop()


def pending(page: Page) -> list[str]:
    """The data URLs of the composer's thumbnails."""
    return page.locator("#pending .thumb img").evaluate_all("imgs => imgs.map(i => i.src)")  # type: ignore[no-any-return]


def shown_images(page: Page) -> list[dict[str, Any]]:
    """The conversation's thumbnails: source and decoded width (0: not shown)."""
    page.wait_for_function(
        "[...document.querySelectorAll('.msg.user .gallery img')].every(i => i.complete)"
    )
    return page.locator(".msg.user .gallery img").evaluate_all(  # type: ignore[no-any-return]
        "imgs => imgs.map(i => ({src: i.src, width: i.naturalWidth}))"
    )


def test_an_attached_image_is_sent_answered_and_kept(page: Page, srv: Server) -> None:
    png = (IMAGES / "square.png").read_bytes()
    url = data_url(png)
    sent: Any = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": QUESTION},
            ],
        }
    ]
    ref = openai_client(srv).chat.completions.create(
        model="gemma3vl", messages=sent, temperature=0, max_tokens=N
    )
    want = ref.choices[0].message.content
    assert want and ref.usage is not None
    open_page(page, srv.url)
    set_settings(page, temperature=0, max_tokens=N)
    attach = page.locator("#attach")
    assert attach.get_attribute("aria-disabled") == "false"
    bodies = chat_bodies(page)
    page.set_input_files("#attach-input", str(IMAGES / "square.png"))
    page.wait_for_selector("#pending .thumb img")
    assert pending(page) == [url]  # small enough: kept byte for byte
    send(page, QUESTION)
    assert wait_idle(page) == "done"
    assert bodies[-1]["model"] == "gemma3vl" and bodies[-1]["messages"] == sent
    assert shown_messages(page) == [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": want},
    ]
    st = stored(page)
    conv = next(c for c in st["conversations"] if c["id"] == st["current"])
    assert conv["messages"][0]["alts"][0]["images"] == [url]
    assert conv["messages"][1]["alts"][0]["stats"]["prompt_tokens"] == ref.usage.prompt_tokens
    assert pending(page) == []  # the composer's thumbnail went with the message
    assert shown_images(page) == [{"src": url, "width": 32}]
    # kept with the conversation: shown after a reload, and sent again with the next turn
    open_page(page, srv.url)
    assert shown_images(page) == [{"src": url, "width": 32}]
    send(page, "And the colours?")
    assert wait_idle(page) == "done"
    assert bodies[-1]["messages"][0] == sent[0]
    assert bodies[-1]["messages"][2] == {"role": "user", "content": "And the colours?"}
    # an edit changes the words and keeps the image
    page.locator(".msg.user button.edit").first.click()
    page.fill(".edit-box", "Describe it.")
    page.click(".edit-send")
    assert wait_idle(page) == "done"
    edited = [sent[0]["content"][0], {"type": "text", "text": "Describe it."}]
    assert bodies[-1]["messages"] == [{"role": "user", "content": edited}]
    # exported with the conversation, and imported back into a fresh profile
    with page.expect_download() as dl:
        page.click("#export")
    exported = Path(dl.value.path()).read_bytes()
    page.evaluate("localStorage.clear()")
    open_page(page, srv.url)
    assert page.locator(".gallery").count() == 0
    page.set_input_files(
        "#import", files=[{"name": "c.json", "mimeType": "application/json", "buffer": exported}]
    )
    page.wait_for_selector(".msg.user .gallery img")
    assert shown_images(page) == [{"src": url, "width": 32}]


def test_paste_drop_remove_and_a_big_image_downscaled(page: Page, srv: Server) -> None:
    from PIL import Image

    open_page(page, srv.url)
    wide = (IMAGES / "wide.png").read_bytes()
    gray = (IMAGES / "gray.png").read_bytes()
    page.evaluate(TRANSFER, ["paste", "wide.png", "image/png", base64.b64encode(wide).decode()])
    page.wait_for_function("document.querySelectorAll('#pending img').length === 1")
    page.evaluate(TRANSFER, ["drop", "gray.png", "image/png", base64.b64encode(gray).decode()])
    page.wait_for_function("document.querySelectorAll('#pending img').length === 2")
    assert pending(page) == [data_url(wide), data_url(gray)]
    # a 3000 x 1500 photo-like image: kept as a JPEG of 1024 x 512
    big = Image.linear_gradient("L").resize((3000, 1500)).convert("RGB")
    out = io.BytesIO()
    big.save(out, "PNG")
    page.set_input_files(
        "#attach-input",
        files=[{"name": "big.png", "mimeType": "image/png", "buffer": out.getvalue()}],
    )
    page.wait_for_function("document.querySelectorAll('#pending img').length === 3")
    kept = pending(page)[2]
    assert kept.startswith("data:image/jpeg;base64,")
    small = Image.open(io.BytesIO(base64.b64decode(kept.split(",", 1)[1])))
    assert small.size == (1024, 512)
    # a file the browser cannot read as an image is named, not attached
    page.set_input_files(
        "#attach-input", files=[{"name": "notes.png", "mimeType": "image/png", "buffer": b"hi"}]
    )
    page.wait_for_function("document.getElementById('status').textContent.includes('notes.png')")
    assert len(pending(page)) == 3
    # the remove button takes one away
    page.locator("#pending .thumb").nth(1).locator("button.remove").click()
    assert pending(page) == [data_url(wide), kept]


def test_a_model_without_vision_disables_attach(page: Page, srv: Server) -> None:
    open_page(page, srv.url)
    attach = page.locator("#attach")
    assert attach.get_attribute("aria-disabled") == "false"
    page.select_option("#model-select", "qwen3")
    page.wait_for_function("document.getElementById('attach').ariaDisabled === 'true'")
    assert "takes no images" in (attach.get_attribute("title") or "")
    attach.dispatch_event("click")  # aria-disabled: Playwright would wait for it to enable
    assert "takes no images" in page.locator("#status").inner_text()
    png = base64.b64encode((IMAGES / "wide.png").read_bytes()).decode()
    page.evaluate(TRANSFER, ["paste", "wide.png", "image/png", png])
    page.evaluate(TRANSFER, ["drop", "wide.png", "image/png", png])
    assert pending(page) == []
    page.select_option("#model-select", "gemma3vl")
    page.wait_for_function("document.getElementById('attach').ariaDisabled === 'false'")


def test_a_refused_message_gives_its_image_back(page: Page, srv: Server) -> None:
    """The server refuses the image (here: the request is turned to the text model on its
    way): the message leaves the conversation and its image goes back to the composer,
    as a refused message's text goes back to the prompt."""
    open_page(page, srv.url)
    png = (IMAGES / "gray.png").read_bytes()
    page.set_input_files("#attach-input", str(IMAGES / "gray.png"))
    page.wait_for_selector("#pending .thumb img")
    # the model changes behind the page's back: the request goes to the text model
    page.route(
        "**/v1/chat/completions",
        lambda route: route.continue_(
            post_data=route.request.post_data.replace('"gemma3vl"', '"qwen3"')  # type: ignore[union-attr]
        ),
    )
    send(page, QUESTION)
    assert wait_idle(page) == "error"
    assert "takes no images" in page.locator(".error").inner_text()
    assert pending(page) == [data_url(png)]
    assert page.input_value("#prompt") == QUESTION
    assert shown_messages(page) == []


# fill the page's storage to the brim, then leave ``room`` characters free
FILL = """(room) => {
  let lo = 0, hi = 1 << 24;
  while (hi - lo > 16) {
    const mid = (lo + hi) >> 1;
    try { localStorage.setItem('junk', 'x'.repeat(mid)); lo = mid; } catch { hi = mid; }
  }
  localStorage.setItem('junk', 'x'.repeat(lo - room));
}"""


def test_storage_full_keeps_the_text_without_the_image(page: Page, srv: Server) -> None:
    """Conversations that do not fit the browser's storage with their images are saved
    without the images' data: the page says so, this session still shows the image, and
    after a reload a note stands in its place and the words are kept."""
    open_page(page, srv.url)
    set_settings(page, temperature=0, max_tokens=2)
    page.evaluate(FILL, 1500)  # room for a short conversation, not for a 3 kB image
    page.set_input_files("#attach-input", str(IMAGES / "square.png"))
    page.wait_for_selector("#pending .thumb img")
    send(page, QUESTION)
    assert wait_idle(page) == "done"
    assert "storage full" in page.locator("#status").inner_text()
    assert len(shown_images(page)) == 1  # this session still has it
    conv = stored(page)["conversations"][0]
    assert conv["messages"][0]["alts"][0] == {"content": QUESTION, "images": [None]}
    open_page(page, srv.url)
    assert page.locator(".msg.user .gallery .thumb.missing").inner_text() == (
        "image not kept (browser storage full)"
    )
    assert shown_messages(page)[0] == {"role": "user", "content": QUESTION}
