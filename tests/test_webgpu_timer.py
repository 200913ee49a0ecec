"""GPU time of resident WebGPU steps from timestamp queries (webgpu_timer.py, the profiler
of bench/webgpu_gap.py), on Mesa's software Vulkan in CI: the timed modes (the step's one
pass between two timestamps; each dispatch in a pass of its own) give the plain step's
logits bit for bit; the step's GPU time is positive and no larger than its wall time; the
per-dispatch passes name every dispatch's pipeline; the plain path is untouched when no
timer is set."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from modelc.runtime.model import SeqChunk
from tests.runtime_support import webgpu_backend

pytest.importorskip("wgpu")

from modelc.runtime.backends.webgpu import GEMV_ROWS
from modelc.runtime.backends.webgpu_device import Gpu
from modelc.runtime.backends.webgpu_llama import WebGpuLlama
from modelc.runtime.backends.webgpu_timer import PassTimer, timestamps_supported

if not os.environ.get("XDG_RUNTIME_DIR"):
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="modelc-xdg-")


@pytest.fixture(scope="module")
def model() -> Iterator[WebGpuLlama]:
    from modelc.formats import load_model
    from tests.test_webgpu_resident import _llama

    Gpu.want_timestamps = True
    try:
        be = webgpu_backend()
    finally:
        Gpu.want_timestamps = False
    if not timestamps_supported(be.gpu):
        pytest.skip(f"{be.device_name}: no timestamp-query feature")
    be.gemv_rows = GEMV_ROWS  # decode products on gemv.wgsl, as on a GPU
    yield WebGpuLlama(load_model(str(_llama())), be)


def _run(m: WebGpuLlama, timer: PassTimer | None) -> tuple[list[Any], list[list[Any]]]:
    """A 9-token prompt and 4 greedy steps under ``timer``: logits, each step's times."""
    m.gpu.timer = timer
    try:
        cache = m.new_cache("f16")
        logits = [m.forward([SeqChunk(cache, [1, 17, 33, 5, 90, 12, 7, 64, 3])])]
        times = [timer.read() if timer else []]
        for _ in range(4):
            logits.append(m.forward([SeqChunk(cache, [int(np.argmax(logits[-1][-1]))])]))
            times.append(timer.read() if timer else [])
        cache.free()
    finally:
        m.gpu.timer = None
    return logits, times


def test_timed_modes_keep_the_logits(model: WebGpuLlama) -> None:
    plain, _ = _run(model, None)
    for per_dispatch in (False, True):
        got, times = _run(model, PassTimer(model.gpu, per_dispatch))
        for g, p in zip(got, plain, strict=True):
            assert np.array_equal(g, p)
        assert all(len(t) >= 1 for t in times)


def test_step_gpu_time_within_wall(model: WebGpuLlama) -> None:
    timer = PassTimer(model.gpu)
    cache = model.new_cache("f16")
    model.forward([SeqChunk(cache, [1, 2, 3])])
    model.gpu.timer = timer
    try:
        timer.read()
        for _ in range(3):
            t0 = time.perf_counter()
            model.forward([SeqChunk(cache, [5])])
            wall_ns = (time.perf_counter() - t0) * 1e9
            ((label, ns),) = timer.read()
            assert label == "step"
            assert 0 < ns <= wall_ns
    finally:
        model.gpu.timer = None
        cache.free()


def test_per_dispatch_passes_name_each_pipeline(model: WebGpuLlama) -> None:
    _, times = _run(model, PassTimer(model.gpu, per_dispatch=True))
    step = times[-1]
    labels = {label for label, _ in step}
    assert any(lab.endswith(".gemv") for lab in labels)  # a decode step's products
    assert "attention.attention" in labels
    assert all(ns >= 0 for _, ns in step) and sum(ns for _, ns in step) > 0
