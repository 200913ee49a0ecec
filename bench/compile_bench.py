"""Does ``modelc compile``'s specialised forward buy speed?  Per-step time against the runtime.

    flock /tmp/modelc-bench.lock .venv/bin/python -m bench.compile_bench \
        [--models smollm2,gpt2-tiny] [--batches 1,8] [--steps 48] [--reps 5] [--threads 1]
        [--rebuild]
    flock /tmp/modelc-bench.lock .venv/bin/python -m bench.compile_bench --http \
        [--concurrency 1,8] [--requests 16] [--reps 4] [--threads 2]

For each model it compiles a project (``modelc compile``), builds its two extensions in
place (kernels and forward; cached under ``$TMPDIR/modelc-compile-bench``), then, in a
child process that imports both modelc and the compiled package, times one decode step
(``forward`` of B one-token chunks, f16 KV caches, each sequence first prefilled with a
32-token prompt) of modelc's runtime model and of the compiled one, on the same
artifact and the same backend settings: every step runs on both, back to back, the
order alternating (this machine is shared; a step's pair sees the same load), ``--reps``
times ``--steps`` steps.  It checks the two return identical logits every step and
prints one table row per (model, batch): median ms/step of each, the median of the
per-step differences (the per-step overhead specialisation removes) with its
interquartile range, and the ratio of the medians.

``--http`` measures the whole program instead: ``modelc run`` and the compiled SmolLM2
program side by side on loopback, the same greedy chat load from ``modelc bench --url``
on each in turn, aggregate output tokens/s and the median time per output token.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _project(name: str, src: Path, rebuild: bool) -> tuple[Path, str]:
    """A compiled project with both extensions built in place (kept between runs unless
    ``rebuild``)."""
    out = Path(tempfile.gettempdir()) / "modelc-compile-bench" / name
    stamp = out / ".built"
    if rebuild or not stamp.exists():
        cmd = [sys.executable, "-m", "modelc.cli", "compile", str(src), "-o", str(out)]
        subprocess.run([*cmd, "--name", name, "--force"], check=True, stdout=subprocess.DEVNULL)
        code = (
            "import setup\nfrom setuptools import setup as s\n"
            "s(ext_modules=setup.extensions(), script_args=['build_ext', '--inplace', '-q'])"
        )
        subprocess.run([sys.executable, "-c", code], cwd=out, check=True, capture_output=True)
        stamp.write_text("")
    (pkg,) = [p.name for p in out.iterdir() if p.name.endswith("_app")]
    return out, pkg


def _sources(names: list[str]) -> dict[str, Path]:
    from tests.assets import smollm2_gguf
    from tests.gen_gpt2 import ensure_gpt2_random

    known = {"smollm2": smollm2_gguf, "gpt2-tiny": ensure_gpt2_random}
    return {n: known[n]() for n in names}


def child(package: str, batches: list[int], steps: int, reps: int, threads: int) -> None:
    """In the child: time both models; print one JSON line per batch size."""
    import importlib

    import numpy as np

    from modelc.artifact import load_artifact
    from modelc.runtime.arch import build
    from modelc.runtime.backends.cpu import CpuBackend
    from modelc.runtime.model import SeqChunk

    app = importlib.import_module(f"{package}.app")
    fw = importlib.import_module(f"{package}._forward")
    art = importlib.import_module(f"{package}._rt.artifact")
    cpu = importlib.import_module(f"{package}._rt.runtime.backends.cpu")
    mm = importlib.import_module(f"{package}._rt.runtime.model")
    models: dict[str, Any] = {
        "runtime": (build(load_artifact(app.ARTIFACT), CpuBackend(threads=threads)), SeqChunk),
        "compiled": (
            fw.Compiled(art.load_artifact(app.ARTIFACT), cpu.CpuBackend(threads=threads)),
            mm.SeqChunk,
        ),
    }
    rng = np.random.default_rng(0)
    names = list(models)
    for b in batches:
        prompts = [[int(t) for t in rng.integers(0, 1000, 32)] for _ in range(b)]
        times: dict[str, list[float]] = {k: [] for k in names}
        saved: list[float] = []  # per step: runtime - compiled, the two run back to back
        identical = True
        for _ in range(reps):
            caches, logits = {}, {}
            for name, (model, chunk) in models.items():
                caches[name] = [model.new_cache("f16", max_tokens=33 + steps) for _ in range(b)]
                pre = [chunk(c, p) for c, p in zip(caches[name], prompts, strict=True)]
                logits[name] = model.forward(pre)
            for step in range(steps):
                toks = [[int(t)] for t in logits["runtime"].argmax(-1)]
                took = {}
                for name in names if step % 2 else names[::-1]:  # alternate who goes first
                    model, chunk = models[name]
                    batch = [chunk(c, t) for c, t in zip(caches[name], toks, strict=True)]
                    t0 = time.perf_counter()
                    logits[name] = model.forward(batch)
                    took[name] = (time.perf_counter() - t0) * 1e3
                    times[name].append(took[name])
                saved.append(took["runtime"] - took["compiled"])
                identical = identical and bool(
                    np.array_equal(logits["runtime"], logits["compiled"])
                )
        print(json.dumps({"batch": b, "identical": identical, "saved": saved, **times}), flush=True)


def _wait(url: str, proc: subprocess.Popen[bytes]) -> None:
    from modelc.bench.procs import ServerStartError, wait_healthy

    try:
        wait_healthy(url, proc, 120.0, poll=0.1)
    except ServerStartError as e:
        raise SystemExit(f"{url}: {e}") from e


def http(threads: int, reps: int, levels: str, requests: int) -> None:
    """The same greedy chat load on ``modelc run`` and on the compiled program (SmolLM2,
    from the in-place project, so no wheel install is needed), alternating ``reps`` times:
    aggregate output tokens/s and median time per output token, per concurrency."""
    from tests.server_fixtures import free_port

    (src,) = _sources(["smollm2"]).values()
    out, pkg = _project("smollm2", src, False)
    home = tempfile.TemporaryDirectory(prefix="modelc-cb-")
    env = {**os.environ, "MODELC_HOME": home.name, "MODELC_THREADS": str(threads)}
    cmds = {
        "modelc run": [sys.executable, "-m", "modelc.cli", "run", str(out / pkg / "model.modelc")],
        "compiled": [sys.executable, "-m", pkg],
    }
    procs, urls = {}, {}
    for name, cmd in cmds.items():
        port = free_port()
        penv = {**env, "PYTHONPATH": str(out)} if name == "compiled" else env
        procs[name] = subprocess.Popen(
            [*cmd, "--port", str(port), "--threads", str(threads)],
            cwd=home.name,
            env=penv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        urls[name] = f"http://127.0.0.1:{port}"
    try:
        for name in cmds:
            _wait(urls[name], procs[name])
        res: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for rep in range(reps):
            for name in list(cmds) if rep % 2 == 0 else list(cmds)[::-1]:
                cmd = [sys.executable, "-m", "modelc.cli", "bench", "--url", urls[name], "--chat"]
                cmd += ["--concurrency", levels, "--requests", str(requests), "--json"]
                r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                for lv in json.loads(r.stdout)["levels"]:
                    key = (name, int(lv["concurrency"]))
                    res.setdefault(key, []).append((lv["output_tps"], lv["tpot"]["p50"]))
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(60)
        home.cleanup()
    print("| server | concurrency | output tok/s (median, runs) | TPOT p50 ms |")
    print("|---|---|---|---|")
    for (name, c), runs in sorted(res.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        tps = statistics.median(t for t, _ in runs)
        tpot = statistics.median(t for _, t in runs)
        each = " / ".join(f"{t:.1f}" for t, _ in runs)
        print(f"| {name} | {c} | {tps:.1f} ({each}) | {tpot:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gpt2-tiny")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rebuild", action="store_true", help="compile and build the projects anew")
    ap.add_argument(
        "--http", action="store_true", help="load-test modelc run and the program (SmolLM2)"
    )
    ap.add_argument("--concurrency", default="1,8", help="--http: client counts")
    ap.add_argument("--requests", type=int, default=16, help="--http: requests per level")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    batches = [int(x) for x in a.batches.split(",")]
    if a.child:
        child(a.child, batches, a.steps, a.reps, a.threads)
        return
    if a.http:
        http(a.threads, a.reps, a.concurrency, a.requests)
        return
    print(
        "| model | batch | runtime ms/step | compiled ms/step | saved µs/step | compiled/runtime | logits identical |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, src in _sources(a.models.split(",")).items():
        out, pkg = _project(name, src, a.rebuild)
        env = {
            **os.environ,
            "PYTHONPATH": f"{out}{os.pathsep}{ROOT}",
            "MODELC_THREADS": str(a.threads),
        }
        cmd = [sys.executable, "-m", "bench.compile_bench", "--child", pkg, "--batches", a.batches]
        cmd += ["--steps", str(a.steps), "--reps", str(a.reps), "--threads", str(a.threads)]
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise SystemExit(res.stderr[-3000:])
        for line in res.stdout.splitlines():
            r = json.loads(line)
            rt, cp = statistics.median(r["runtime"]), statistics.median(r["compiled"])
            sv = statistics.median(r["saved"])
            q1, _, q3 = statistics.quantiles(r["saved"], n=4)
            print(
                f"| {name} | {r['batch']} | {rt:.3f} | {cp:.3f} | {1e3 * sv:.0f} "
                f"({1e3 * q1:.0f} .. {1e3 * q3:.0f}) | {cp / rt:.2f} | {r['identical']} |"
            )


if __name__ == "__main__":
    main()
