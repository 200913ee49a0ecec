"""Life cycle: loading, graceful SIGTERM with streams running, client disconnects,
API key, rate limit and backpressure, on real ``modelc run`` subprocesses."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import net
from tests.assets import smollm2_gguf
from tests.server_fixtures import Server, free_port, start

LORA_DIR = Path(__file__).parent / "fixtures" / "lora"


def _stream_body(max_tokens: int) -> dict[str, object]:
    return {
        "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }


@pytest.mark.slow
def test_sigterm_lets_four_streams_finish() -> None:
    srv = Server(str(smollm2_gguf()), "--max-concurrent", "4", "--grace", "120")
    try:
        srv.wait_ready()
        first = threading.Barrier(5, timeout=120)
        results: list[dict[str, object]] = [{} for _ in range(4)]

        def run(i: int) -> None:
            res = results[i]
            text, finish, done, got_first = "", None, False, False
            try:
                with net.stream(
                    "POST", f"{srv.url}/v1/chat/completions", json=_stream_body(48), timeout=120
                ) as r:
                    res["status"] = r.status_code
                    for line in r.iter_lines():
                        if not line.startswith("data: "):
                            continue
                        data = line[6:]
                        if data == "[DONE]":
                            done = True
                            continue
                        ch = json.loads(data)["choices"][0]
                        text += ch["delta"].get("content") or ""
                        finish = ch["finish_reason"] or finish
                        if text and not got_first:
                            got_first = True
                            first.wait()
            except Exception as e:  # reported below
                res["error"] = repr(e)
            res.update(text=text, finish=finish, done=done)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        idle = net.client()  # a keep-alive connection left open must not hold the exit
        assert idle.get(f"{srv.url}/health").status_code == 200
        first.wait()  # all four are streaming
        srv.proc.send_signal(signal.SIGTERM)
        refused_while_streaming = False
        while any(t.is_alive() for t in threads):
            try:
                net.get(f"{srv.url}/health", timeout=1)
            except httpx.ConnectError:
                refused_while_streaming = any(t.is_alive() for t in threads)
                break
            time.sleep(0.05)
        for t in threads:
            t.join(150)
        streams_done = time.monotonic()
        code = srv.proc.wait(60)
        assert time.monotonic() - streams_done < 10  # not the 120 s grace
        idle.close()
        assert refused_while_streaming  # stopped accepting, kept streaming
        for res in results:
            assert "error" not in res, res
            assert res["status"] == 200 and res["done"] is True, res
            assert res["finish"] == "length" and res["text"], res
        assert code == 0, srv.log()[-3000:]
        assert "SIGTERM" in srv.log()
        # the JSON access log has one line per stream, written when the stream ended
        records = [json.loads(x) for x in srv.log().splitlines() if x.startswith("{")]
        streams = [r for r in records if r.get("endpoint") == "/v1/chat/completions"]
        assert len(streams) == 4
        for r in streams:
            assert r["status"] == 200 and r["completion_tokens"] == 48 and r["prompt_tokens"] > 10
            assert r["ttft_s"] > 0 and r["total_s"] >= r["ttft_s"] and len(r["request_id"]) == 32
    finally:
        srv.stop()


def _open_stream(url: str, max_tokens: int) -> socket.socket:
    """A raw HTTP/1.1 streaming request; returns the socket after the first data event."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(_stream_body(max_tokens)).encode()
    s = socket.create_connection((host, int(port)), timeout=60)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    buf = b""
    while buf.count(b"data: ") < 3:  # role chunk + two content chunks
        chunk = s.recv(65536)
        assert chunk, buf
        buf += chunk
    assert b" 200 " in buf.split(b"\r\n", 1)[0]
    return s


def test_client_disconnect_frees_slot(smol_server: Server) -> None:
    before = smol_server.metric("modelc_tokens_generated_total")
    s = _open_stream(smol_server.url, 400)
    assert smol_server.metric("modelc_requests_active") >= 1
    s.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (
            smol_server.metric("modelc_requests_active") == 0
            and smol_server.metric("modelc_engine_running") == 0
            and smol_server.metric("modelc_engine_queued") == 0
        ):
            break
        time.sleep(0.1)
    assert smol_server.metric("modelc_requests_active") == 0
    assert smol_server.metric("modelc_engine_running") == 0
    generated = smol_server.metric("modelc_tokens_generated_total") - before
    assert generated < 400  # cancelled, not run to max_tokens
    # the server still answers
    r = net.post(
        f"{smol_server.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60
    )
    assert r.status_code == 200


@pytest.fixture(scope="module")
def guarded() -> Iterator[Server]:
    srv = start(
        str(smollm2_gguf()),
        "--api-key",
        "s3cret",
        "--rate-limit",
        "12",
        "--max-concurrent",
        "1",
        "--queue-size",
        "0",
        "--lora-dir",
        str(LORA_DIR),
    )
    yield srv
    srv.stop()


AUTH = {"Authorization": "Bearer s3cret"}


def test_lora_only_from_allowed_dirs(guarded: Server) -> None:
    url = guarded.url
    r = net.post(f"{url}/lora/load", json={"path": "/etc"}, headers=AUTH)
    assert r.status_code == 403 and "outside the allowed" in r.json()["error"]["message"]
    r = net.post(
        f"{url}/lora/load",
        json={"path": str(LORA_DIR / "llama" / ".." / ".." / "..")},
        headers=AUTH,
    )
    assert r.status_code == 403  # no escaping with ..
    r = net.post(f"{url}/lora/load", json={"path": str(LORA_DIR / "missing")}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "path"
    # an adapter made for another model: a clear 400 naming the mismatch, not a crash
    r = net.post(f"{url}/lora/load", json={"path": str(LORA_DIR / "llama")}, headers=AUTH)
    assert r.status_code == 400, r.text
    assert "made for a different base model" in r.json()["error"]["message"]
    r = net.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers=AUTH)
    assert r.status_code == 200


