"""The README's question, asked at each server's own defaults: modelc against llama-server.

    .venv/bin/python -m bench.chat_defaults [--asks 16] [--threads 2] [--max-tokens 200]

Starts ``modelc run`` and llama.cpp's server (the ``xllamacpp`` wheel) on the same
SmolLM2-135M-Instruct Q4_1 GGUF, each in its own process with the same thread count,
then asks each ``--asks`` times, through the official ``openai`` client, "What is the
capital of France? Answer briefly." with no sampling field in the request (each server
samples at its own defaults; ``max_tokens`` only bounds the length).  Reports how many
answers stop at the end of the turn (``finish_reason == "stop"``) within ``--max-tokens``
tokens, their median length and latency, and a few answers, as Markdown.

It also runs the README's example as written (the first ask, timed alone): its answer,
finish reason and wall time.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import openai

from bench.llamacpp_peer import LlamaCppServer
from modelc.bench.procs import ServerStartError, wait_healthy
from tests.assets import smollm2_gguf
from tests.server_fixtures import free_port

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What is the capital of France? Answer briefly."


@dataclass
class Tally:
    name: str
    stops: int = 0
    tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)

    def row(self, asks: int) -> str:
        return (
            f"| {self.name} | {self.stops}/{asks} | {statistics.median(self.tokens):.0f} "
            f"| {max(self.tokens)} | {statistics.median(self.seconds):.2f} |"
        )


def ask(url: str, name: str, asks: int, max_tokens: int, question: str) -> Tally:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600)
    model = client.models.list().data[0].id
    t = Tally(name)
    for _ in range(asks):
        t0 = time.perf_counter()
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": question}], max_tokens=max_tokens
        )
        t.seconds.append(time.perf_counter() - t0)
        assert r.usage is not None
        t.tokens.append(r.usage.completion_tokens)
        t.stops += r.choices[0].finish_reason == "stop"
        t.answers.append(r.choices[0].message.content or "")
    return t


def modelc_server(gguf: Path, threads: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = dict(os.environ, MODELC_HOME=tempfile.mkdtemp(prefix="modelc-bench-"))
    cmd = [sys.executable, "-m", "modelc.cli", "run", str(gguf), "--port", str(port)]
    cmd += ["--threads", str(threads)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 300.0, poll=0.1)
    except ServerStartError as e:
        raise RuntimeError(f"modelc run did not start ({e}); see {log}") from e
    return proc, url


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--asks", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--question", default=QUESTION, help="the user message asked")
    a = ap.parse_args()
    gguf = smollm2_gguf()
    logs = Path(tempfile.mkdtemp(prefix="chat-defaults-"))
    proc, url = modelc_server(gguf, a.threads, logs / "modelc.log")
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        model = client.models.list().data[0].id
        t0 = time.perf_counter()
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": a.question}]
        )
        readme = (time.perf_counter() - t0, r.choices[0].finish_reason, r.choices[0].message)
        ours = ask(url, "modelc", a.asks, a.max_tokens, a.question)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    with LlamaCppServer(gguf, threads=a.threads, n_parallel=1, n_ctx=4096) as peer:
        theirs = ask(peer.url, "llama-server", a.asks, a.max_tokens, a.question)
    print(f"README example (no max_tokens): {readme[0]:.2f} s, finish_reason {readme[1]!r}, ")
    print(f"  content {readme[2].content!r}\n")
    print(f"{a.asks} asks of {a.question!r}, no sampling fields, max_tokens {a.max_tokens}:\n")
    print("| server | stopped at end of turn | median tokens | max tokens | median s |")
    print("|---|---|---|---|---|")
    print(ours.row(a.asks))
    print(theirs.row(a.asks))
    for t in (ours, theirs):
        print(f"\n{t.name}, first answers:")
        for text in t.answers[:4]:
            print(f"  {text[:120]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
