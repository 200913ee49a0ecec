"""The loopback fleet's routing (bench/fleet.py): two ``modelc run`` replicas behind
Debian's nginx, configured as ingress-nginx's ``upstream-hash-by`` renders it, keep a
conversation on one replica and so in its prefix cache; round robin does not.

Reference: nginx's own access log (which upstream served each request) and each
replica's ``/metrics`` counters.  nginx comes from scripts/test.sh (``nginx-light``).
"""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from bench.fleet import HEADER, start_nginx, stickiness
from modelc.bench.loadgen import run_load
from tests.assets import smollm2_gguf
from tests.server_fixtures import Server

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (scripts/test.sh)")


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[Server]]:
    servers = [Server(str(smollm2_gguf()), "--max-concurrent", "2") for _ in range(2)]
    try:
        for s in servers:
            s.wait_ready()
        yield servers
    finally:
        for s in servers:
            s.stop()


def _cached(servers: list[Server]) -> float:
    return sum(s.metric("modelc_prompt_tokens_cached_total") for s in servers)


def _conversation(servers: list[Server], hashing: bool, seed: int) -> tuple[dict[str, int], float]:
    """One 3-turn conversation through nginx; (stickiness, prompt tokens it got cached)."""
    tmp = Path(tempfile.mkdtemp(prefix="modelc-fleet-test-"))
    before = _cached(servers)
    nginx, port = start_nginx([s.port for s in servers], hashing, tmp)
    try:
        res = trio.run(
            lambda: run_load(
                f"http://127.0.0.1:{port}/v1/completions", concurrency=[1], requests=3,
                prompt_len=48, max_tokens=4, turns=3, header=HEADER, seed=seed,
            )
        )  # fmt: skip
        assert res.levels[0].completed == 3, res.levels[0].error_samples
    finally:
        nginx.send_signal(signal.SIGQUIT)
        nginx.wait(10)
    st = stickiness(tmp / "access.log")
    shutil.rmtree(tmp, ignore_errors=True)
    return st, _cached(servers) - before


def test_hashing_keeps_a_conversation_on_one_replica(replicas: list[Server]) -> None:
    hashed, hashed_cached = _conversation(replicas, True, seed=1)
    spread, spread_cached = _conversation(replicas, False, seed=2)
    assert hashed == {"conversations": 1, "on_one_replica": 1}
    # nginx's round robin alternates: turns 1 and 3 on one replica, turn 2 on the other
    assert spread == {"conversations": 1, "on_one_replica": 0}
    # turn 2 reuses turn 1's prompt and turn 3 turn 2's on one replica; spread, only turn
    # 3 finds turn 1's prompt
    assert hashed_cached > spread_cached >= 0, (hashed_cached, spread_cached)
    assert hashed_cached >= 64
