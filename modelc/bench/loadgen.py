"""A load generator of streaming SSE clients for any OpenAI-compatible server.

For each concurrency level ``c`` it keeps ``c`` clients busy until ``requests``
requests have finished (a bounded loop: never more than ``requests`` per level),
each a streaming ``/v1/completions`` (or ``/v1/chat/completions``) request with a
prompt of about ``prompt_len`` tokens of random words (unique per request, so no
server can answer from a prefix cache) and ``max_tokens`` output tokens
(``ignore_eos``, which modelc and llama.cpp both honour, keeps the length fixed).

Conversations (``turns > 1``): each conversation is ``turns`` requests in order, each
sending the whole history (the first user message of ``prompt_len`` words, then
every reply and a new user message of ``prompt_len // 4`` words, at least 8), so a
conversation's prompts share prefixes.  ``header`` names a request header carrying a
conversation id (``X-Conversation-Id: c<level>-<k>``), which a consistent-hashing
proxy (nginx ``hash $http_x_conversation_id consistent``, ingress-nginx's
``upstream-hash-by``) uses to keep a conversation on one replica.

Per request it records the time to first token (TTFT), the gaps between streamed
tokens (ITL), the time per output token after the first (TPOT) and the end-to-end
latency (E2E). Only loopback servers are accepted: this is a benchmark, not a load
test of someone else's machine.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import trio

from modelc.bench.offline import WORDS
from modelc.errors import ModelcError, UsageError
from modelc.net import ssl_context

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


class ServerUnreachableError(ModelcError):
    """The benchmark target did not answer."""


@dataclass
class RequestTrace:
    ok: bool
    start: float
    end: float
    stamps: list[float] = field(default_factory=list)  # arrival of each token chunk
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""
    text: str = ""  # the streamed output

    @property
    def ttft(self) -> float | None:
        return self.stamps[0] - self.start if self.stamps else None

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2 or not self.stamps:
            return None
        return (self.end - self.stamps[0]) / (self.output_tokens - 1)

    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]


@dataclass
class Dist:
    """mean, p50, p90, p99 of a latency in milliseconds (NaN when there is no sample)."""

    mean: float
    p50: float
    p90: float
    p99: float
    n: int

    @classmethod
    def of(cls, xs: Sequence[float]) -> Dist:
        if not xs:
            nan = math.nan
            return cls(nan, nan, nan, nan, 0)
        s = sorted(x * 1000.0 for x in xs)

        def pct(p: float) -> float:  # linear interpolation, as numpy's default
            k = (len(s) - 1) * p / 100.0
            lo, hi = math.floor(k), math.ceil(k)
            return s[lo] + (s[hi] - s[lo]) * (k - lo)

        return cls(sum(s) / len(s), pct(50), pct(90), pct(99), len(s))


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    completed: int
    errors: int
    wall_s: float
    request_throughput: float  # completed requests / s
    output_tps: float  # output tokens / s, all streams together
    input_tokens: int
    output_tokens: int
    ttft: Dist
    tpot: Dist
    itl: Dist
    e2e: Dist
    error_samples: list[str] = field(default_factory=list)


@dataclass
class LoadResult:
    url: str
    endpoint: str
    model: str
    prompt_len: int
    max_tokens: int
    levels: list[LevelResult]


def _check_loopback(url: str) -> tuple[str, str]:
    """(base URL, endpoint path) for a loopback ``url``; anything else is a UsageError."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise UsageError(f"--url {url!r}: give an http://HOST:PORT address")
    host = u.hostname
    loop = host == "localhost"
    if not loop:
        try:
            loop = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loop = False
    if not loop:
        raise UsageError(
            f"--url {url!r}: only loopback servers (127.0.0.1, ::1, localhost) may be load-tested"
        )
    path = u.path.rstrip("/")
    endpoint = ""
    for ep in (CHAT, COMPLETIONS):
        if path.endswith(ep):
            endpoint, path = ep, path[: -len(ep)]
            break
    base = f"{u.scheme}://{u.netloc}{path}"
    return base, endpoint


