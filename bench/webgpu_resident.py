"""SmolLM2 batch-1 decode on ``--device webgpu``: the op-level backend against the resident
decoder (webgpu_llama.py), in one process, alternating, on the same adapter; submits a step
counted from ``Gpu.runs``.  On lavapipe (a CPU) only the host-side overhead means anything.

    .venv/bin/python bench/webgpu_resident.py [MODEL] [--steps N] [--reps R] [--kv f16|f32]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="modelc-xdg-"))


def main() -> None:
    from modelc.formats import load_model
    from modelc.runtime.arch import build
    from modelc.runtime.backends.webgpu import WebGPUBackend
    from modelc.runtime.backends.webgpu_llama import WebGpuLlama
    from modelc.runtime.model import SeqChunk

    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kv", default="f16")
    a = ap.parse_args()
    if a.model is None:
        from tests.assets import smollm2_gguf

        a.model = str(smollm2_gguf())
    ir = load_model(a.model)
    be = WebGPUBackend()
    models = {"op-level": build(ir, be), "resident": WebGpuLlama(ir, be)}
    prompt = list(range(1, 17))
    res: dict[str, list[float]] = {k: [] for k in models}
    subs: dict[str, float] = {}
    for _ in range(a.reps):
        for name, m in models.items():
            cache = m.new_cache(a.kv)
            tok = int(np.argmax(m.forward([SeqChunk(cache, prompt)])[0]))
            runs0, t0 = be.gpu.runs, time.perf_counter()
            for _ in range(a.steps):
                tok = int(np.argmax(m.forward([SeqChunk(cache, [tok])])[0]))
            res[name].append(a.steps / (time.perf_counter() - t0))
            subs[name] = (be.gpu.runs - runs0) / a.steps
            cache.free()
    print(f"{be.device_name}, {a.model}, kv {a.kv}, {a.steps} decode steps x {a.reps}")
    for name, v in res.items():
        print(
            f"{name:9s} decode {np.median(v):6.2f} tok/s (median; {', '.join(f'{x:.2f}' for x in v)}), {subs[name]:.0f} submits/step"
        )


if __name__ == "__main__":
    main()
