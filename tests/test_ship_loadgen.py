"""``modelc bench --url --turns T --conversation-header NAME``: multi-turn conversations that
resend their history (so prompts share prefixes), each with its own id header, as the
loopback fleet (bench/fleet.py) drives nginx's consistent hashing with."""

from __future__ import annotations

import contextlib
import http.server
import itertools
import json
import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, ClassVar

import trio

from modelc.bench.loadgen import run_load
from tests.server_fixtures import Server


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Streams the reply 'r<k>' for the k-th request; records headers and bodies."""

    seen: ClassVar[list[tuple[str | None, dict[str, Any]]]] = []
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._send(b'{"object": "list", "data": [{"id": "m"}]}', "application/json")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.headers.get("X-Conversation-Id"), body))
        k = len(self.seen)
        delta = {"choices": [{"index": 0, "delta": {"content": f"r{k}"}, "finish_reason": None}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
        sse = f"data: {json.dumps(delta)}\n\ndata: {json.dumps(usage)}\n\ndata: [DONE]\n\n"
        self._send(sse.encode(), "text/event-stream")

    def _send(self, data: bytes, ctype: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def _serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served on 127.0.0.1 for the block: its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_conversations_resend_history_under_one_header() -> None:
    with _serving(_Recorder) as base:
        res = trio.run(
            lambda: run_load(
                f"{base}/v1/chat/completions", concurrency=[2], requests=7, prompt_len=16,
                max_tokens=2, turns=3, header="X-Conversation-Id",
            )
        )  # fmt: skip
    assert res.levels[0].completed == 7
    convs: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for key, body in _Recorder.seen:
        convs[key].append(body)
    # 7 requests, two workers, conversations of up to 3 turns: 3 + 3 + 1 when the workers
    # alternate, 3 + 2 + 2 when one finishes its first conversation before the other's
    # second turn (a slow machine's timing); either way one id a conversation
    assert None not in convs and len(convs) == 3
    assert sorted(len(v) for v in convs.values()) in ([1, 3, 3], [2, 2, 3])
    for bodies in convs.values():
        first = bodies[0]["messages"]
        assert [m["role"] for m in first] == ["user"] and len(first[0]["content"].split()) == 16
        for prev, cur in itertools.pairwise(bodies):
            sent = cur["messages"]
            assert sent[: len(prev["messages"])] == prev["messages"]  # a shared prefix
            assert sent[len(prev["messages"])]["role"] == "assistant"
            assert sent[-1]["role"] == "user" and len(sent[-1]["content"].split()) == 8
    replies = {
        m["content"] for _, b in _Recorder.seen for m in b["messages"] if m["role"] != "user"
    }
    assert replies and all(r.startswith("r") for r in replies)  # what the server streamed


def test_turns_reach_the_prefix_cache_of_a_real_server(smol_server: Server) -> None:
    """Against ``modelc run``: a conversation's later turns are served from its prefix
    cache (the server's own counters), single-turn requests of new words much less."""

    def cached_after(turns: int) -> float:
        before = smol_server.metric("modelc_prefix_cache_tokens_total")
        res = trio.run(
            lambda: run_load(
                f"{smol_server.url}/v1/chat/completions", concurrency=[2], requests=6,
                prompt_len=48, max_tokens=4, turns=turns, seed=turns,
            )
        )  # fmt: skip
        assert res.levels[0].completed == 6
        return smol_server.metric("modelc_prefix_cache_tokens_total") - before

    single, multi = cached_after(1), cached_after(3)
    # 2 conversations x 2 later turns, each resending >= 64 tokens of history
    assert multi >= single + 4 * 64, (single, multi)


class _Chunked(http.server.BaseHTTPRequestHandler):
    """Streams each answer chunked, as an SSE server does: its tokens, ``[DONE]``, and the
    body's end a moment later; counts the connections it is opened."""

    connections: ClassVar[int] = 0
    drop_second: ClassVar[bool] = False  # a connection's second request closes it unanswered
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        type(self).connections += 1
        self.served = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.served += 1
        if self.drop_second and self.served > 1:
            self.close_connection = True  # gone without a word, as llama.cpp's server goes
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
        for data in ('{"choices": [{"index": 0, "text": "a", "finish_reason": null}]}',
                     json.dumps(usage), "[DONE]"):  # fmt: skip
            frame = f"data: {data}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            self.wfile.flush()
        threading.Event().wait(0.05)  # the terminating chunk after [DONE], as Hypercorn's
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, format: str, *args: object) -> None:
        pass


def _chunked_load(concurrency: int, requests: int, drop_second: bool = False) -> Any:
    """:func:`run_load` against a :class:`_Chunked` server on 127.0.0.1: the level's result."""
    _Chunked.connections, _Chunked.drop_second = 0, drop_second
    try:
        with _serving(_Chunked) as base:
            res = trio.run(
                lambda: run_load(
                    f"{base}/v1/completions", concurrency=[concurrency], requests=requests,
                    max_tokens=2, model="m",
                )
            )  # fmt: skip
    finally:
        _Chunked.drop_second = False
    return res.levels[0]


def test_a_streamed_answer_read_to_its_end_keeps_the_connection() -> None:
    """The load reads each stream past ``[DONE]`` to the body's end, as the openai client
    does, so its connections are reused: 12 requests, 3 at a time, over 3 connections
    (breaking off at ``[DONE]`` opened one a request, for the server a new HTTP connection
    each: more of its time than real clients cost it)."""
    level = _chunked_load(3, 12)
    assert level.completed == 12 and level.errors == 0 and level.output_tokens == 24
    assert _Chunked.connections == 3


def test_a_kept_connection_the_server_closed_is_tried_once_more() -> None:
    """A server that closes a connection after its answer without saying so (llama.cpp's):
    the next request on that connection meets no answer and goes once more on a new
    connection, as the openai client retries; none fails."""
    level = _chunked_load(2, 6, drop_second=True)
    assert level.completed == 6 and level.errors == 0, level.error_samples
    assert _Chunked.connections > 2  # the dropped ones were replaced
