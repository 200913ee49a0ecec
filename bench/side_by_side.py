"""modelc against llama.cpp in one run: same GGUF, same thread count, same machine.

    .venv/bin/python -m bench.side_by_side [--gguf PATH] [--threads 2] [--modes fast,exact]
        [--rounds 2] [--pair-rounds 5] [--no-write]

For SmolLM2-135M-Instruct Q4_1 (``tests.assets.smollm2_gguf()``, or ``--gguf``) it measures

* offline: prefill tokens/s of one 512-token prompt, decode tokens/s at batch 1 and
  batch 8 -- modelc through ``modelc bench --json`` (the runtime's batch API, a fresh
  process per matmul mode), llama.cpp through its server's ``/completion`` timings;
* HTTP: aggregate output tokens/s and TTFT p50 of 8 concurrent streaming clients
  (``modelc.bench.loadgen``, the same client for both) against ``modelc run
  --max-concurrent 8`` and llama.cpp's server with 8 parallel slots, each server in its
  own process, whose peak RSS (``VmHWM``) is read after the load;
* paired rounds (``bench.paired``, ``--pair-rounds``): both engines loaded together and
  measured back to back each round (read bandwidth, prefill, batch 1 and 8), the median
  of the rounds' ratios and the batch-1 share of the read bandwidth;

then prints a Markdown table of modelc / llama.cpp ratios per matmul mode and writes
it, with the command, date and machine load, into the "Side by side" section of the
model's name in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bench.llamacpp_peer import LlamaCppClient, LlamaCppServer
from bench.paired import PairedModel, PairedResult, run_rounds
from modelc.bench.loadgen import LevelResult, run_load
from modelc.bench.offline import peak_rss_mb, prompt_tokens
from modelc.bench.procs import ServerStartError, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


@dataclass
class Side:
    name: str
    prefill: float = 0.0  # tok/s, 512-token prompt
    decode_b1: float = 0.0  # tok/s
    decode_b8: float = 0.0  # aggregate tok/s
    http_tps: float = 0.0  # aggregate output tok/s, 8 streams
    ttft_p50_ms: float = 0.0
    rss_mb: float = 0.0  # server peak RSS
    extra: dict[str, Any] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_level(url: str, args: argparse.Namespace, model: str | None) -> LevelResult:
    async def go() -> LevelResult:
        # warm-up: one short request, not measured
        await run_load(url, concurrency=[1], requests=1, prompt_len=8, max_tokens=4, model=model)
        r = await run_load(
            url,
            concurrency=[args.streams],
            requests=args.requests,
            prompt_len=args.prompt_len,
            max_tokens=args.max_tokens,
            model=model,
            seed=1,
        )
        return r.levels[0]

    lvl = trio.run(go)
    if lvl.errors:
        raise RuntimeError(f"{url}: {lvl.errors} requests failed: {lvl.error_samples}")
    return lvl


def run_modelc_offline(gguf: Path, mode: str, args: argparse.Namespace) -> Side:
    """Prefill and decode tokens/s through ``modelc bench --json`` (a fresh process)."""
    side = Side(f"modelc ({mode})")
    env = dict(os.environ, MODELC_THREADS=str(args.threads), MODELC_MATMUL=mode)
    cmd = [PY, "-m", "modelc.cli", "bench", str(gguf), "--json", "--threads", str(args.threads)]
    cmd += ["--matmul", mode, "--prompt-lens", str(args.prefill_len), "--batches", "1,8"]
    cmd += ["--steps", str(args.decode_steps), "--reps", "2"]
    print(f"[side-by-side] {mode}: {shlex.join(cmd[1:])}", file=sys.stderr)
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"modelc bench failed:\n{out.stderr[-2000:]}")
    off = json.loads(out.stdout)
    side.prefill = off["prefill_tps"][str(args.prefill_len)]
    side.decode_b1 = off["decode_tps"]["1"]
    side.decode_b8 = off["decode_tps"]["8"]
    side.extra["offline_rss_mb"] = off["peak_rss_mb"]
    return side


def run_modelc(gguf: Path, mode: str, args: argparse.Namespace, log_dir: Path) -> Side:
    side = run_modelc_offline(gguf, mode, args)
    env = dict(os.environ, MODELC_THREADS=str(args.threads), MODELC_MATMUL=mode)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (log_dir / f"modelc-{mode}.log").open("wb")
    srv = subprocess.Popen(
        [
            *(PY, "-m", "modelc.cli", "run", str(gguf), "--port", str(port)),
            *("--threads", str(args.threads), "--max-concurrent", str(args.streams)),
            *("--max-context", str(args.ctx_per_seq)),
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        try:
            wait_healthy(url, srv, 300.0, poll=0.1)
        except ServerStartError as e:
            raise RuntimeError(f"modelc run did not start ({e}); see {log.name}") from e
        print(f"[side-by-side] {mode}: {args.streams} HTTP streams", file=sys.stderr)
        lvl = load_level(url, args, None)
        side.http_tps, side.ttft_p50_ms = lvl.output_tps, lvl.ttft.p50
        side.extra["http"] = lvl
        side.rss_mb = peak_rss_mb(srv.pid)
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(60)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
        log.close()
    return side


# llama.cpp's configurations: the wheel is built with OpenMP, whose threads spin at
# barriers; on a machine shared with other jobs the passive policy can be much faster.
LLAMA_CONFIGS: dict[str, dict[str, str]] = {
    "default": {},
    "OMP_WAIT_POLICY=passive": {"OMP_WAIT_POLICY": "passive"},
}


def llamacpp_offline(
    c: LlamaCppClient, side: Side, args: argparse.Namespace, enc: Any, config: str
) -> None:
    """Prefill and decode tokens/s into ``side`` through llama.cpp's own timings."""
    print(f"[side-by-side] llama.cpp ({config}): offline", file=sys.stderr)
    c.completion([1, 2, 3], 4)  # warm-up
    side.prefill = c.prefill_tps(prompt_tokens(args.prefill_len, 49152, enc, args.prefill_len))
    short = [prompt_tokens(16, 49152, enc, 100 + i) for i in range(8)]
    side.decode_b1 = c.decode_tps(short[:1], args.decode_steps)
    side.decode_b8 = c.decode_tps(short, args.decode_steps)


