"""The host side of a resident WebGPU decode step (webgpu_llama.py), what a real GPU would
wait on: a step's ``forward`` from its start up to ``queue.submit`` (the step's arrays
written, its dispatches recorded or its kept plan found, uniforms written, bind groups
found, the compute pass encoded), timed with ``perf_counter`` (the queue's ``submit``
wrapped); the submit, the wait for the shaders and the read-back are left out.
Batch-1 decode of SmolLM2-135M and of the tiny random llama of
tests/test_webgpu_resident.py, a 16-token prompt, then warm-up steps, then ``--steps``
timed ones: dispatches a step, host ms a step (median), total ms a step (median).  On
lavapipe the total is the shaders on the same CPU; only the host column carries over to a
real GPU.

    PYTHONPATH=. .venv/bin/python bench/webgpu_host.py [--steps 16] [--warm 4] [--kv f16]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="modelc-xdg-"))


class HostClock:
    """Wraps ``model.forward`` and the queue's ``submit``: each step's host seconds, from
    the forward's start (the step's arrays written, its dispatches recorded or its plan
    found) to the submit (its compute pass encoded)."""

    def __init__(self, model: Any) -> None:
        self.host: list[float] = []
        self._t0 = 0.0
        forward = model.forward
        queue = model.gpu.device.queue
        self._cls, self._submit = type(queue), type(queue).submit

        def timed_forward(batch: Any) -> Any:
            self._t0 = time.perf_counter()
            return forward(batch)

        def timed_submit(q: Any, bufs: Any) -> Any:
            if self._t0 and q is queue:
                self.host.append(time.perf_counter() - self._t0)
                self._t0 = 0.0
            return self._submit(q, bufs)

        model.forward = timed_forward
        self._cls.submit = timed_submit

    def close(self) -> None:
        self._cls.submit = self._submit


def count_dispatches(model: Any, step: Any) -> int:
    """Dispatches encoded by ``step()`` (the pass encoder's method wrapped meanwhile)."""
    enc = model.gpu.device.create_command_encoder()
    cls = type(enc.begin_compute_pass())
    orig, calls = cls.dispatch_workgroups, [0]

    def counted(cp: Any, *a: Any) -> Any:
        calls[0] += 1
        return orig(cp, *a)

    cls.dispatch_workgroups = counted
    try:
        step()
    finally:
        cls.dispatch_workgroups = orig
    return calls[0]


def timed_steps(model: Any, step: Any, steps: int) -> tuple[list[float], list[float]]:
    """``steps`` calls of ``step()``: each one's host seconds (:class:`HostClock`) and wall
    seconds."""
    clock = HostClock(model)
    total = []
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            total.append(time.perf_counter() - t0)
    finally:
        clock.close()
    return clock.host, total


def bench(path: Path, be: Any, steps: int, warm: int, kv: str) -> dict[str, float]:
    from modelc.formats import load_model
    from modelc.runtime.backends.webgpu_llama import WebGpuLlama
    from modelc.runtime.model import SeqChunk

    model = WebGpuLlama(load_model(str(path)), be)
    cache = model.new_cache(kv)
    tok = [int(np.argmax(model.forward([SeqChunk(cache, list(range(1, 17)))])[0]))]

    def step() -> None:
        tok[0] = int(np.argmax(model.forward([SeqChunk(cache, [tok[0]])])[0]))

    for _ in range(warm):
        step()
    dispatches = count_dispatches(model, step)
    host, total = timed_steps(model, step, steps)
    cache.free()
    return {
        "dispatches": dispatches,
        "host_ms": 1e3 * float(np.median(host)),
        "host_min_ms": 1e3 * float(np.min(host)),
        "total_ms": 1e3 * float(np.median(total)),
    }


def main() -> None:
    from modelc.runtime.backends.webgpu import WebGPUBackend
    from tests.assets import smollm2_gguf
    from tests.test_webgpu_resident import _llama

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warm", type=int, default=4)
    ap.add_argument("--kv", default="f16")
    a = ap.parse_args()
    be = WebGPUBackend()
    print(f"{be.device_name}, kv {a.kv}, batch-1 decode, {a.warm} warm-up + {a.steps} steps")
    print("model           dispatches  host ms (median, min)  total ms  tok/s")
    for name, path in (("smollm2-135m", smollm2_gguf()), ("tiny-llama", _llama())):
        r = bench(path, be, a.steps, a.warm, a.kv)
        print(
            f"{name:15s} {r['dispatches']:10.0f}  {r['host_ms']:7.2f} ({r['host_min_ms']:6.2f})"
            f"       {r['total_ms']:8.1f}  {1e3 / r['total_ms']:5.1f}"
        )


if __name__ == "__main__":
    main()
