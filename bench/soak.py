"""A soak run: many clients for a long time, some careless, some hostile (issue 15).

    .venv/bin/python -m bench.soak [--minutes 30] [--warmup 60] [--streams 8]
                                   [--threads 2] [--json out.json] [--url URL]

Starts ``modelc run`` on SmolLM2-135M-Instruct Q4_1 (or uses ``--url``'s server) and
keeps ``--streams`` clients busy for ``--minutes``.  Each request is, at random:

* 5% malformed: broken JSON, a wrong type, an unknown field value, a wrong content type,
  a negative ``max_tokens``, an unknown route: each must get a 4xx;
* 20% a stream the client drops after a random number of chunks (0 to 12);
* the rest valid, mixing streamed and whole chat and text completions with short and
  long prompts, sampled or greedy: each must finish with ``stop`` or ``length``.

It samples the server's RSS every second, less the bytes its prefix cache holds (a cache that
fills up to its budget, 256 MiB by default, on purpose), and at the end, once idle, reads
``/metrics``.  It passes (exit 0) when no valid request failed, every malformed one got a
4xx, no request is left in flight (active requests, running and queued sequences 0), the
KV cache holds no sequence (used bytes back to the level before the run), the RSS of the
last fifth of the run is at most 5% (``--rss-tolerance``) above the first fifth's (medians
of the samples after warm-up, less the prefix cache; a fall is memory handed back, not a
leak), and the p99 time
to first token of the last fifth of the run is within 1.5x of the first fifth's (plus 50 ms,
for a quiet first fifth), each weighed by the server's CPU rate in its fifth, so that a
neighbour taking cores from the server does not count as the server slowing down.
The first tokens are timed by one more client beside the ``--streams``: it sends the same
request shape (a 64-word text completion, 4 tokens, streamed) back to back, so every
sample meets the same kind of load and a fifth of even a 1-minute run holds dozens of them.
A JSON report goes to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

from modelc.net import ssl_context

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.serving_cost import start_server  # noqa: E402
from tests.assets import smollm2_gguf  # noqa: E402

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "while",
    "rain",
    "fell",
    "over",
    "quiet",
    "hills",
    "and",
    "rivers",
    "ran",
    "to",
    "sea",
]


@dataclass
class Tally:
    valid: int = 0
    valid_failed: list[str] = field(default_factory=list)
    dropped: int = 0
    malformed: int = 0
    malformed_bad: list[str] = field(default_factory=list)
    ttft: list[tuple[float, float]] = field(default_factory=list)  # (t since start, ttft)
    rss: list[tuple[float, int]] = field(default_factory=list)  # (t since start, bytes)
    cpu: list[tuple[float, float]] = field(default_factory=list)  # (t, server CPU seconds)


def _prompt(rng: random.Random) -> str:
    n = rng.choice([4, 16, 64, 200])
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _malformed(rng: random.Random, model: str) -> tuple[str, str, bytes, str]:
    """(method, path, body, content type) of a request the server must refuse with 4xx."""
    ok = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    choice = rng.randrange(6)
    if choice == 0:
        return "POST", "/v1/chat/completions", b'{"model": "x", "messages": [', "application/json"
    if choice == 1:
        return (
            "POST",
            "/v1/chat/completions",
            json.dumps({**ok, "messages": 7}).encode(),
            ("application/json"),
        )
    if choice == 2:
        body = json.dumps({**ok, "temperature": "hot"}).encode()
        return "POST", "/v1/chat/completions", body, "application/json"
    if choice == 3:
        return "POST", "/v1/completions", b"prompt=hi", "application/x-www-form-urlencoded"
    if choice == 4:
        body = json.dumps({"model": model, "prompt": "hi", "max_tokens": -3}).encode()
        return "POST", "/v1/completions", body, "application/json"
    return "POST", "/v1/nothing-here", b"{}", "application/json"


async def _valid(client: httpx.AsyncClient, url: str, model: str, rng: random.Random) -> str:
    """'' when the request ended as it should, else what went wrong."""
    chat = rng.random() < 0.6
    stream = rng.random() < 0.6
    body: dict[str, Any] = {"model": model, "max_tokens": rng.choice([8, 32, 64])}
    if chat:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": _prompt(rng)}]
    else:
        path, body["prompt"] = "/v1/completions", _prompt(rng)
    if rng.random() < 0.5:
        body["temperature"] = 0
    if not stream:
        r = await client.post(f"{url}{path}", json=body)
        if r.status_code != 200:
            return f"{path} {r.status_code} {r.text[:200]}"
        reason = r.json()["choices"][0]["finish_reason"]
        return "" if reason in ("stop", "length") else f"{path} finish_reason {reason}"
    body["stream"] = True
    reason = None
    async with client.stream("POST", f"{url}{path}", json=body) as r:
        if r.status_code != 200:
            return f"{path} stream {r.status_code}"
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"]
                if choice and choice[0].get("finish_reason"):
                    reason = choice[0]["finish_reason"]
    return "" if reason in ("stop", "length") else f"{path} stream ended with {reason}"


TTFT_PROMPT_WORDS = 64  # one prompt length for every probe: 4 vs 200 words is 10x the TTFT


async def _ttft(client: httpx.AsyncClient, url: str, model: str, rng: random.Random) -> float:
    prompt = " ".join(rng.choice(WORDS) for _ in range(TTFT_PROMPT_WORDS))
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "stream": True}
    t0 = time.monotonic()
    ttft = None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            data = line[6:] if ttft is None and line.startswith("data: {") else ""
            if data and json.loads(data)["choices"][0].get("text"):
                ttft = time.monotonic() - t0
    if ttft is None:
        raise RuntimeError("no token streamed")
    return ttft


async def _dropped(client: httpx.AsyncClient, url: str, model: str, rng: random.Random) -> None:
    body = {"model": model, "prompt": _prompt(rng), "max_tokens": 256, "stream": True}
    keep = rng.randrange(13)
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        seen = 0
        async for _ in r.aiter_lines():
            seen += 1
            if seen > keep:
                break  # leaving the block closes the connection mid-stream


async def _client(url: str, model: str, seed: int, t_end: float, t0: float, tally: Tally) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=120, verify=ssl_context()) as client:
        while time.monotonic() < t_end:
            x = rng.random()
            if x < 0.05:
                tally.malformed += 1
                method, path, body, ctype = _malformed(rng, model)
                r = await client.request(
                    method, f"{url}{path}", content=body, headers={"content-type": ctype}
                )
                if not 400 <= r.status_code < 500:
                    tally.malformed_bad.append(f"{path} {r.status_code} {r.text[:120]}")
            elif x < 0.25:
                tally.dropped += 1
                await _dropped(client, url, model, rng)
            else:
                tally.valid += 1
                try:
                    err = await _valid(client, url, model, rng)
                except httpx.HTTPError as e:
                    err = f"{type(e).__name__}: {e}"
                if err:
                    tally.valid_failed.append(err)


async def _prober(url: str, model: str, t_end: float, t0: float, tally: Tally) -> None:
    """Times first tokens back to back, one probe at a time, until ``t_end``."""
    rng = random.Random(7)
    async with httpx.AsyncClient(timeout=120, verify=ssl_context()) as client:
        while time.monotonic() < t_end:
            tally.valid += 1
            try:
                tally.ttft.append((time.monotonic() - t0, await _ttft(client, url, model, rng)))
            except (httpx.HTTPError, RuntimeError) as e:
                tally.valid_failed.append(f"ttft {type(e).__name__}: {e}")
            await trio.sleep(0.05)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _cpu_seconds(pid: int) -> float:
    """The process's user and system CPU time (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_rate(samples: list[tuple[float, float]], lo: float, hi: float) -> float | None:
    """The server's CPU seconds a wall second between ``lo`` and ``hi`` (None: < 2 samples)."""
    inside = [(t, c) for t, c in samples if lo <= t < hi]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def _gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name):
            return float(line.rpartition(" ")[2])
    return 0.0