def make_prompt(n_words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


async def discover_model(client: httpx.AsyncClient, base: str) -> str:
    """The first model id the server lists (``default`` if it lists none)."""
    try:
        r = await client.get(f"{base}/v1/models", timeout=10)
    except httpx.TransportError as e:
        raise ServerUnreachableError(
            f"cannot reach {base} ({type(e).__name__}: {e or 'no answer'}); is the server running?"
        ) from e
    if r.status_code != 200:
        return "default"
    try:
        data = r.json().get("data") or []
        return str(data[0]["id"]) if data else "default"
    except (ValueError, KeyError, TypeError, AttributeError):
        return "default"


async def probe(url: str, timeout: float = 10.0) -> str:
    """Check ``url`` is a reachable loopback server; the model id it lists first."""
    base, _ = _check_loopback(url)
    async with httpx.AsyncClient(timeout=timeout, verify=ssl_context()) as client:
        return await discover_model(client, base)


async def one_request(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    chat: bool,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> RequestTrace:
    tr = RequestTrace(ok=False, start=time.perf_counter(), end=0.0)
    pieces: list[str] = []
    try:
        for attempt in (0, 1):
            answered = False
            try:
                async with client.stream(
                    "POST", url, json=body, timeout=timeout, headers=headers
                ) as r:
                    answered = True
                    tr.ok = await _read_stream(r, tr, chat, pieces)
                break
            except httpx.RemoteProtocolError:
                # a kept-alive connection the server closed after its last answer (llama.cpp's
                # server does): once more on a new one, as the openai client retries; never
                # a request the server began answering
                if attempt or answered:
                    raise
    except httpx.HTTPError as e:
        tr.error = f"{type(e).__name__}: {e}"[:200]
    except (ValueError, KeyError) as e:
        tr.error = f"bad stream data: {e}"[:200]
    finally:
        tr.end = time.perf_counter()
        tr.text = "".join(pieces)
        if tr.output_tokens == 0:
            tr.output_tokens = len(tr.stamps)
    return tr


async def _read_stream(r: httpx.Response, tr: RequestTrace, chat: bool, pieces: list[str]) -> bool:
    """One streamed answer into ``tr`` (each token chunk's arrival, the usage) and its text
    into ``pieces``; False with ``tr.error`` where the server answered with an error."""
    if r.status_code != 200:
        text = (await r.aread()).decode(errors="replace")
        tr.error = f"HTTP {r.status_code}: {text[:200]}"
        return False
    done = False
    async for line in r.aiter_lines():
        if done or not line.startswith("data:"):
            continue  # blank lines, ': ping' comments, event: lines
        data = line[5:].strip()
        if data == "[DONE]":
            # read on to the body's end, as the openai client does: the connection goes
            # back to the pool, where breaking off closed it (a new TCP and HTTP
            # connection a request, for the client and for the server)
            done = True
            continue
        obj = json.loads(data)
        if "error" in obj:
            tr.error = f"stream error: {str(obj['error'])[:200]}"
            return False
        usage = obj.get("usage")
        if usage:
            tr.output_tokens = int(usage.get("completion_tokens") or 0)
            tr.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        for ch in obj.get("choices") or []:
            piece = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
            if ch.get("finish_reason") is None or piece:
                tr.stamps.append(time.perf_counter())
            if piece:
                pieces.append(str(piece))
    return True


def summarize(c: int, n: int, traces: list[RequestTrace], wall: float) -> LevelResult:
    ok = [t for t in traces if t.ok]
    out_tokens = sum(t.output_tokens for t in ok)
    return LevelResult(
        concurrency=c,
        requests=n,
        completed=len(ok),
        errors=len(traces) - len(ok),
        wall_s=wall,
        request_throughput=len(ok) / wall if wall > 0 else 0.0,
        output_tps=out_tokens / wall if wall > 0 else 0.0,
        input_tokens=sum(t.prompt_tokens for t in ok),
        output_tokens=out_tokens,
        ttft=Dist.of([x for t in ok if (x := t.ttft) is not None]),
        tpot=Dist.of([x for t in ok if (x := t.tpot) is not None]),
        itl=Dist.of([g for t in ok for g in t.itl()]),
        e2e=Dist.of([t.e2e for t in ok]),
        error_samples=sorted({t.error for t in traces if not t.ok})[:5],
    )


class Conversation:
    """One client's conversation: the next request's body, and the history it grows."""

    def __init__(
        self, base: dict[str, Any], chat: bool, first: str, header: tuple[str, str] | None
    ) -> None:
        self.base, self.chat = base, chat
        self.messages: list[dict[str, str]] = []
        self.prompt = ""
        self.pending = first  # the next user message
        self.headers = dict([header]) if header else None

    def body(self) -> dict[str, Any]:
        if self.chat:
            self.messages.append({"role": "user", "content": self.pending})
            return {**self.base, "messages": list(self.messages)}
        self.prompt = f"{self.prompt} {self.pending}".lstrip()
        return {**self.base, "prompt": self.prompt}

    def reply(self, text: str, next_user: str) -> None:
        if self.chat:
            self.messages.append({"role": "assistant", "content": text})
        else:
            self.prompt += text
        self.pending = next_user


async def run_level(
    client: httpx.AsyncClient,
    url: str,
    c: int,
    requests: int,
    conversation: Callable[[], Conversation],
    chat: bool,
    timeout: float,
    on_done: Callable[[int, RequestTrace], None] | None,
    turns: int = 1,
    next_user: Callable[[], str] | None = None,
) -> LevelResult:
    """``requests`` requests, ``c`` conversations at a time, each of up to ``turns``."""
    traces: list[RequestTrace] = []
    next_i = 0

    async def worker() -> None:
        nonlocal next_i
        while next_i < requests:
            conv = conversation()
            for _ in range(turns):
                if next_i >= requests:
                    break
                next_i += 1
                tr = await one_request(client, url, conv.body(), chat, timeout, conv.headers)
                traces.append(tr)
                if on_done is not None:
                    on_done(c, tr)
                if not tr.ok:
                    break
                conv.reply(tr.text, next_user() if next_user else "")

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(min(c, requests)):
            nursery.start_soon(worker)
    return summarize(c, requests, traces, time.perf_counter() - t0)


def request_body(model: str, max_tokens: int, sampling: Mapping[str, Any]) -> dict[str, Any]:
    """A load request's fields but its prompt: streamed, ``max_tokens`` long whatever the
    model says (``ignore_eos``), greedy unless ``sampling`` sets temperature, top_k, top_p
    or min_p (the OpenAI fields and the llama.cpp / vLLM extensions every peer reads)."""
    return {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        **sampling,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


async def run_load(
    url: str,
    *,
    concurrency: Sequence[int] = (1, 4, 8),
    requests: int = 16,
    prompt_len: int = 128,
    max_tokens: int = 64,
    model: str | None = None,
    chat: bool | None = None,
    timeout: float = 600.0,
    seed: int = 0,
    on_done: Callable[[int, RequestTrace], None] | None = None,
    turns: int = 1,
    header: str | None = None,
    sampling: Mapping[str, Any] | None = None,
) -> LoadResult:
    """Drive the server at ``url`` at each concurrency level in turn (see the module doc);
    ``sampling``: the requests' sampling fields (temperature, top_k, ...; default greedy)."""
    if requests < 1 or prompt_len < 1 or max_tokens < 1 or not concurrency:
        raise UsageError("--requests, --prompt-len and --max-tokens must be >= 1")
    if any(c < 1 for c in concurrency):
        raise UsageError("--concurrency levels must be >= 1")
    if turns < 1:
        raise UsageError(f"--turns must be >= 1, got {turns}")
    if header is not None and not (header and header.replace("-", "").isalnum()):
        raise UsageError(f"--conversation-header {header!r}: use letters, digits and '-'")
    base, endpoint = _check_loopback(url)
    if chat is not None:
        endpoint = CHAT if chat else COMPLETIONS
    endpoint = endpoint or COMPLETIONS
    is_chat = endpoint == CHAT
    limits = httpx.Limits(
        max_connections=max(concurrency) + 2, max_keepalive_connections=max(concurrency) + 2
    )
    rng = random.Random(seed)
    levels: list[LevelResult] = []

    n_conv = 0

    def conversation(name: str, c: int) -> Conversation:
        nonlocal n_conv
        n_conv += 1
        b = request_body(name, max_tokens, sampling or {})
        key = (header, f"c{c}-{n_conv}") if header else None
        return Conversation(b, is_chat, make_prompt(prompt_len, rng), key)

    def next_user() -> str:
        return make_prompt(max(8, prompt_len // 4), rng)

    async with httpx.AsyncClient(limits=limits, timeout=timeout, verify=ssl_context()) as client:
        name = model or await discover_model(client, base)
        for c in concurrency:
            lvl = await run_level(
                client,
                base + endpoint,
                c,
                requests,
                functools.partial(conversation, name, c),
                is_chat,
                timeout,
                on_done,
                turns,
                next_user,
            )
            if lvl.completed == 0 and all(
                s.startswith(("ConnectError", "ConnectTimeout")) for s in lvl.error_samples
            ):
                raise ServerUnreachableError(
                    f"cannot reach {base}: {lvl.error_samples[0] if lvl.error_samples else 'no answer'}"
                )
            levels.append(lvl)
    return LoadResult(base, endpoint, name, prompt_len, max_tokens, levels)
