"""llama.cpp (the ``xllamacpp`` wheel) as the peer: same GGUF, same thread count.

The reference peer of the differential tests (``tests/conftest.py``) and of the benchmarks
(``bench/side_by_side.py``; ``bench/llamacpp_peer.py`` re-exports it).  llama.cpp's own server
runs in a **separate process** (``python -m modelc.bench.llamacpp GGUF --threads 2 --parallel 8``),
started by
:class:`LlamaCppServer`, so its peak RSS is its own and not mixed with the benchmark's.
That process prints one JSON line ``{"url": ..., "pid": ...}`` once the model is loaded
and serves until its standard input closes.  :class:`LlamaCppClient` measures through
the server's native ``/completion`` endpoint, reading llama.cpp's own ``timings``
(prompt and generation speed as llama.cpp itself counts them); the HTTP load test
uses its OpenAI-compatible ``/v1/completions`` like any other server.

With ``LlamaCppServer.shared = True`` (the test session sets it) servers without an
environment of their own are started by one host process instead
(``python -m modelc.bench.llamacpp --host``: a JSON line a command on its standard input,
one back on its output), each with its log on the process's standard error while it
starts: ~100 peers a test run each paid ~0.9 s of CPU for a fresh interpreter's start-up.  A host
that dies (llama.cpp aborted) is replaced at the next start.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from modelc.net import ssl_context


class LlamaCppClient:
    """Measurements through llama.cpp's ``/completion`` (greedy, ``ignore_eos``, no prompt cache)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def completion(self, prompt: list[int] | str, n_predict: int) -> dict[str, Any]:
        body = {
            "prompt": prompt,
            "n_predict": n_predict,
            "temperature": 0,
            "ignore_eos": True,
            "cache_prompt": False,
        }
        r = httpx.post(f"{self.url}/completion", json=body, timeout=600, verify=ssl_context())
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def prefill_tps(self, prompt_ids: list[int], reps: int = 2) -> float:
        """Prompt tokens/s for one prompt, best of ``reps`` (llama.cpp's ``prompt_ms``)."""
        best = 0.0
        for _ in range(reps):
            t = self.completion(prompt_ids, 1)["timings"]
            best = max(best, float(t["prompt_n"]) / (float(t["prompt_ms"]) / 1000.0))
        return best

    def decode_tps(self, prompts: list[list[int]], n_predict: int, reps: int = 2) -> float:
        """Best of ``reps`` runs of :meth:`decode_once`."""
        return max(self.decode_once(prompts, n_predict) for _ in range(reps))

    def decode_once(self, prompts: list[list[int]], n_predict: int) -> float:
        """Generated tokens/s, all ``len(prompts)`` sequences decoding together.

        One stream: llama.cpp's ``predicted_per_second``.  Several: they share the
        server's batch (one slot each), so the aggregate is the tokens generated over
        the longest generation phase (``predicted_ms``) among them.
        """
        if len(prompts) == 1:
            t = self.completion(prompts[0], n_predict)["timings"]
            return float(t["predicted_n"]) / (float(t["predicted_ms"]) / 1000.0)
        with cf.ThreadPoolExecutor(len(prompts)) as ex:
            outs = list(ex.map(lambda p: self.completion(p, n_predict), prompts))
        n = sum(int(o["timings"]["predicted_n"]) for o in outs)
        return n / (max(float(o["timings"]["predicted_ms"]) for o in outs) / 1000.0)


class LlamaCppPeer:
    """llama.cpp's server in *this* process (the first draft's API, used by ``bench_e2e.py``).

    Prefer :class:`LlamaCppServer` + :class:`LlamaCppClient` when memory matters: here the
    peer's RSS is mixed with the caller's.
    """

    def __init__(
        self, gguf: str | Path, threads: int, n_parallel: int = 8, n_ctx: int = 8192
    ) -> None:
        self._server = _start(str(gguf), threads, n_parallel, n_ctx)
        self.url = str(self._server.listening_address).rstrip("/")
        self._client = LlamaCppClient(self.url)

    def completion(self, prompt: list[int] | str, n_predict: int) -> dict[str, Any]:
        return self._client.completion(prompt, n_predict)

    def prefill_tps(self, prompt_ids: list[int]) -> float:
        return self._client.prefill_tps(prompt_ids, reps=1)

    def decode_tps(self, prompt_ids: list[int], n_predict: int, streams: int) -> float:
        """One run: ``streams`` copies of the prompt decoding together."""
        return self._client.decode_once([prompt_ids] * streams, n_predict)