def _metrics(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10, verify=ssl_context()).text.splitlines():
        if line.startswith("modelc_") and " " in line:
            name, _, value = line.rpartition(" ")
            out[name.split("{")[0]] = float(value)
    return out


def _p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else float("nan")


TTFT_P99_MIN_SAMPLES = 100  # fewer in a fifth: its p99 is its slowest request; compare medians


def _ttft_level(xs: list[float], p99: bool) -> float:
    return _p99(xs) if p99 else statistics.median(xs) if xs else float("nan")


def ttft_stable(
    first: list[float],
    last: list[float],
    rate_first: float | None,
    rate_last: float | None,
    use_p99: bool,
) -> bool:
    """Whether the last fifth's first tokens came within 1.5x (+ 50 ms) of the first fifth's.

    The server is busy throughout, so a first token's wall time is the CPU work before it
    over the CPU share the server got.  A neighbour that takes cores (another test, in CI)
    lowers the share and stretches every wall time alike; a server that slows itself (a
    growing list scanned per request, a leak) spends more CPU on the same work.  With the
    server's CPU rate (CPU seconds a wall second) known for both fifths, each level is
    weighed by it: the comparison is of the server's own CPU time, which only the second
    kind of slowing moves.
    """
    if not first or not last:
        return False
    a, b = _ttft_level(first, use_p99), _ttft_level(last, use_p99)
    if rate_first and rate_last:
        return b * rate_last <= 1.5 * a * rate_first + 0.05 * rate_first
    return b <= 1.5 * a + 0.05


