"""What serving costs per token: the engine in-process against the same engine over HTTP.

    .venv/bin/python -m bench.serving_cost [--streams 1,8] [--tokens 128] [--threads 2]
                                           [--reps 3] [--profile out.txt]

For SmolLM2-135M-Instruct Q4_1 and each stream count N it measures, alternating the
two sides ``--reps`` times (this machine is shared: medians of alternating runs):

* in-process: N greedy requests of ``--tokens`` tokens (``ignore_eos``) submitted to
  an engine built as ``modelc run`` builds it (f16 KV cache, the same threads), aggregate
  tokens/s from the first token to the last;
* over HTTP: the same N requests streamed from ``modelc run`` (the OpenAI route, SSE, one
  client connection each), aggregate tokens/s the same way. The client is ``--client
  raw`` (default: HTTP/1.1 over a trio socket, counting the content events in each
  chunk it receives, so that on this 2-core machine the client takes as little as
  possible from the server it measures) or ``httpx`` (an httpx stream parsed line by
  line, as a Python application would read it);

and reports the difference as microseconds of server work per generated token
(``1/http - 1/engine``, aggregate), and the CPU time the server's event-loop thread ran
per token (its ``schedstat``: request parsing, the scheduler's delivery, rendering, the
HTTP stack, the socket writes), which the machine's noise does not move as it moves the
throughputs.  With ``--profile FILE`` it samples the server
process with py-spy during one HTTP run of the largest N and writes the hottest
functions (own time) to FILE.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import trio

from modelc.bench.procs import ServerStartError, wait_healthy
from modelc.bench.timing import stream_tps
from modelc.engine import EngineOptions, build_engine
from modelc.engine.api import GenerationRequest, TokenEvent
from modelc.net import ssl_context
from modelc.runtime.sampling import SamplingParams
from modelc.server.schemas import ENCODER
from tests.assets import smollm2_gguf
from tests.server_fixtures import free_port

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Write a long story about a lighthouse keeper and the sea."


async def engine_tps(eng: object, prompt: list[int], n: int, tokens: int) -> float:
    """Aggregate tokens/s of ``n`` concurrent greedy requests, first token to last."""
    from modelc.engine import LLMEngine

    assert isinstance(eng, LLMEngine)
    stamps: list[float] = []
    p = SamplingParams(temperature=0.0, max_tokens=tokens)

    async def one(k: int) -> None:
        req = GenerationRequest(f"r{k}-{time.monotonic_ns()}", prompt, p, ignore_eos=True)
        async for ev in eng.submit(req):
            if isinstance(ev, TokenEvent):
                stamps.append(time.perf_counter())

    async with trio.open_nursery() as nursery:
        await nursery.start(eng.run)
        async with trio.open_nursery() as inner:
            for k in range(n):
                inner.start_soon(one, k)
        nursery.cancel_scope.cancel()
    return stream_tps(stamps, n)


def http_tps(url: str, messages: list[dict[str, str]], n: int, tokens: int) -> float:
    """The same through ``/v1/chat/completions`` streams, one connection each."""
    stamps: list[float] = []

    async def one(client: httpx.AsyncClient) -> None:
        body = {
            "messages": messages,
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if (
                    line.startswith("data: {")
                    and '"content":"' in line
                    and '"content":""' not in line
                ):
                    stamps.append(time.perf_counter())

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                client = httpx.AsyncClient(timeout=600, verify=ssl_context())
                nursery.start_soon(one, client)

    trio.run(main)
    return stream_tps(stamps, n)


def raw_tps(url: str, messages: list[dict[str, str]], n: int, tokens: int) -> float:
    """The same over raw HTTP/1.1 sockets: the cheapest client we can write in Python."""
    host, port = url.removeprefix("http://").split(":")
    body = ENCODER.encode(
        {
            "messages": messages,
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
    )
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    stamps: list[float] = []

    async def one() -> None:
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(head + body)
            rest = b""
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                events = (rest + data).split(b"\n\n")
                rest = events.pop()
                now = time.perf_counter()
                for ev in events:
                    if b'"content":"' in ev and b'"content":""' not in ev:
                        stamps.append(now)
                    elif b"[DONE]" in ev:
                        return

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)

    trio.run(main)
    return stream_tps(stamps, n)


def loop_cpu_ns(pid: int) -> int:
    """CPU time the server's event-loop thread (its main thread) has run, from schedstat."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0])


