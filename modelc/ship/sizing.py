"""Measure what one replica needs: start ``modelc run`` on loopback with the
Deployment's engine flags, warm it with one request, read its RSS and ``/metrics``.

A pod's memory (:meth:`Measured.memory_bytes`) is::

    RSS after the warm-up                  (Python, libraries, scratch, the weights
                                            touched so far; measured)
  + the artifact's pages not yet resident  (weights are memory-mapped: their page
                                            cache counts against the pod's limit)
  + KV budget not yet used                 (modelc_kv_cache_budget_bytes - used)
  + prefix-cache budget not yet used       (EngineOptions.prefix_cache_bytes - used)
  then 10 % headroom, rounded up to MiB.
"""

from __future__ import annotations

import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from modelc.bench.procs import ServerStartError, wait_healthy
from modelc.errors import ModelcError
from modelc.net import ssl_context

HEADROOM = 1.10
MIB = 1 << 20


class MeasureError(ModelcError):
    """The replica started to measure it did not come up or answer."""


@dataclass(frozen=True, slots=True)
class Measured:
    artifact_bytes: int
    rss_bytes: int  # resident set after the warm-up
    artifact_resident_bytes: int  # the part of it that is the mapped artifact
    kv_budget_bytes: int
    kv_used_bytes: int
    prefix_budget_bytes: int
    prefix_used_bytes: int
    decode_tps: float  # one stream's output tokens / s during the warm-up (0: no text model)
    load_seconds: float  # process start to /health 200

    def memory_bytes(self) -> int:
        need = (
            self.rss_bytes
            + max(0, self.artifact_bytes - self.artifact_resident_bytes)
            + max(0, self.kv_budget_bytes - self.kv_used_bytes)
            + max(0, self.prefix_budget_bytes - self.prefix_used_bytes)
        )
        return math.ceil(need * HEADROOM / MIB) * MIB


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metric(text: str, name: str) -> float:
    """The first sample of ``name`` in a Prometheus text exposition (0.0 if absent)."""
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _warm(client: httpx.Client, url: str, name: str) -> float:
    """One request; decode tokens/s for a text model, 0.0 for an embedding model."""
    body = {"model": name, "prompt": "The capital of France is", "max_tokens": 32}
    t0 = time.perf_counter()
    r = client.post(f"{url}/v1/completions", json={**body, "ignore_eos": True, "temperature": 0})
    if r.status_code == 200:
        n = int(r.json()["usage"]["completion_tokens"])
        return n / (time.perf_counter() - t0)
    e = client.post(f"{url}/v1/embeddings", json={"model": name, "input": "hello"})
    if e.status_code != 200:
        raise MeasureError(
            f"the replica answered neither a completion ({r.status_code}) nor an embedding "
            f"({e.status_code}) request: {e.text[:200]}"
        )
    return 0.0


def measure(
    artifact: Path, name: str, run_args: Sequence[str] = (), timeout: float = 300.0
) -> Measured:
    """Start a replica of ``artifact`` as the Deployment would, and measure it."""
    import psutil

    from modelc.engine.options import EngineOptions

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="modelc-measure-") as home:
        env = {**os.environ, "MODELC_HOME": home, "MODELC_THREADS": "1"}
        log = Path(home) / "server.log"
        cmd = [sys.executable, "-m", "modelc.cli", "run", str(artifact), "--alias", name]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--threads", "1", *run_args]
        t0 = time.monotonic()
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            with httpx.Client(timeout=120, verify=ssl_context()) as client:
                try:
                    wait_healthy(url, proc, timeout, client=client)
                except ServerStartError as e:
                    tail = log.read_text(errors="replace").strip().splitlines()[-1:]
                    raise MeasureError(
                        f"the replica to measure did not start ({e}): "
                        f"{tail[0] if tail else 'no output'}"
                    ) from e
                loaded = time.monotonic() - t0
                tps = _warm(client, url, name)
                text = client.get(f"{url}/metrics").text
            ps = psutil.Process(proc.pid)
            rss = int(ps.memory_info().rss)
            real = str(artifact.resolve())
            mapped = sum(int(m.rss) for m in ps.memory_maps(grouped=True) if m.path == real)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return Measured(
        artifact_bytes=artifact.stat().st_size,
        rss_bytes=rss,
        artifact_resident_bytes=mapped,
        kv_budget_bytes=int(metric(text, "modelc_kv_cache_budget_bytes")),
        kv_used_bytes=int(metric(text, "modelc_kv_cache_used_bytes")),
        prefix_budget_bytes=EngineOptions().prefix_cache_bytes,
        prefix_used_bytes=int(metric(text, "modelc_engine_prefix_cache_bytes")),
        decode_tps=tps,
        load_seconds=loaded,
    )