def soak(
    url: str,
    pid: int | None,
    minutes: float,
    warmup: float,
    streams: int,
    rss_tolerance: float = 0.05,
) -> dict[str, Any]:
    model = httpx.get(f"{url}/v1/models", timeout=10, verify=ssl_context()).json()["data"][0]["id"]
    kv_before = _metrics(url).get("modelc_kv_cache_used_bytes", 0.0)
    tally = Tally()
    t0 = time.monotonic()
    t_end = t0 + warmup + minutes * 60

    async def main() -> None:
        async def sample_rss() -> None:
            async with httpx.AsyncClient(timeout=30, verify=ssl_context()) as client:
                while time.monotonic() < t_end and pid is not None:
                    text = (await client.get(f"{url}/metrics")).text
                    held = _gauge(text, "modelc_engine_prefix_cache_bytes")
                    now = time.monotonic() - t0
                    tally.rss.append((now, _rss(pid) - int(held)))
                    tally.cpu.append((now, _cpu_seconds(pid)))
                    await trio.sleep(1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample_rss)
            nursery.start_soon(_prober, url, model, t_end, t0, tally)
            for k in range(streams):
                nursery.start_soon(_client, url, model, 1000 + k, t_end, t0, tally)

    trio.run(main)
    time.sleep(3)  # dropped streams' cancellations land
    m = _metrics(url)
    run_s = minutes * 60
    fifth = run_s / 5
    first = [t for s, t in tally.ttft if warmup <= s < warmup + fifth]
    last = [t for s, t in tally.ttft if s >= warmup + run_s - fifth]
    # the level after warm-up and at the end: medians of the first and last fifth's samples
    # (single samples move by several % as requests come and go)
    rss_first = [r for s, r in tally.rss if warmup <= s < warmup + fifth] or [0]
    rss_last = [r for s, r in tally.rss if s >= warmup + run_s - fifth] or [0]
    rss_warm, rss_end = statistics.median(rss_first), statistics.median(rss_last)
    use_p99 = min(len(first), len(last)) >= TTFT_P99_MIN_SAMPLES
    rate_first = _cpu_rate(tally.cpu, warmup, warmup + fifth)
    rate_last = _cpu_rate(tally.cpu, warmup + run_s - fifth, warmup + run_s + 1)
    report: dict[str, Any] = {
        "minutes": minutes,
        "streams": streams,
        "valid_requests": tally.valid,
        "valid_failed": len(tally.valid_failed),
        "valid_failures": tally.valid_failed[:20],
        "dropped_streams": tally.dropped,
        "malformed_requests": tally.malformed,
        "malformed_not_4xx": tally.malformed_bad[:20],
        "requests_active_end": m.get("modelc_requests_active"),
        "running_end": m.get("modelc_engine_running"),
        "queued_end": m.get("modelc_engine_queued"),
        "kv_used_before": kv_before,
        "kv_used_end": m.get("modelc_kv_cache_used_bytes"),
        "rss_first_fifth_mb": round(rss_warm / 2**20, 1),
        "rss_last_fifth_mb": round(rss_end / 2**20, 1),
        "rss_change": round(rss_end / rss_warm - 1, 4) if rss_warm and pid else None,
        "rss_first_fifth_samples_mb": [round(r / 2**20, 1) for r in rss_first],
        "rss_last_fifth_samples_mb": [round(r / 2**20, 1) for r in rss_last],
        "ttft_p99_first_fifth_s": round(_p99(first), 3),
        "ttft_p99_last_fifth_s": round(_p99(last), 3),
        "ttft_samples": [len(first), len(last)],
        "ttft_compared": "p99" if use_p99 else "median (few samples)",
        "ttft_median_first_fifth_s": round(statistics.median(first), 3) if first else None,
        "ttft_median_last_fifth_s": round(statistics.median(last), 3) if last else None,
        "server_cpu_rate_first_fifth": round(rate_first, 3) if rate_first else None,
        "server_cpu_rate_last_fifth": round(rate_last, 3) if rate_last else None,
        "rss_mb_by_minute": [
            round(max(r for s, r in tally.rss if k * 60 <= s < (k + 1) * 60) / 2**20, 1)
            for k in range(int((warmup + run_s) // 60))
            if any(k * 60 <= s < (k + 1) * 60 for s, _ in tally.rss)
        ],
    }
    checks = {
        "no valid request failed": not tally.valid_failed,
        "every malformed request got a 4xx": not tally.malformed_bad,
        "nothing left in flight": m.get("modelc_requests_active") == 0
        and m.get("modelc_engine_running") == 0
        and m.get("modelc_engine_queued") == 0,
        "KV cache back to its level": m.get("modelc_kv_cache_used_bytes") == kv_before,
        # a leak is growth: RSS that falls (the allocator handing pages back, a busy first
        # fifth's transient buffers gone) is not one, so only a rise past the tolerance fails
        f"RSS at most {rss_tolerance:.0%} above the first fifth": pid is None
        or report["rss_change"] <= rss_tolerance,
        # a short soak has a few dozen TTFT samples a fifth: their p99 is one request's
        # luck with the batch it met, so below TTFT_P99_MIN_SAMPLES the medians are compared,
        # each weighed by the server's CPU rate in its fifth (ttft_stable says why)
        "TTFT stable": ttft_stable(first, last, rate_first, rate_last, use_p99),
    }
    report["checks"] = checks
    report["passed"] = all(checks.values())
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds before measuring")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument(
        "--rss-tolerance",
        type=float,
        default=0.05,
        help="how far the last fifth's RSS may rise above the first fifth's (0.05: 5%%)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--url", default=None, help="soak this server instead of starting one")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    proc = None
    if args.url is None:
        os.environ.setdefault("MODELC_HOME", tempfile.mkdtemp(prefix="soak-"))
        # a slot for each client and one for the TTFT prober, which must not queue
        proc, url = start_server(smollm2_gguf(), args.threads, args.streams + 1)
        pid: int | None = proc.pid
    else:
        url, pid = args.url.rstrip("/"), None
    try:
        report = soak(url, pid, args.minutes, args.warmup, args.streams, args.rss_tolerance)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
