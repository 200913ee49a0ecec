"""Real ``modelc run`` servers for the server tests (subprocesses on a free port).

The shared ones are fixtures in ``tests/conftest.py`` (a test names ``smol_server``, never
imports it); a module that needs a server of its own calls :func:`start`.  ``STARTED``
counts the processes a session starts, by arguments (reported at the end of a run).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from tests import net

ROOT = Path(__file__).resolve().parent.parent
FORMATS = ROOT / "tests" / "fixtures" / "formats"
TEMPLATES = ROOT / "tests" / "fixtures" / "templates"  # real releases' chat templates
STARTED: Counter[str] = Counter()  # `modelc run` processes started, by arguments


def create_from(srv: Server, name: str, template: str, base: str = "smol") -> None:
    """Ollama's ``/api/create`` on ``srv``: the model ``name``, ``base`` under ``template``."""
    body = {"model": name, "from": base, "template": template, "stream": False}
    r = net.post(f"{srv.url}/api/create", json=body, timeout=300)
    assert r.status_code == 200 and r.json()["status"] == "success", r.text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One ``modelc run`` subprocess; ``url`` is its base address."""

    def __init__(
        self,
        model: str | None,
        *extra: str,
        home: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._home = tempfile.TemporaryDirectory(prefix="modelc-srv-") if home is None else None
        penv = {**os.environ, **(env or {})}
        penv["MODELC_HOME"] = str(home or self._home.name)  # type: ignore[union-attr]
        penv.setdefault("MODELC_THREADS", "1")
        self.log_path = Path(penv["MODELC_HOME"]) / "server.log"
        self._log = self.log_path.open("wb")
        cmd = [
            sys.executable,
            "-m",
            "modelc.cli",
            "run",
            *([model] if model else []),
            "--port",
            str(self.port),
            "--threads",
            "1",
            *extra,
        ]
        self.health: list[tuple[int, str]] = []  # /health answers seen while starting
        argv = [model or "", *extra, *(f"{k}={v}" for k, v in (env or {}).items())]
        label = " ".join(Path(a).name if "/" in a else a for a in argv).strip()
        STARTED[label or "(no model)"] += 1
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=penv, stdout=self._log, stderr=subprocess.STDOUT
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                r = net.get(f"{self.url}/health", timeout=2)
                self.health.append((r.status_code, r.json()["status"]))
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log()[-4000:]}")

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if self._home is not None:
            self._home.cleanup()
        return self.proc.returncode

    def metric(self, name: str) -> float:
        text = net.get(f"{self.url}/metrics", timeout=10).text
        m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        if m is None:
            raise KeyError(f"no metric {name}")
        return float(m.group(1))


def start(
    model: str | None, *extra: str, env: dict[str, str] | None = None, home: Path | None = None
) -> Server:
    srv = Server(model, *extra, env=env, home=home)
    try:
        srv.wait_ready()
    except BaseException:
        srv.stop()
        raise
    return srv
