"""Where a resident WebGPU decode step's time goes (webgpu_llama.py), to explain its gap to
CUDA: batch-1 decode after a 64-token prompt, per model:

- dispatches a step; host ms a step (``forward``'s start up to ``queue.submit``, as
  bench/webgpu_host.py); total ms a step (wall: host + submit + GPU + wait + read-back);
  tok/s = 1000 / total;
- GPU ms a step: the step's one compute pass between two timestamp queries (where the
  adapter has ``timestamp-query``; else said in one line and left blank);
- per kind of dispatch (matmul / attention / rest): GPU ms a step, each dispatch in a
  pass of its own with its own timestamps (a profiling mode: same dispatches, same order,
  same logits; the pass boundaries add synchronisation, so the sum is over the step's);
  matmul GB/s in the step = the step's weight bytes / its matmuls' GPU time;
- the matmul shader alone on the model's largest matrix (by bytes): ``--reps`` dispatches
  in one pass, one submit: GB/s of the weight's bytes by timestamps and by wall time.
  (CUDA's GEMV reads ~2-2.9 TB/s on an H100.)

    PYTHONPATH=. .venv/bin/python bench/webgpu_gap.py [--model PATH ...] [--steps 16]
        [--warm 4] [--kv f16] [--reps 200] [--json OUT.json]

Without ``--model``: SmolLM2-135M and the tiny random llama of the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="modelc-xdg-"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from webgpu_host import count_dispatches, timed_steps

PROMPT = 64


def kind_of(label: str) -> str:
    """matmul / attention / rest, from a pipeline's label (``module.entry``)."""
    module, _, entry = label.partition(".")
    if entry in ("matmul", "gemv"):  # matmul.wgsl, or gemv.wgsl (few rows of x)
        return "matmul"
    return "attention" if "attention" in module else "rest"


def weight_bytes(model: Any, w: Any) -> int:
    from modelc.formats.ir import row_bytes

    rb = row_bytes(w.dtype, w.shape[1])
    return sum(nr * rb for _, _, nr in model.be._chunks(w))


def step_mats(model: Any) -> list[Any]:
    return [m for ly in model.layers for m in ly.mats()] + [model.output]


def matmul_alone(model: Any, reps: int, timed: bool) -> dict[str, Any]:
    """The model's largest matrix, ``reps`` batch-1 products in one pass, one submit."""
    from modelc.runtime.backends.webgpu_device import Job
    from modelc.runtime.backends.webgpu_timer import PassTimer

    gpu = model.gpu
    w = max(step_mats(model), key=lambda m: weight_bytes(model, m))
    rows, cols = w.shape
    nbytes = weight_bytes(model, w)
    x = gpu.put("gap_x", np.ones(cols, np.float32))
    out = gpu.scratch("gap_out", 4 * rows)
    job = Job(reuse_groups=True)
    for _ in range(reps):
        model._matmul(job, w, x, 1, out)
    plan = gpu.plan(job)
    gpu.run_plan(plan)  # warm
    r: dict[str, Any] = {"shape": [rows, cols], "dtype": str(w.dtype.name), "mib": nbytes / 2**20}
    t0 = time.perf_counter()
    gpu.run_plan(plan)
    wall = time.perf_counter() - t0
    r["wall_gbs"] = reps * nbytes / wall / 1e9
    if timed:
        gpu.timer = PassTimer(gpu)
        try:
            gpu.run_plan(plan)
            ns = gpu.timer.read()[0][1]
        finally:
            gpu.timer = None
        r["gpu_us"] = ns / reps / 1e3
        r["gpu_gbs"] = reps * nbytes / ns
    return r


