"""A fleet on loopback: N ``modelc run`` replicas behind real nginx, as a cluster's
ingress would route them, under ``modelc bench --url`` load.

    flock /tmp/modelc-bench.lock .venv/bin/python -m bench.fleet [--replicas 1,2,4]
        [--concurrency 8] [--requests 48] [--turns 4] [--prompt-len 128] [--max-tokens 32]
        [--json bench/fleet.json]

For each replica count N it starts N replicas of SmolLM2-135M-Instruct Q4_1 (``--threads
1`` each: one replica is one core's worth of a cluster node) and nginx (Debian's
package) in front, twice: with ``hash $http_x_conversation_id consistent;`` in the
upstream (what ingress-nginx's ``upstream-hash-by`` annotation generates) and without
it (nginx's round robin, what a Service or an ingress without affinity does).  The load
is multi-turn: ``--concurrency`` conversations at a time, each ``--turns`` requests
resending its history (``/v1/completions``: the prompt grows by each reply and a new
message; the chat route's first SSE chunk carries only the role, so its client-side
TTFT would not time the prefill), each request carrying its conversation's
``X-Conversation-Id``.
Reported per run: aggregate output tokens/s and requests/s, p50/p99 TTFT (from the
client, through nginx), and per replica, from its own ``/metrics``: requests, prompt
tokens, prompt tokens served from the prefix cache (the hit rate), and from nginx's
access log how many conversations stayed on one replica.

The replicas start fresh for every run (empty prefix caches).  This machine has 2
cores, shared with other work: 4 one-thread replicas oversubscribe it twice over.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx

from modelc.net import ssl_context
from modelc.ship.sizing import metric
from tests.assets import smollm2_gguf
from tests.server_fixtures import Server, free_port

ROOT = Path(__file__).resolve().parent.parent
HEADER = "X-Conversation-Id"

NGINX_CONF = """\
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format fleet '$http_x_conversation_id $upstream_addr $status';
    access_log {tmp}/access.log fleet;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream modelc {{
        {balance}
{servers}
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://modelc;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


def start_nginx(ports: list[int], hashing: bool, tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    balance = "hash $http_x_conversation_id consistent;" if hashing else "# round robin"
    servers = "\n".join(f"        server 127.0.0.1:{p};" for p in ports)
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, balance=balance, servers=servers, port=port))
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    proc = subprocess.Popen(
        [nginx, "-c", str(conf), "-p", str(tmp), "-g", "daemon off;"], stderr=subprocess.PIPE
    )
    for _ in range(100):
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1, verify=ssl_context())
            return proc, port
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.terminate()
    raise SystemExit(f"nginx did not start: {proc.stderr.read().decode() if proc.stderr else ''}")


def replica_stats(srv: Server) -> dict[str, float]:
    text = httpx.get(f"{srv.url}/metrics", timeout=10, verify=ssl_context()).text
    reqs = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('modelc_requests_total{endpoint="/v1/completions"')
    )
    prompt = metric(text, "modelc_prompt_tokens_total")
    cached = metric(text, "modelc_prompt_tokens_cached_total")
    return {
        "requests": reqs,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "prefix_hits": metric(text, "modelc_prefix_cache_hits_total"),
    }


def stickiness(access_log: Path) -> dict[str, int]:
    """Conversations whose requests all reached one replica, from nginx's access log."""
    seen: dict[str, set[str]] = defaultdict(set)
    for line in access_log.read_text().splitlines():
        conv, upstream, _ = line.split(" ", 2)
        if conv != "-":
            seen[conv].add(upstream)
    n = Counter(len(v) for v in seen.values())
    return {"conversations": len(seen), "on_one_replica": n[1]}


def run(n: int, hashing: bool, a: argparse.Namespace) -> dict[str, Any]:
    model = str(smollm2_gguf())
    extra = ["--max-concurrent", str(a.max_concurrent)]
    env = {"MODELC_THREADS": "1"}
    servers = [Server(model, *extra, env=env) for _ in range(n)]
    tmp = Path(tempfile.mkdtemp(prefix="modelc-fleet-"))
    nginx: subprocess.Popen[bytes] | None = None
    try:
        for s in servers:
            s.wait_ready()
        nginx, port = start_nginx([s.port for s in servers], hashing, tmp)
        load0 = os.getloadavg()[0]
        cmd = [sys.executable, "-m", "modelc.cli", "bench", "--json", "--url"]
        cmd += [f"http://127.0.0.1:{port}/v1/completions"]  # TTFT = the first text chunk
        cmd += ["--concurrency", str(a.concurrency), "--requests", str(a.requests)]
        cmd += ["--turns", str(a.turns), "--conversation-header", HEADER]
        cmd += ["--prompt-len", str(a.prompt_len), "--max-tokens", str(a.max_tokens)]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise SystemExit(f"modelc bench failed: {r.stderr[-2000:]}")
        (lvl,) = json.loads(r.stdout)["levels"]
        reps = [replica_stats(s) for s in servers]
        prompt = sum(x["prompt_tokens"] for x in reps)
        nginx.send_signal(signal.SIGQUIT)  # graceful: flushes the access log
        nginx.wait(10)
        return {
            "replicas": n,
            "routing": "hash" if hashing else "round-robin",
            "completed": lvl["completed"],
            "errors": lvl["errors"],
            "wall_s": round(lvl["wall_s"], 1),
            "output_tps": round(lvl["output_tps"], 1),
            "request_rps": round(lvl["request_throughput"], 3),
            "ttft_p50_ms": round(lvl["ttft"]["p50"]),
            "ttft_p99_ms": round(lvl["ttft"]["p99"]),
            "e2e_p50_ms": round(lvl["e2e"]["p50"]),
            "hit_rate": round(sum(x["cached_tokens"] for x in reps) / prompt, 3) if prompt else 0,
            "per_replica": [
                {k: round(v, 3) if k == "hit_rate" else int(v) for k, v in x.items()} for x in reps
            ],
            "stickiness": stickiness(tmp / "access.log"),
            "loadavg_1m": [round(load0, 1), round(os.getloadavg()[0], 1)],
        }
    finally:
        if nginx is not None and nginx.poll() is None:
            nginx.terminate()  # the master stops its workers
            nginx.wait(10)
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", default="1,2,4")
    ap.add_argument("--concurrency", type=int, default=8, help="conversations at a time")
    ap.add_argument("--requests", type=int, default=48, help="requests per run")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=128, help="first message, words")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-concurrent", type=int, default=8, help="slots per replica")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the runs here")
    a = ap.parse_args()
    runs = []
    for n in [int(x) for x in a.replicas.split(",")]:
        for hashing in (True, False) if n > 1 else (True,):
            res = run(n, hashing, a)
            runs.append(res)
            print(json.dumps(res), flush=True)
    print()
    print(
        "| replicas | routing | out tok/s | req/s | TTFT p50 ms | TTFT p99 ms | prefix-cache hit rate (all) | per replica: requests / hit rate | conversations on one replica |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        per = ", ".join(f"{x['requests']} / {x['hit_rate']:.2f}" for x in r["per_replica"])
        st = r["stickiness"]
        print(
            f"| {r['replicas']} | {r['routing']} | {r['output_tps']} | {r['request_rps']} | "
            f"{r['ttft_p50_ms']} | {r['ttft_p99_ms']} | {r['hit_rate']:.2f} | {per} | "
            f"{st['on_one_replica']}/{st['conversations']} |"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