def run_llamacpp(
    gguf: Path, args: argparse.Namespace, log_dir: Path, enc: Any, config: str
) -> Side:
    side = Side(f"llama.cpp ({config})")
    n_ctx = args.ctx_per_seq * args.streams
    with LlamaCppServer(
        gguf,
        args.threads,
        args.streams,
        n_ctx,
        log=log_dir / "llamacpp.log",
        env=LLAMA_CONFIGS[config],
    ) as s:
        llamacpp_offline(LlamaCppClient(s.url), side, args, enc, config)
        print(f"[side-by-side] llama.cpp ({config}): {args.streams} HTTP streams", file=sys.stderr)
        lvl = load_level(s.url, args, None)
        side.http_tps, side.ttft_p50_ms = lvl.output_tps, lvl.ttft.p50
        side.extra["http"] = lvl
        side.rss_mb = s.peak_rss_mb()
    return side


def best(rounds: list[Side]) -> Side:
    """Per measurement, the best of the rounds (a busy machine only ever slows a run down);
    RSS is the highest seen."""
    out = Side(rounds[0].name if len({r.name for r in rounds}) == 1 else "llama.cpp")
    for a in ("prefill", "decode_b1", "decode_b8", "http_tps"):
        setattr(out, a, max(getattr(s, a) for s in rounds))
    out.ttft_p50_ms = min(s.ttft_p50_ms for s in rounds)
    out.rss_mb = max(s.rss_mb for s in rounds)
    return out


ROWS = (
    # label, attribute, higher is better, target ratio (issue 14's, where it sets one;
    # its batch-1 decode target is judged on the paired rounds, see bench.paired)
    ("decode tok/s, batch 1", "decode_b1", True, None),
    (None, "prefill", True, 1.3),
    ("decode tok/s, batch 8 (offline)", "decode_b8", True, None),
    (None, "http_tps", True, 1.5),
    (None, "ttft_p50_ms", False, None),
    ("server peak RSS, MB", "rss_mb", False, 1.1),
)