def bench(path: Path, be: Any, steps: int, warm: int, kv: str, reps: int) -> dict[str, Any]:
    from modelc.formats import load_model
    from modelc.runtime.backends.webgpu import DEQ
    from modelc.runtime.backends.webgpu_llama import WebGpuLlama
    from modelc.runtime.backends.webgpu_timer import PassTimer, timestamps_supported
    from modelc.runtime.model import SeqChunk

    model = WebGpuLlama(load_model(str(path)), be)
    gpu = model.gpu
    timed = timestamps_supported(gpu)
    cache = model.new_cache(kv)
    prompt = [1 + i % (model.n_vocab - 1) for i in range(PROMPT)]
    tok = [int(np.argmax(model.forward([SeqChunk(cache, prompt)])[0]))]

    def step() -> None:
        tok[0] = int(np.argmax(model.forward([SeqChunk(cache, [tok[0]])])[0]))

    for _ in range(warm):
        step()
    r: dict[str, Any] = {"model": path.name, "dispatches": count_dispatches(model, step)}
    host, total = timed_steps(model, step, steps)
    r["host_ms"] = 1e3 * float(np.median(host))
    r["total_ms"] = 1e3 * float(np.median(total))
    r["tok_s"] = 1e3 / r["total_ms"]
    mats = step_mats(model)
    r["weight_mib"] = sum(weight_bytes(model, m) for m in mats) / 2**20
    if timed:
        gpu_ns, walls = [], []
        gpu.timer = PassTimer(gpu)
        try:
            for _ in range(steps):
                t0 = time.perf_counter()
                step()
                walls.append(time.perf_counter() - t0)
                gpu_ns.append(gpu.timer.read()[0][1])
            gpu.timer = PassTimer(gpu, per_dispatch=True)
            per: list[dict[str, float]] = []
            for _ in range(max(3, steps // 4)):
                step()
                sums: dict[str, float] = {}
                for label, ns in gpu.timer.read():
                    sums[label] = sums.get(label, 0.0) + ns
                per.append(sums)
        finally:
            gpu.timer = None
        r["gpu_ms"] = float(np.median(gpu_ns)) / 1e6
        r["gpu_wall_ms"] = 1e3 * float(np.median(walls))
        labels = sorted({k for s in per for k in s})
        by_label = {k: float(np.median([s.get(k, 0.0) for s in per])) / 1e6 for k in labels}
        r["by_pipeline_ms"] = by_label
        kinds: dict[str, float] = {"matmul": 0.0, "attention": 0.0, "rest": 0.0}
        for k, ms in by_label.items():
            kinds[kind_of(k)] += ms
        r["kinds_ms"] = kinds
        if kinds["matmul"] > 0:
            r["matmul_step_gbs"] = r["weight_mib"] * 2**20 / (kinds["matmul"] * 1e6)
        # by weight type: the step's bytes of that type over its shader's GPU time
        by_type: dict[str, dict[str, float]] = {}
        for m in mats:
            t = by_type.setdefault(str(m.dtype.name), {"mib": 0.0})
            t["mib"] += weight_bytes(model, m) / 2**20
            fn = DEQ[m.dtype]  # batch 1: gemv.wgsl's pipeline, or matmul.wgsl's (GEMV off)
            mods = (f"matmul_{fn}_1.", f"gemv_{fn}_1_")  # gemv_<fn>_<nx>_<threads a row>
            t["ms"] = sum(ms for k, ms in by_label.items() if k.startswith(mods))
        for t in by_type.values():
            t["gbs"] = t["mib"] * 2**20 / (t["ms"] * 1e6) if t["ms"] else 0.0
        r["matmul_by_type"] = by_type
    r["matmul_alone"] = matmul_alone(model, reps, timed)
    cache.free()
    return r


def _f(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| model | dispatches | host ms | GPU ms | total ms | tok/s | GPU ms: matmul / "
        "attention / rest (per-dispatch passes) | matmul GB/s in step | largest matrix "
        "alone: GB/s (timestamps, wall) |"
    )
    out = [head, "|" + " --- |" * 9]
    for r in rows:
        k = r.get("kinds_ms")
        kinds = "-" if k is None else f"{k['matmul']:.2f} / {k['attention']:.2f} / {k['rest']:.2f}"
        a = r["matmul_alone"]
        alone = (
            f"{_f(a.get('gpu_gbs'), '{:.3g}')}, {a['wall_gbs']:.3g} "
            f"({a['dtype']} {a['shape'][0]}x{a['shape'][1]}, {a['mib']:.1f} MiB)"
        )
        out.append(
            f"| {r['model']} | {r['dispatches']} | {r['host_ms']:.2f} | {_f(r.get('gpu_ms'))} "
            f"| {r['total_ms']:.2f} | {r['tok_s']:.1f} | {kinds} "
            f"| {_f(r.get('matmul_step_gbs'), '{:.3g}')} | {alone} |"
        )
    out += ["", "| model | weight type | MiB a step | GPU ms a step | GB/s |", "|" + " --- |" * 5]
    for r in rows:
        for name, t in r.get("matmul_by_type", {}).items():
            out.append(
                f"| {r['model']} | {name} | {t['mib']:.1f} | {t['ms']:.3f} | {t['gbs']:.3g} |"
            )
    return "\n".join(out)


def main() -> None:
    from modelc.runtime.backends.webgpu import WebGPUBackend
    from modelc.runtime.backends.webgpu_device import Gpu
    from modelc.runtime.backends.webgpu_timer import timestamps_supported

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append", type=Path, help="a GGUF (repeatable)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warm", type=int, default=4)
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--reps", type=int, default=200, help="products of the largest matrix")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args()
    Gpu.want_timestamps = True
    be = WebGPUBackend()
    ts = timestamps_supported(be.gpu)
    print(f"{be.device_name}, kv {a.kv}, batch-1 decode after a {PROMPT}-token prompt, ")
    print(f"{a.warm} warm-up + {a.steps} steps, medians")
    if not ts:
        print("no timestamp-query on this adapter: GPU times left out (wall times only)")
    if a.model:
        paths = a.model
    else:
        from tests.assets import smollm2_gguf
        from tests.test_webgpu_resident import _llama

        paths = [smollm2_gguf(), _llama()]
    rows = [bench(p, be, a.steps, a.warm, a.kv, a.reps) for p in paths]
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps({"device": be.device_name, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