class LlamaCppServer:
    """llama.cpp's server in a subprocess (``with LlamaCppServer(...) as srv: srv.url``).

    ``LlamaCppServer.started`` counts the processes started in this interpreter (the test
    session reports it, to show each peer is started once).
    """

    started = 0
    shared = False  # start servers through one host process (:class:`PeerHost`)

    def __init__(
        self,
        gguf: Path,
        threads: int,
        n_parallel: int = 8,
        n_ctx: int = 8192,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        embedding: bool = False,
        chat_template: Path | None = None,
        mmproj: Path | None = None,
    ) -> None:
        self.cmd = [
            sys.executable,
            "-m",
            "modelc.bench.llamacpp",
            str(gguf),
            "--threads",
            str(threads),
            "--parallel",
            str(n_parallel),
            "--ctx",
            str(n_ctx),
            *(["--embedding"] if embedding else []),
            *(["--chat-template-file", str(chat_template)] if chat_template else []),
            *(["--mmproj", str(mmproj)] if mmproj else []),
        ]
        self.log = log
        self.own_env = env is not None
        self.env = {**os.environ, **(env or {})}
        self.url = ""
        self.pid = 0
        self.hosted: int | None = None  # this server's id in the host process

    def __enter__(self) -> LlamaCppServer:
        LlamaCppServer.started += 1
        if LlamaCppServer.shared and not self.own_env:
            got = PeerHost.get().ask({"start": self.cmd[3:], "log": str(self.log or os.devnull)})
            if "error" in got:
                raise RuntimeError(f"llama.cpp server failed: {got['error']} (log: {self.log})")
            self.url, self.pid, self.hosted = str(got["url"]), int(got["pid"]), int(got["id"])
            return self
        err = self.log.open("wb") if self.log else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            self.cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=self.env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(30)
            raise RuntimeError(f"llama.cpp server exited {self.proc.returncode} (log: {self.log})")
        info = json.loads(line)
        self.url, self.pid = str(info["url"]), int(info["pid"])
        return self

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e6
        return 0.0

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.hosted is not None:
            PeerHost.get().ask({"stop": self.hosted})
            return
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_HOST_LOCK = threading.Lock()


class PeerHost:
    """The process :class:`LlamaCppServer` starts shared servers in (one an interpreter)."""

    _one: PeerHost | None = None

    @classmethod
    def get(cls) -> PeerHost:
        with _HOST_LOCK:
            if cls._one is None or cls._one.proc.poll() is not None:
                cls._one = PeerHost()
            return cls._one

    def __init__(self) -> None:
        self.lock = threading.Lock()  # one command and its answer at a time
        cmd = [sys.executable, "-m", "modelc.bench.llamacpp", "--host"]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )

    def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self.lock:
            try:
                self.proc.stdin.write(json.dumps(msg) + "\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
            line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait(30)
            raise RuntimeError(f"the llama.cpp host process exited ({code}) at {msg}")
        answer: dict[str, Any] = json.loads(line)
        return answer


def _host() -> None:
    """``--host``: ``{"start": [GGUF, --flags...], "log": PATH}`` starts a server (its log
    on standard error while it starts) and answers ``{"id", "url", "pid"}`` once it is
    ready (``{"error"}`` if it is not); ``{"stop": id}`` stops one and answers ``{}``."""
    servers: dict[int, Any] = {}
    ids = itertools.count(1)  # never one a stopped server had
    out = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # llama.cpp's prints stay off the replies
    for line in sys.stdin:
        msg = json.loads(line)
        if "stop" in msg:
            servers.pop(int(msg["stop"]), None)  # its destructor stops and joins it
            reply: dict[str, Any] = {}
        else:
            fd = os.open(msg["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 2)
            os.close(fd)
            a = _parser().parse_args(msg["start"])
            try:
                server, url = _ready(a)
            except Exception as e:  # a bad file or template: this server, not the host
                reply = {"error": f"{type(e).__name__}: {e}"}
            else:
                key = next(ids)
                servers[key] = server
                reply = {"id": key, "url": url, "pid": os.getpid()}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def _start(
    gguf: str,
    threads: int,
    n_parallel: int,
    n_ctx: int,
    embedding: bool = False,
    chat_template: str | None = None,
    mmproj: str | None = None,
) -> Any:
    import xllamacpp as x

    p = x.CommonParams()
    p.model.path = gguf
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = threads
    p.n_parallel = n_parallel
    p.n_ctx = n_ctx
    p.warmup = True
    p.cache_prompt = False
    p.embedding = embedding  # an embedding model: /v1/embeddings, pooling as the GGUF says
    if chat_template is not None:  # llama-server --jinja --chat-template-file
        p.use_jinja = True
        p.chat_template = Path(chat_template).read_text()
    if mmproj is not None:  # llama-server --mmproj: images in (tools/mtmd)
        p.mmproj.path = mmproj
    return x.Server(p)


def _ready(a: argparse.Namespace) -> tuple[Any, str]:
    """A server started as the command line ``a`` (:func:`_parser`'s) asks and its URL, once
    ``/health`` answers (the model loads in the background)."""
    server = _start(a.gguf, a.threads, a.parallel, a.ctx, a.embedding, a.chat_template_file,
                    a.mmproj)  # fmt: skip
    url = str(server.listening_address).rstrip("/")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2, verify=ssl_context()).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    return server, url


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="llama.cpp's server (xllamacpp) in this process")
    ap.add_argument("gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument(
        "--embedding", action="store_true", help="serve embeddings (llama-server --embedding)"
    )
    ap.add_argument("--chat-template-file", help="a Jinja chat template (llama-server --jinja)")
    ap.add_argument("--mmproj", help="a vision projector GGUF (llama-server --mmproj)")
    return ap


def main() -> None:
    if sys.argv[1:] == ["--host"]:
        _host()
        return
    server, url = _ready(_parser().parse_args())
    sys.stdout.write(json.dumps({"url": url, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    sys.stdin.read()  # serve until the parent closes our stdin
    del server


if __name__ == "__main__":
    main()
