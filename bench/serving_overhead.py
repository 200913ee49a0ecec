"""The server's own cost a streamed token, over HTTP, with the model's step simulated.

    .venv/bin/python -m bench.serving_overhead [--device-ms 3] [--switch-interval 0.005,0.0005]
        [--streams 64] [--requests 256] [--max-tokens 64] [--prompt-len 32] [--reps 2]
        [-- more modelc run arguments]

Each configuration serves, in a child process, through the real ``modelc run`` path
(registry, engine, scheduler, step thread, Quart on Hypercorn on 127.0.0.1), a tiny
random llama (``bench/engine_overhead.py``'s: a 32,000-token vocabulary, next to no
compute) whose step is a **simulated device**: ``forward_sample`` sleeps ``--device-ms``
(and ``--token-ms`` more a prompt token beyond each sequence's first: a prefill's cost)
with the GIL released, as the step thread's wait for a GPU step does, advances every
cache past its chunk and hands back a greedy token a row (the position's, so the text is
not one repeated id) as a device sampler does: no logits reach the host.  The load is
``modelc bench --url`` in a process of its own (``--streams`` at a time, ``--requests``
text completions of ``--prompt-len`` words, ``--max-tokens`` each, streamed), once to warm
up and ``--reps`` times measured.  Each row: output tok/s (and its share of the ceiling
the simulated device alone allows, ``streams / device-ms``), TPOT p50, the wall time a
step, the share of the wall time the simulated device was busy (the rest: the host's
work between two steps, which a GPU would spend idle), and the server's CPU a token (its
main thread: the event loop, and the rest of its threads).

``--gil-waits K`` splits the simulated step into K waits, each giving the GIL up and
taking it back (a GPU step's CUDA calls do: CuPy releases the GIL around graph launches,
synchronizing, copies and, in recent versions, kernel launches); while the event loop is
busy writing responses, each take-back waits its turn.

``--switch-interval`` sets ``sys.setswitchinterval`` in the server (Python's default is
5 ms): a thread that gave up the GIL to wait (the step thread on the device) waits up to
that long to get it back from a thread that is running Python (the event loop writing
responses).  The step's wall time is the device's plus those waits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from modelc.bench.procs import ServerStartError, wait_healthy
from modelc.net import ssl_context
from modelc.ship.sizing import metric

ROOT = Path(__file__).resolve().parent.parent


def simulate_device(
    lm: Any, device_ms: float, token_ms: float = 0.0, stats: Path | None = None, waits: int = 1
) -> None:
    """Make ``lm``'s step a simulated device's (see the module's docstring)."""
    from bench.engine_overhead import advance_and_peak
    from modelc.runtime.batch_sampler import BatchParams, Drawn
    from modelc.runtime.model import SeqChunk

    n_vocab = lm.n_vocab
    done = [0, 0.0]  # steps, seconds of the simulated device
    lm.logits_on_device = True  # the engine samples in forward_sample, as on a GPU

    def forward_sample(batch: Sequence[SeqChunk], params: BatchParams) -> Drawn:
        peaks = advance_and_peak(batch, n_vocab)
        n_fed = sum(len(c.tokens) for c in batch)
        # the GIL released, as a wait for the device's step
        busy = (device_ms + token_ms * max(n_fed - len(batch), 0)) / 1000
        for _ in range(waits):  # each gives the GIL up and takes it back, as a CUDA call does
            time.sleep(busy / waits)
        done[0] += 1
        done[1] += busy
        if stats is not None and done[0] % 20 == 0:  # steps, device seconds (for the parent)
            stats.write_text(f"{done[0]} {done[1]}")
        tokens = np.asarray(peaks, np.int64)[params.rows]
        b = len(tokens)
        empty = np.zeros((b, 0))
        host = np.zeros((len(params.host_rows), n_vocab), np.float32)
        return Drawn(tokens, np.full(b, np.nan), empty.astype(np.int64), empty, host)

    lm.forward_sample = forward_sample


def serve_child(
    port: int, device_ms: float, token_ms: float, waits: int, switch: float, run_args: list[str]
) -> int:
    """The child: ``modelc run`` of the tiny model with the simulated device."""
    import modelc.engine as engine_pkg
    from modelc.cli import main

    real = engine_pkg.build_engine

    def build(*args: Any, **kwargs: Any) -> Any:
        eng = real(*args, **kwargs)
        stats = Path(os.environ["MODELC_OVERHEAD_STATS"])
        simulate_device(eng.lm, device_ms, token_ms, stats, waits)
        return eng

    engine_pkg.build_engine = build  # type: ignore[assignment]
    sys.setswitchinterval(switch)
    model = os.environ["MODELC_OVERHEAD_MODEL"]
    argv = ["run", model, "--port", str(port), "--threads", "1", "--speculate", "off"]
    return main([*argv, "--max-context", "512", *run_args])


def _cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of ``pid``'s main thread and of its other threads."""
    tick = os.sysconf("SC_CLK_TCK")
    main = rest = 0.0
    for t in Path(f"/proc/{pid}/task").iterdir():
        fields = (t / "stat").read_text().rsplit(")", 1)[1].split()
        s = (int(fields[11]) + int(fields[12])) / tick
        if t.name == str(pid):
            main += s
        else:
            rest += s
    return main, rest


def _device(stats: Path) -> tuple[int, float]:
    """The child's steps and simulated-device seconds so far (to the last 20 steps)."""
    try:
        steps, busy = stats.read_text().split()
    except (OSError, ValueError):
        return 0, 0.0
    return int(steps), float(busy)


def _split(port: int) -> dict[str, float]:
    """The server's batches and its busy time's split so far (``/metrics``: the step
    thread's seconds, the wake-up after each step, delivering and planning)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10, verify=ssl_context()).text
    keys = ("scheduled_batches", "step_seconds", "wake_seconds", "plan_seconds")
    return {k: metric(text, f"modelc_engine_{k}") for k in keys}


def _pinned(cpus: str) -> list[str]:
    """``taskset -c CPUS`` before a command (nothing for ``""``)."""
    return ["taskset", "-c", cpus] if cpus else []


def _load(port: int, a: argparse.Namespace, requests: int) -> dict[str, Any]:
    cmd = [*_pinned(a.client_cpus), sys.executable, "-m", "modelc", "bench"]
    cmd += ["--url", f"http://127.0.0.1:{port}"]
    cmd += ["--concurrency", str(a.streams), "--requests", str(requests)]
    cmd += ["--prompt-len", str(a.prompt_len), "--max-tokens", str(a.max_tokens), "--json"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=True)
    level: dict[str, Any] = json.loads(out.stdout)["levels"][0]
    if level["errors"]:
        raise SystemExit(f"the load had {level['errors']} errors: {out.stdout[-2000:]}")
    return level


def measure(a: argparse.Namespace, switch: float, port: int) -> list[dict[str, Any]]:
    cmd = [*_pinned(a.server_cpus), sys.executable, "-m", "bench.serving_overhead"]
    cmd += ["--serve", str(port)]
    cmd += ["--device-ms", str(a.device_ms), "--token-ms", str(a.token_ms)]
    cmd += ["--gil-waits", str(a.gil_waits)]
    cmd += ["--switch-interval", str(switch), "--"]
    cmd += ["--max-concurrent", str(a.streams), *a.run_args]
    stats = Path(os.environ["MODELC_OVERHEAD_STATS"])
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            try:
                wait_healthy(f"http://127.0.0.1:{port}", proc, 120.0, poll=0.2)
            except ServerStartError as e:
                log.seek(0)
                raise SystemExit(f"{e}\n{log.read().decode()[-3000:]}") from None
            _load(port, a, a.streams)  # warm-up
            rows = []
            for _ in range(a.reps):
                c0, d0, m0 = _cpu(proc.pid), _device(stats), _split(port)
                lv = _load(port, a, a.requests)
                c1, d1, m1 = _cpu(proc.pid), _device(stats), _split(port)
                n = lv["output_tokens"]
                nb = max(m1["scheduled_batches"] - m0["scheduled_batches"], 1)
                ms = {k: 1000 * (m1[k] - m0[k]) / nb for k in m0 if k.endswith("seconds")}
                rows.append(
                    {
                        "tok/s": lv["output_tps"],
                        "TPOT p50 ms": lv["tpot"]["p50"],
                        "main µs/tok": 1e6 * (c1[0] - c0[0]) / n,
                        "other threads µs/tok": 1e6 * (c1[1] - c0[1]) / n,
                        "device busy": (d1[1] - d0[1]) / lv["wall_s"],
                        "ms a step": 1000 * lv["wall_s"] / max(d1[0] - d0[0], 1),
                        "split": "{step_seconds:.2f} / {wake_seconds:.2f} / {plan_seconds:.2f}".format(
                            **ms
                        ),
                    }
                )
        finally:
            proc.terminate()
            proc.wait(30)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device-ms", type=float, default=3.0)
    ap.add_argument("--token-ms", type=float, default=0.0, help="more ms a prompt token")
    ap.add_argument("--gil-waits", type=int, default=1, help="GIL hand-backs a step")
    ap.add_argument("--switch-interval", default="0.005,0.0005")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--port", type=int, default=18093)
    ap.add_argument("--server-cpus", default="", help="taskset -c list for the server")
    ap.add_argument("--client-cpus", default="", help="taskset -c list for the load")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the child's port
    ap.add_argument("run_args", nargs="*", help="more modelc run arguments (after --)")
    a = ap.parse_args()
    if a.serve:
        switch = float(a.switch_interval)
        raise SystemExit(
            serve_child(a.serve, a.device_ms, a.token_ms, a.gil_waits, switch, a.run_args)
        )
    from bench.engine_overhead import model_path

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MODELC_OVERHEAD_MODEL"] = str(model_path(None, Path(tmp)))
        os.environ["MODELC_OVERHEAD_STATS"] = str(Path(tmp) / "device.txt")
        ceiling = a.streams / (a.device_ms / 1000) if a.device_ms else float("inf")
        print(f"simulated device {a.device_ms} ms a step: at most {ceiling:,.0f} tok/s")
        print(
            "| switch interval | rep | tok/s | of the ceiling | TPOT p50 ms | ms a step "
            "| device busy | main µs/tok | other µs/tok | ms a batch: step / wake / plan |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for switch in (float(s) for s in a.switch_interval.split(",")):
            rows = measure(a, switch, a.port)
            for i, r in enumerate(rows):
                print(
                    f"| {switch * 1000:g} ms | {i + 1} | {r['tok/s']:,.0f} | "
                    f"{r['tok/s'] / ceiling:.0%} | {r['TPOT p50 ms']:.1f} | "
                    f"{r['ms a step']:.1f} | {r['device busy']:.0%} | "
                    f"{r['main µs/tok']:.0f} | {r['other threads µs/tok']:.0f} | {r['split']} |"
                )
            med = statistics.median(r["tok/s"] for r in rows)
            print(f"| {switch * 1000:g} ms | median | {med:,.0f} | {med / ceiling:.0%} |||||")


if __name__ == "__main__":
    main()
