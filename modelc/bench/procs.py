"""Waiting for a server process to answer ``/health``: one loop for every caller that
starts ``modelc run`` (or a compiled program) as a child process and must know when it is
ready, or that it died trying."""

from __future__ import annotations

import subprocess
import time

import httpx

from modelc.errors import ModelcError


class ServerStartError(ModelcError):
    """The server process exited, or did not answer ``/health`` in time."""


def wait_healthy(
    url: str,
    proc: subprocess.Popen[bytes],
    timeout: float,
    *,
    poll: float = 0.05,
    client: httpx.Client | None = None,
) -> float:
    """Seconds until ``GET url/health`` answered 200; :class:`ServerStartError` when
    ``proc`` exits first or ``timeout`` seconds pass."""
    t0 = time.monotonic()
    get = client.get if client is not None else httpx.get
    while True:
        if proc.poll() is not None:
            raise ServerStartError(f"the server exited with status {proc.returncode}")
        if time.monotonic() - t0 > timeout:
            raise ServerStartError(f"the server did not answer /health in {timeout:g} s")
        try:
            if get(f"{url}/health", timeout=2).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(poll)
