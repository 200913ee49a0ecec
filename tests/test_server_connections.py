"""Connections, not requests: idle keep-alive, the keep-alive race, idle and slow clients.

A real ``modelc run`` with ``--http-keep-alive 1`` and raw sockets, so what the server
does to a connection is seen byte for byte.  Before ``modelc.server.keepalive``, an idle
connection that had served one request was never closed (Hypercorn's idle timer died
with the request's task), so anyone could hold the server's sockets forever.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests import net
from tests.assets import smollm2_gguf
from tests.server_fixtures import Server, start

KEEP_ALIVE = 1.0
GET = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = start(str(smollm2_gguf()), "--http-keep-alive", str(KEEP_ALIVE))
    yield srv
    srv.stop()


def _connect(srv: Server, timeout: float = 5.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)
    s.settimeout(timeout)
    return s


def _read_response(s: socket.socket) -> bytes | None:
    """One whole HTTP/1.1 response (Content-Length bodies), or None if the server closed."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            return None
        buf += d
    head, _, body = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(body) < length:
        d = s.recv(65536)
        if not d:
            return None
        body += d
    return head


def _closed_within(s: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``s`` (EOF or reset), or None if still open."""
    t0 = time.monotonic()
    s.settimeout(seconds)
    try:
        data = s.recv(1)
    except TimeoutError:
        return None
    except ConnectionResetError:
        return time.monotonic() - t0
    assert data == b"", f"unexpected bytes on an idle connection: {data!r}"
    return time.monotonic() - t0


def test_idle_connection_after_a_request_is_closed(server: Server) -> None:
    s = _connect(server)
    s.sendall(GET)
    head = _read_response(s)
    assert head is not None and head.startswith(b"HTTP/1.1 200")
    took = _closed_within(s, KEEP_ALIVE + 4)
    s.close()
    assert took is not None, "the server kept an idle keep-alive connection open"
    assert took >= KEEP_ALIVE * 0.8


def test_request_at_the_keep_alive_edge_is_answered_or_refused_never_hung(
    server: Server,
) -> None:
    """Requests sent as the server's idle timer runs out: each gets its whole response or
    a closed connection (which clients retry), never silence. The 16 connections wait at
    once, each its own idle time."""

    def at_the_edge(i: int) -> str:
        s = _connect(server, timeout=4.0)
        s.sendall(GET)
        assert _read_response(s) is not None
        time.sleep(KEEP_ALIVE - 0.08 + 0.01 * i)
        try:
            s.sendall(GET)
            head = _read_response(s)
        except TimeoutError:
            return "hung"
        except (ConnectionResetError, BrokenPipeError):
            head = None
        finally:
            s.close()
        return "answered" if head is not None else "closed"

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(at_the_edge, range(16)))
    hung = [f"{KEEP_ALIVE - 0.08 + 0.01 * i:.2f}s" for i, o in enumerate(got) if o == "hung"]
    assert not hung, f"requests at these idle times hung: {hung}"
    assert "answered" in got and "closed" in got, got


def test_idle_and_slow_clients_are_shed_while_others_are_served(server: Server) -> None:
    """200 connections that never send a request and 50 that stall inside their headers
    (slowloris) neither block a chat request nor stay open past the keep-alive time."""
    idle = [_connect(server) for _ in range(200)]
    slow = [_connect(server) for _ in range(50)]
    for s in slow:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    client = openai.OpenAI(
        http_client=net.openai_http(),
        base_url=f"{server.url}/v1",
        api_key="x",
        max_retries=0,
        timeout=30,
    )
    reply = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1",
        messages=[{"role": "user", "content": "What is the capital of France? Answer briefly."}],
        max_tokens=12,
        temperature=0,
    )
    assert reply.choices[0].message.content and "Paris" in reply.choices[0].message.content
    time.sleep(KEEP_ALIVE + 0.5)
    still_open = 0
    for s in idle + slow:
        if _closed_within(s, 3.0) is None:
            still_open += 1
        s.close()
    assert still_open == 0, f"{still_open} idle or stalled connections left open"
    assert server.metric("modelc_requests_active") == 0
    assert server.metric("modelc_engine_running") == 0