def table(sides: list[Side], peer: Side, args: argparse.Namespace) -> str:
    labels = {
        "prefill": f"prefill tok/s, {args.prefill_len}-token prompt",
        "http_tps": f"HTTP output tok/s, {args.streams} streams (aggregate)",
        "ttft_p50_ms": f"TTFT p50 ms under {args.streams} streams",
    }
    head = ["measurement", "llama.cpp"]
    for s in sides:
        head += [s.name, "ratio"]
    head.append("target (ratio)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, attr, higher, target in ROWS:
        row = [label or labels[attr], f"{getattr(peer, attr):,.1f}"]
        for s in sides:
            r = getattr(s, attr) / getattr(peer, attr) if getattr(peer, attr) else float("nan")
            ok = (
                ""
                if target is None
                else (" ✓" if (r >= target if higher else r <= target) else " ✗")
            )
            row += [f"{getattr(s, attr):,.1f}", f"{r:.2f}x{ok}"]
        row.append("-" if target is None else (f">= {target}x" if higher else f"<= {target}x"))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


PAIRED_ROWS = (
    # kind, label, target ratio (issue 14)
    ("decode_b1", "decode tok/s, batch 1", 0.95),
    ("prefill", "prefill tok/s", 1.3),
    ("decode_b8", "decode tok/s, batch 8 (aggregate)", None),
)


def paired_table(res: PairedResult, prefill_len: int) -> str:
    """The paired rounds' medians: tok/s a side, the median of the rounds' ratios (their
    range), and the batch-1 decode's share of the read bandwidth."""
    lines = [
        "| measurement (median of the rounds) | llama.cpp | modelc | ratio (range) | target |",
        "|---|---|---|---|---|",
    ]
    for kind, label, target in PAIRED_ROWS:
        if kind == "prefill":
            label += f", {prefill_len}-token prompt"
        r, rs = res.ratio(kind), res.ratios(kind)
        ok = "" if target is None else (" ✓" if r >= target else " ✗")
        lines.append(
            f"| {label} | {res.peer_tps(kind):,.1f} | {res.modelc_tps(kind):,.1f} "
            f"| {r:.2f}x{ok} ({min(rs):.2f}-{max(rs):.2f}) "
            f"| {'-' if target is None else f'>= {target}x'} |"
        )
    m, p = res.share(), res.share(peer=True)
    lines.append(
        f"| decode batch 1, % of the read bandwidth | {100 * p:.1f} % | {100 * m:.1f} % "
        f"| {' ✓' if m >= 0.85 else ' ✗'} ({100 * min(res.shares()):.0f}-{100 * max(res.shares()):.0f} %) "
        "| modelc >= 85 % |"
    )
    return "\n".join(lines)


def paired(
    gguf: Path, label: str, enc: Any, args: argparse.Namespace, log_dir: Path
) -> PairedResult:
    """``args.pair_rounds`` paired rounds of the first ``--modes`` mode (``bench.paired``)."""
    pm = PairedModel(
        label,
        gguf,
        enc,
        threads=args.threads,
        mode=args.modes.split(",")[0].strip(),
        configs={c: LLAMA_CONFIGS[c] for c in args.llama_configs.split(",") if c},
        log_dir=log_dir,
        prefill_len=args.prefill_len,
        steps=args.decode_steps,
        ctx_per_seq=args.ctx_per_seq,
    )
    run_rounds([pm], args.pair_rounds, lambda m: print(f"[paired] {m}", file=sys.stderr))
    return pm.result


def write_results(md: str, heading: str = "## Side by side:") -> None:
    """Replace the section of bench/RESULTS.md whose heading starts with ``heading``
    (or append it), keeping its hand-written "### Notes"."""
    path = ROOT / "bench" / "RESULTS.md"
    text = path.read_text() if path.exists() else ""
    start = text.find(heading)
    if start < 0:
        text = text.rstrip() + "\n\n" + md.rstrip() + "\n"
    else:
        nxt = text.find("\n## ", start + 3)
        end = len(text) if nxt < 0 else nxt + 1
        notes = text.find("\n### Notes", start, end)  # hand-written notes survive a re-run
        keep = text[notes:end].rstrip() + "\n" if notes >= 0 else ""
        text = text[:start] + md.rstrip() + "\n" + keep + ("\n" + text[end:] if nxt >= 0 else "")
    path.write_text(text)


class LoadWatch:
    """The 1-minute load average before a run and every 5 s during it (a daemon thread)."""

    def __init__(self) -> None:
        self.before = os.getloadavg()[0]
        self._loads: list[float] = []
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self._stop.wait(5.0):
            self._loads.append(os.getloadavg()[0])

    def stop(self) -> list[float]:
        """The samples taken (the load now, if the run was shorter than one period)."""
        self._stop.set()
        return self._loads or [os.getloadavg()[0]]


def git_commit() -> str:
    """This checkout's short commit, with "plus uncommitted changes" when tracked files differ."""

    def git(*a: str) -> str:
        return subprocess.run(
            ["git", *a], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + (" plus uncommitted changes" if dirty else "")


def main() -> int:
    from tests.assets import smollm2_gguf

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--gguf", default=None, help="default: SmolLM2-135M-Instruct Q4_1 (tests.assets)"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default="fast,exact", help="MODELC_MATMUL modes to run modelc in")
    ap.add_argument("--prefill-len", type=int, default=512)
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--requests", type=int, default=16, help="HTTP requests (two per stream)")
    ap.add_argument("--prompt-len", type=int, default=128, help="HTTP prompt words (~tokens)")
    ap.add_argument("--max-tokens", type=int, default=64, help="HTTP output tokens per request")
    ap.add_argument("--ctx-per-seq", type=int, default=1024, help="context per sequence/slot")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds, best kept")
    ap.add_argument(
        "--pair-rounds",
        type=int,
        default=5,
        help="paired rounds (bench.paired) after the alternating ones (0: none)",
    )
    ap.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    ap.add_argument(
        "--models",
        default=None,
        help="compare several GGUFs offline in one run (smollm2, gemma3, or paths; "
        "see bench/side_by_side_models.py)",
    )
    ap.add_argument(
        "--llama-configs",
        default=",".join(LLAMA_CONFIGS),
        help="llama.cpp configurations to run (best kept)",
    )
    args = ap.parse_args()
    if args.models:
        from bench.side_by_side_models import compare

        return compare(args)

    from modelc.formats import load_model
    from modelc.runtime.tokenizer import Tokenizer

    gguf = Path(args.gguf) if args.gguf else smollm2_gguf()
    spec = load_model(gguf).tokenizer
    assert spec is not None
    tok = Tokenizer(spec)

    def enc(s: str) -> list[int]:
        return list(tok.encode(s, add_special=False))

    load = LoadWatch()
    started = dt.datetime.now(dt.UTC)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    peers: dict[str, list[Side]] = {c: [] for c in LLAMA_CONFIGS}
    runs: dict[str, list[Side]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="modelc-sbs-") as d:
        log_dir = Path(d)
        for r in range(args.rounds):  # alternate, so both see the same machine load
            print(f"[side-by-side] round {r + 1}/{args.rounds}", file=sys.stderr)
            for cfg in args.llama_configs.split(","):
                peers[cfg].append(run_llamacpp(gguf, args, log_dir, enc, cfg))
            for m in modes:
                runs[m].append(run_modelc(gguf, m, args, log_dir))
        pres = paired(gguf, gguf.stem, enc, args, log_dir) if args.pair_rounds else None
    peer_cfgs = [best(v) for v in peers.values() if v]
    peer = best(peer_cfgs)  # the stronger llama.cpp, measurement by measurement
    sides = [best(runs[m]) for m in modes]
    loads = load.stop()
    secs = (dt.datetime.now(dt.UTC) - started).total_seconds()
    tbl = table(sides, peer, args)
    cfg_tbl = "\n".join(
        [
            "| llama.cpp configuration | decode b1 | prefill | decode b8 | HTTP tok/s | TTFT p50 ms | RSS MB |",
            "|---|---|---|---|---|---|---|",
            *(
                f"| {p.name} | {p.decode_b1:,.1f} | {p.prefill:,.1f} | {p.decode_b8:,.1f} "
                f"| {p.http_tps:,.1f} | {p.ttft_p50_ms:,.0f} | {p.rss_mb:,.0f} |"
                for p in peer_cfgs
            ),
        ]
    )
    commit = git_commit()
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    cmd = ".venv/bin/python -m bench.side_by_side " + shlex.join(sys.argv[1:])
    label = "SmolLM2-135M-Instruct Q4_1" if args.gguf is None else gguf.name
    paired_md = (
        ""
        if pres is None
        else f"""
Paired rounds ({args.pair_rounds}, after the rounds above; `bench.paired`): modelc (the
`{modes[0]}` mode, in the benchmark's own process) and llama.cpp (one server per
configuration) stay loaded together, and every round measures each quantity on each side
back to back, the order flipping from round to round, every server stopped (SIGSTOP)
while it is not measured: the read bandwidth (best of 3 two-thread passes over 2 GiB),
prefill of the {args.prefill_len}-token prompt (best of 2), {args.decode_steps} decode
steps at batch 1 (best of 3) and 8 (best of 2). Each ratio is the median of the rounds'
ratios against the better llama.cpp configuration; the share is the weight bytes a token
reads ({pres.nbytes / 1e6:,.0f} MB: every weight but untied embeddings) x batch-1 tok/s
over the round's read, the median of the rounds. Issue 14 judges batch-1 decode here:
one offline figure per side, minutes apart, swings with the machine's load (0.87x to
1.38x on the same build).

{paired_table(pres, args.prefill_len)}
"""
    )
    heading = f"## Side by side: modelc vs llama.cpp ({label}, {args.threads} threads)"
    md = f"""{heading}

Command (run {started:%Y-%m-%d %H:%M} UTC, {secs:.0f} s, at commit {commit}; {cpu}, {os.cpu_count()} cores;
1-minute load average {load.before:.2f} before, {min(loads):.2f} / {sum(loads) / len(loads):.2f} / {max(loads):.2f}
min / mean / max during the run (sampled every 5 s); other jobs share the machine):

```sh
{cmd.strip()}
```

Same GGUF file, same thread count for both; llama.cpp is the `xllamacpp` wheel's server
(in its own process, {args.streams} slots, {args.ctx_per_seq} tokens of context each), modelc is
`modelc run --max-concurrent {args.streams} --max-context {args.ctx_per_seq}` for HTTP and
`modelc bench --json` for the offline rows, once per matmul mode (`MODELC_MATMUL`).
{args.rounds} rounds, each running llama.cpp and then every modelc mode, so all see the
same changing machine load; each cell is the best of its rounds (highest throughput,
lowest TTFT; RSS the highest seen).
Ratios are modelc / llama.cpp (for TTFT and RSS lower is better). Offline decode:
{args.decode_steps} greedy steps after a 16-token prompt, best of 2; llama.cpp's speeds are its own
`timings` (batch 8: tokens over the longest generation phase of 8 concurrent requests).
HTTP: {args.requests} streaming `/v1/completions` requests, {args.streams} at a time, ~{args.prompt_len}-token
random-word prompts, {args.max_tokens} output tokens (`ignore_eos`), the same load generator
(`modelc.bench.loadgen`) for both; RSS is the server process's `VmHWM` after the load.

{tbl}

The llama.cpp column is, measurement by measurement, the better of two configurations
(the wheel is built with OpenMP, whose threads spin at barriers: with other jobs on the
machine `OMP_WAIT_POLICY=passive` is sometimes much faster, sometimes slower), each the best of its rounds:

{cfg_tbl}
{paired_md}"""
    print(md)
    if not args.no_write:
        write_results(md, heading)
    return 0


if __name__ == "__main__":
    sys.exit(main())
