"""Does ``modelc compile``'s specialised forward buy speed?  Per-step time against the runtime.

    flock /tmp/modelc-bench.lock .venv/bin/python -m bench.compile_bench \
        [--models smollm2,gpt2-tiny] [--batches 1,8] [--steps 48] [--reps 5] [--threads 1]
        [--rebuild]

For each model it compiles a project (``modelc compile``), builds its two extensions in
place (kernels and forward; cached under ``$TMPDIR/modelc-compile-bench``), then, in a
child process that imports both modelc and the compiled package, times one decode step
(``forward`` of B one-token chunks, f16 KV caches, each sequence first prefilled with a
32-token prompt) of modelc's runtime model and of the compiled one, on the same
artifact and the same backend settings, alternating the two ``--reps`` times (this
machine is shared: medians of alternating runs).  It checks the two return identical
logits every step and prints one table row per (model, batch): runtime ms/step,
compiled ms/step, the difference (the per-step overhead specialisation removes) and the
ratio.
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
    for b in batches:
        prompts = [[int(t) for t in rng.integers(0, 1000, 32)] for _ in range(b)]
        times: dict[str, list[float]] = {k: [] for k in models}
        identical = True
        for _ in range(reps):
            outs: dict[str, list[Any]] = {}
            for name, (model, chunk) in models.items():
                caches = [model.new_cache("f16", max_tokens=32 + steps + 1) for _ in range(b)]
                logits = model.forward([chunk(c, p) for c, p in zip(caches, prompts, strict=True)])
                seq, per = [], []
                for _ in range(steps):
                    toks = [[int(t)] for t in logits.argmax(-1)]
                    t0 = time.perf_counter()
                    logits = model.forward([chunk(c, t) for c, t in zip(caches, toks, strict=True)])
                    per.append(time.perf_counter() - t0)
                    seq.append(logits)
                times[name].append(statistics.median(per) * 1e3)
                outs[name] = seq
            identical = identical and all(
                np.array_equal(x, y) for x, y in zip(outs["runtime"], outs["compiled"], strict=True)
            )
        print(json.dumps({"batch": b, "identical": identical, **times}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gpt2-tiny")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rebuild", action="store_true", help="compile and build the projects anew")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    batches = [int(x) for x in a.batches.split(",")]
    if a.child:
        child(a.child, batches, a.steps, a.reps, a.threads)
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
            runs = (
                " / ".join(f"{x:.2f}" for x in r["runtime"]),
                " / ".join(f"{x:.2f}" for x in r["compiled"]),
            )
            print(
                f"| {name} | {r['batch']} | {rt:.3f} | {cp:.3f} | {1e3 * (rt - cp):.0f} | "
                f"{cp / rt:.2f} | {r['identical']} |  <!-- runs: {runs[0]} ; {runs[1]} -->"
            )


if __name__ == "__main__":
    main()