def test_health_is_503_while_loading(guarded: Server) -> None:
    seen = guarded.health
    assert seen[-1] == (200, "ok")
    assert (503, "loading") in seen


def test_api_key(guarded: Server) -> None:
    url = guarded.url
    r = net.get(f"{url}/v1/models")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = net.get(f"{url}/v1/models", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert net.get(f"{url}/v1/models", headers=AUTH).status_code == 200
    assert net.get(f"{url}/health").status_code == 200  # probes are exempt
    assert net.get(f"{url}/metrics").status_code == 200


def test_backpressure_503(guarded: Server) -> None:
    s = _open_stream_auth(guarded.url)
    try:
        r = net.post(
            f"{guarded.url}/v1/completions",
            json={"prompt": "Hi", "max_tokens": 1},
            headers=AUTH,
            timeout=60,
        )
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "1"
        assert r.json()["error"]["type"] == "server_overloaded"
    finally:
        s.close()


def _open_stream_auth(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(_stream_body(300)).encode()
    s = socket.create_connection((host, int(port)), timeout=60)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
        b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    buf = b""
    while b"data: " not in buf:
        chunk = s.recv(65536)
        assert chunk, buf
        buf += chunk
    return s


def test_rate_limit_429(guarded: Server) -> None:
    codes = [net.get(f"{guarded.url}/v1/models", headers=AUTH).status_code for _ in range(14)]
    assert 429 in codes and codes[0] == 200
    r = net.get(f"{guarded.url}/v1/models", headers=AUTH)
    assert r.status_code == 429
    assert int(r.headers["Retry-After"]) >= 1
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert net.get(f"{guarded.url}/health").status_code == 200  # probes are exempt


def test_ping_comments_while_prompt_is_processed(smol_server: Server) -> None:
    long_prompt = "Summarize this. " + "The quick brown fox jumps over the lazy dog. " * 40
    body = {"messages": [{"role": "user", "content": long_prompt}], "max_tokens": 2, "stream": True}
    with net.stream("POST", f"{smol_server.url}/v1/chat/completions", json=body, timeout=120) as r:
        lines = [x for x in r.iter_lines() if x]
    first_content = next(
        i for i, x in enumerate(lines) if '"content":"' in x and '"content":""' not in x
    )
    assert ": ping" in lines[:first_content]  # sent while the prompt was being processed
    assert lines[-1] == "data: [DONE]"


def test_run_without_model_serves_default() -> None:
    smollm2_gguf()  # sets MODELC_CACHE to the test cache, where the pinned wheel already is
    srv = start(None)  # fresh MODELC_HOME: an empty store
    try:
        models = net.get(f"{srv.url}/v1/models").json()["data"]
        assert models[0]["id"] == "smollm2-135m"
        assert "/models/smollm2-135m/" in models[0]["root"]  # pulled into the store
        r = net.post(
            f"{srv.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=60
        )
        assert r.status_code == 200
    finally:
        assert srv.stop() == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/no/such.gguf"], "no such file or directory"),
        (["tests/fixtures/formats/malicious.bin"], "refusing to load"),
        (["tests/fixtures/formats/mlp.safetensors", "--max-concurrent", "0"], "--max-concurrent"),
        (["tests/fixtures/formats/mlp.safetensors", "--port", "70000"], "--port"),
        (["tests/fixtures/formats/mlp.safetensors", "--kv-cache", "f8"], "--kv-cache"),
    ],
)
def test_run_usage_errors(args: list[str], message: str, tmp_path: Path) -> None:
    env = {**os.environ, "MODELC_HOME": str(tmp_path)}
    if "--port" not in args:  # the port is checked first: 8080 may be taken on this machine
        args = [*args, "--port", str(free_port())]
    p = subprocess.run(
        [sys.executable, "-m", "modelc.cli", "run", *args],
        cwd=Path(__file__).parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and message in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("host", ["no-such-host.invalid", "999.1.1.1", "192.0.2.1"])
def test_run_bad_host_is_one_line(host: str, tmp_path: Path) -> None:
    """An address that does not resolve, or is not this machine's: one line, exit 2."""
    env = {**os.environ, "MODELC_HOME": str(tmp_path)}
    p = subprocess.run(
        [sys.executable, "-m", "modelc.cli", "run", str(smollm2_gguf()), "--host", host],
        cwd=Path(__file__).parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--host" in lines[0] and host in lines[0], p.stderr


def test_run_busy_port_is_one_line_before_loading(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {**os.environ, "MODELC_HOME": str(tmp_path)}
        t0 = time.monotonic()
        p = subprocess.run(
            [sys.executable, "-m", "modelc.cli", "run", str(smollm2_gguf()), "--port", str(port)],
            cwd=Path(__file__).parent.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - t0
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines == [
        f"modelc: error: cannot listen on 127.0.0.1:{port}: Address already in use; "
        "choose another --port"
    ], p.stderr
    # refused before the model was packed or loaded: nothing was written to the store
    assert not (tmp_path / "models").exists() and took < 30