def start_server(
    gguf: Path, threads: int, n: int, interval: int = 0
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = dict(os.environ, MODELC_HOME=tempfile.mkdtemp(prefix="serving-cost-"))
    cmd = [sys.executable, "-m", "modelc.cli", "run", str(gguf), "--port", str(port)]
    cmd += ["--threads", str(threads), "--max-concurrent", str(max(n, 1))]
    cmd += ["--stream-interval", str(interval)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 300.0, poll=0.2)
    except ServerStartError as e:
        raise RuntimeError(f"modelc run did not start: {e}") from e
    return proc, url


def profile(pid: int, seconds: float, out: Path) -> None:
    """py-spy's own-time top functions of ``pid`` over ``seconds``."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    raw = out.with_suffix(".raw.txt")
    subprocess.run(
        [
            spy,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--format",
            "raw",
            "--output",
            str(raw),
            "--nonblocking",
        ],
        check=True,
        capture_output=True,
    )
    own: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not frames or not count.isdigit():
            continue
        total += int(count)
        own[frames[-1]] = own.get(frames[-1], 0) + int(count)
    top = sorted(own.items(), key=lambda kv: -kv[1])[:25]
    out.write_text("\n".join(f"{100 * c / total:5.1f}%  {f}" for f, c in top) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", type=Path, default=None)
    ap.add_argument("--client", choices=["raw", "httpx"], default="raw")
    ap.add_argument(
        "--stream-interval", type=int, default=0, help="both sides' --stream-interval (0: auto)"
    )
    a = ap.parse_args()
    client = raw_tps if a.client == "raw" else http_tps
    streams = [int(x) for x in a.streams.split(",")]
    gguf = smollm2_gguf()
    messages = [{"role": "user", "content": PROMPT}]
    opts = EngineOptions(
        threads=a.threads, max_concurrent=max(streams), stream_interval=a.stream_interval
    )
    eng = build_engine(gguf, opts)
    assert eng.prompt is not None
    prompt = eng.prompt.chat(messages).ids
    proc, url = start_server(gguf, a.threads, max(streams), a.stream_interval)
    rows = []
    try:
        client(url, messages, 1, 8)  # warm the server's first request
        for n in streams:
            ins, over, loop = [], [], []
            for _ in range(a.reps):
                ins.append(trio.run(engine_tps, eng, prompt, n, a.tokens))
                c0 = loop_cpu_ns(proc.pid)
                over.append(client(url, messages, n, a.tokens))
                loop.append((loop_cpu_ns(proc.pid) - c0) / 1e3 / (n * a.tokens))
            e, h = statistics.median(ins), statistics.median(over)
            rows.append((n, e, h, (1 / h - 1 / e) * 1e6, ins, over, statistics.median(loop)))
        if a.profile is not None:
            n = max(streams)
            seconds = a.tokens * n / rows[-1][2] * 0.8  # most of one run
            t = threading.Thread(target=profile, args=(proc.pid, max(seconds, 2.0), a.profile))
            t.start()
            client(url, messages, n, a.tokens)
            t.join()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    print(
        f"SmolLM2-135M Q4_1, {a.threads} threads, {a.tokens} tokens a stream, medians of"
        f" {a.reps}, {a.client} client, --stream-interval {a.stream_interval or 'auto'}"
    )
    print(
        "\n| streams | engine tok/s | HTTP tok/s | HTTP / engine | server µs per token"
        " | event-loop CPU µs per token |"
    )
    print("|---|---|---|---|---|---|")
    for n, e, h, us, _, _, cpu in rows:
        print(f"| {n} | {e:.1f} | {h:.1f} | {h / e:.2f} | {us:.0f} | {cpu:.0f} |")
    for n, _, _, _, ins, over, _ in rows:
        print(
            f"runs n={n}: engine {[round(x, 1) for x in ins]}, http {[round(x, 1) for x in over]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
