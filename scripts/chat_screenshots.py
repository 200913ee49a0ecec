"""Screenshots of the chat page for the README: desktop (1280x800) and phone (390x844),
light and dark, into docs/chat-{desktop,phone}-{light,dark}.png.

    .venv/bin/python scripts/chat_screenshots.py [--url http://127.0.0.1:8080]

Without --url it starts ``modelc run`` on the test SmolLM2 model. The conversation shown
is imported (docs/chat-demo.json's text, written below), so the pictures are the same on
every run; the last reply is generated live at temperature 0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]

CODE = (
    "def fib(n: int) -> int:\n"
    '    """The n-th Fibonacci number."""\n'
    "    a, b = 0, 1\n"
    "    for _ in range(n):\n"
    "        a, b = b, a + b\n"
    "    return a\n"
)


def slot(role: str, content: str, **extra: object) -> dict[str, object]:
    return {"role": role, "cur": 0, "alts": [{"content": content, **extra}]}


DEMO = {
    "format": "modelc-chat",
    "version": 1,
    "conversations": [
        {
            "title": "Fibonacci in Python",
            "messages": [
                slot("user", "Write a Python function for the n-th Fibonacci number."),
                slot(
                    "assistant",
                    "Here is an **iterative** version, linear in `n`:\n\n```python\n"
                    + CODE
                    + "```\n\nFor example `fib(10)` is **55**.",
                    finish="stop",
                    stats={"completion_tokens": 74, "tps": 61.4, "prompt_tokens": 41},
                ),
            ],
        },
        {"title": "Ideas for a weekend trip", "messages": [slot("user", "Ideas for a trip?")]},
    ],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="a running modelc server (default: start one)")
    ap.add_argument("--out", default=str(ROOT / "docs"))
    args = ap.parse_args()
    srv = None
    url = args.url
    if url is None:
        from tests.assets import smollm2_gguf
        from tests.server_fixtures import start

        srv = start(str(smollm2_gguf()))
        url = srv.url
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=shutil.which("chromium"), headless=True, args=ARGS
            )
            for scheme in ("light", "dark"):
                for name, size in (
                    ("desktop", {"width": 1280, "height": 800}),
                    ("phone", {"width": 390, "height": 844}),
                ):
                    ctx = browser.new_context(
                        viewport=size, color_scheme=scheme, device_scale_factor=1
                    )
                    page = ctx.new_page()
                    page.goto(url + "/")
                    page.wait_for_function("document.body.dataset.ready === '1'")
                    page.set_input_files(
                        "#import",
                        files=[
                            {
                                "name": "demo.json",
                                "mimeType": "application/json",
                                "buffer": json.dumps(DEMO).encode(),
                            }
                        ],
                    )
                    page.evaluate(
                        "localStorage.setItem('modelc.chat.settings',"
                        " JSON.stringify({temperature: 0, max_tokens: 40}))"
                    )
                    page.reload()
                    page.wait_for_function("document.body.dataset.ready === '1'")
                    page.fill("#prompt", "Is it fast for large n?")
                    page.press("#prompt", "Enter")
                    page.wait_for_function(
                        "['done', 'error'].includes(document.body.dataset.state)",
                        timeout=120_000,
                    )
                    page.fill("#prompt", "")
                    page.evaluate("document.activeElement.blur()")
                    path = out / f"chat-{name}-{scheme}.png"
                    page.screenshot(path=str(path))
                    print(f"{path} {path.stat().st_size // 1024} KB")
                    ctx.close()
            browser.close()
    finally:
        if srv is not None:
            srv.stop()


if __name__ == "__main__":
    main()
