"""llama.cpp's peers started through one host process (``LlamaCppServer.shared``, which the
test session sets): two at once from one host, each answering as its own template says
(llama.cpp's ``/apply-template``); a start that fails is that start's one-line error and the
host goes on serving (a new one if it died); a server with an environment of its own is a
process of its own."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from modelc.bench.llamacpp import LlamaCppServer, PeerHost
from tests import net
from tests.assets import smollm2_gguf
from tests.test_chat_formats import TEMPLATES

MSG = {"messages": [{"role": "user", "content": "Hi"}]}


def _applied(srv: LlamaCppServer) -> str:
    r = net.post(f"{srv.url}/apply-template", json=MSG, timeout=60)
    r.raise_for_status()
    return str(r.json()["prompt"])


def peer(template: str | None, tmp: Path, **kw: object) -> LlamaCppServer:
    tpl = TEMPLATES / f"{template}.jinja" if template else None
    log = tmp / f"{template}.log"
    return LlamaCppServer(smollm2_gguf(), threads=1, n_parallel=1, n_ctx=512, chat_template=tpl,
                          log=log, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_two_hosted_servers_at_once_each_with_its_template(tmp_path: Path) -> None:
    assert LlamaCppServer.shared
    with peer("Qwen-Qwen3-0.6B", tmp_path) as a, peer("google-gemma-4-31B-it", tmp_path) as b:
        assert a.pid == b.pid != os.getpid()  # one host process
        assert a.url != b.url
        assert "<|im_start|>user\nHi<|im_end|>" in _applied(a)
        assert "<|turn>user\nHi<turn|>\n<|turn>model\n" in _applied(b)
        assert (tmp_path / "Qwen-Qwen3-0.6B.log").stat().st_size > 0  # its log where asked


def test_a_failed_start_is_one_error_and_the_host_serves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a host of this test's own: the one the worker's other peers live in is not killed
    monkeypatch.setattr(PeerHost, "_one", PeerHost())
    bad = tmp_path / "missing.gguf"
    fails = LlamaCppServer(bad, threads=1, n_parallel=1, n_ctx=512, log=tmp_path / "bad.log")
    with pytest.raises(RuntimeError, match=r"^llama\.cpp server failed: .*\(log: .*bad\.log\)$"):
        fails.__enter__()
    with peer("Qwen-Qwen3-0.6B", tmp_path) as a:
        assert "<|im_start|>user\nHi<|im_end|>" in _applied(a)
    # a host killed (as llama.cpp aborting would): its stop says so, the next start has a new one
    dead = peer("Qwen-Qwen3-0.6B", tmp_path).__enter__()
    os.kill(dead.pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"^the llama\.cpp host process exited \(-9\)"):
        dead.__exit__(None, None, None)
    with peer("Qwen-Qwen3-0.6B", tmp_path) as b:
        assert b.pid != dead.pid and "<|im_start|>user\nHi<|im_end|>" in _applied(b)
    last = PeerHost.get().proc
    assert last.stdin is not None
    last.stdin.close()  # its end of input: it exits
    assert last.wait(30) == 0


def test_an_own_environment_is_a_process_of_its_own(tmp_path: Path) -> None:
    with peer(None, tmp_path, env={"MODELC_PEER_MARK": "1"}) as a:
        assert a.hosted is None and a.pid != os.getpid()
        assert b"MODELC_PEER_MARK=1" in Path(f"/proc/{a.pid}/environ").read_bytes()
