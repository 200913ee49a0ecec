"""The built-in chat page streams a reply in headless Chromium (Debian's ``chromium``).

Chromium is driven over the DevTools protocol (a small websocket client on wsproto):
the page is opened with ``?q=...``, which sends the message on load; the test polls the
DOM until the page marks the reply done, and checks the streamed text against a
non-streamed request with the same settings, and the prompt's token count (the page
shows the stream's usage) against llama.cpp's for the same conversation.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from typing import Any

import httpx
import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Ping, Request, TextMessage

from bench.llamacpp_peer import LlamaCppServer
from tests.peers import llamacpp
from tests.server_fixtures import Server, free_port, smol_server

__all__ = ["llamacpp", "smol_server"]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class CDP:
    """A minimal synchronous Chrome DevTools Protocol client over one page's websocket."""

    def __init__(self, ws_url: str) -> None:
        u = urllib.parse.urlparse(ws_url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=30)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock.sendall(self.ws.send(Request(host=f"{u.hostname}:{u.port}", target=u.path)))
        self.ids = itertools.count(1)
        self.pending = ""
        while not any(isinstance(e, AcceptConnection) for e in self._events()):
            pass

    def _events(self) -> list[Any]:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("devtools socket closed")
        self.ws.receive_data(data)
        out = []
        for e in self.ws.events():
            if isinstance(e, Ping):
                self.sock.sendall(self.ws.send(e.response()))
            elif isinstance(e, CloseConnection):
                raise ConnectionError("devtools closed the websocket")
            out.append(e)
        return out

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        i = next(self.ids)
        self.sock.sendall(
            self.ws.send(TextMessage(json.dumps({"id": i, "method": method, "params": params})))
        )
        while True:
            for e in self._events():
                if not isinstance(e, TextMessage):
                    continue
                self.pending += e.data
                if not e.message_finished:
                    continue
                msg, self.pending = json.loads(self.pending), ""
                if msg.get("id") == i:
                    if "error" in msg:
                        raise RuntimeError(msg["error"])
                    return msg["result"]  # type: ignore[no-any-return]

    def eval(self, expr: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        return r["result"].get("value")

    def close(self) -> None:
        self.sock.close()


@pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (apt-get install -y chromium)"
)
def test_chat_page_streams_reply(smol_server: Server, llamacpp: LlamaCppServer) -> None:
    assert CHROMIUM is not None
    port = free_port()
    url = f"{smol_server.url}/?q=Hello&max_tokens=8&temperature=0"
    # chromium's helper processes may still write to the profile as it exits
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--remote-debugging-port={port}",
                f"--user-data-dir={profile}",
                url,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stopped as a whole below
        )
        try:
            deadline = time.monotonic() + 60
            page = None
            while page is None and time.monotonic() < deadline:
                try:
                    tabs = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=2).json()
                    page = next(
                        (t for t in tabs if t.get("type") == "page" and "q=Hello" in t["url"]), None
                    )
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            assert page is not None, "chromium did not open the page"
            cdp = CDP(page["webSocketDebuggerUrl"])
            try:
                states = set()
                while time.monotonic() < deadline:
                    state = cdp.eval("document.body.dataset.state || ''")
                    states.add(state)
                    if state in ("done", "error"):
                        break
                    time.sleep(0.1)
                log = cdp.eval("document.getElementById('log').innerText")
                assert state == "done", log
                reply = cdp.eval("document.getElementById('reply-1').textContent")
                chunks = int(cdp.eval("document.body.dataset.chunks || '0'"))
                prompt_tokens = int(cdp.eval("document.body.dataset.promptTokens || '-1'"))
            finally:
                cdp.close()
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    expected = httpx.post(
        f"{smol_server.url}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 8,
            "temperature": 0,
        },
        timeout=60,
    )
    assert expected.status_code == 200
    assert reply and reply == expected.json()["choices"][0]["message"]["content"], log
    # the reply arrived in pieces, each shown as it came (the "streaming" state itself may be
    # over before the first poll: 8 tokens take ~50 ms)
    assert "you: Hello" in log and chunks >= 2, (chunks, states)
    # the page's conversation is fed to the model as llama.cpp feeds it (its own template
    # and tokenizer on the same GGUF)
    messages = [{"role": "user", "content": "Hello"}]
    text = httpx.post(f"{llamacpp.url}/apply-template", json={"messages": messages}).json()
    ref = httpx.post(
        f"{llamacpp.url}/tokenize",
        json={"content": text["prompt"], "add_special": True, "parse_special": True},
    ).json()["tokens"]
    assert prompt_tokens == len(ref) == expected.json()["usage"]["prompt_tokens"]
