"""Offline benchmark of one model through the runtime's batch API (no engine, no HTTP).

* **load**: *cold* is a fresh Python subprocess that imports modelc and opens the
  artifact and builds the runtime model (the OS page cache may still hold the file: a
  page-cache drop needs root); *warm* is a second open in this process.
* **prefill**: one ``forward`` of a whole prompt of each length (fresh KV cache), best of
  ``reps``; tokens/s = length / time.
* **decode**: ``batch`` sequences, each prefilled with a 16-token prompt, then ``steps``
  greedy steps of one ``forward`` over all of them, best of ``reps`` such runs (each
  continuing the same sequences); tokens/s = batch * steps / time.
* **peak RSS**: this process's high-water mark (``VmHWM``) after the run.

Prefill and decode use a ``kv_cache`` KV cache (f16 by default, as ``modelc run``).

On another ``device`` (``cuda``, ``webgpu``, ``metal``, ``auto``) the model is placed as
``modelc run --device`` places it (:func:`modelc.engine.build_runtime`, ``-ngl`` layers
on the GPU), once: the fresh-process load and import timings, which build on the CPU
kernels, are skipped and say so (``skipped``), and the warm load is that one placement.
The result names where the model computed (:func:`placement`), which is not always the
device asked for (``auto`` without a GPU runs on the CPU).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from modelc.runtime.backend import Backend

from modelc.errors import UnsupportedError, UsageError

# Varied English words (mostly one token each with a leading space in BPE vocabularies).
WORDS = tuple(
    [
        "river",
        "stone",
        "light",
        "garden",
        "window",
        "market",
        "winter",
        "music",
        "paper",
        "silver",
        "forest",
        "ocean",
        "morning",
        "table",
        "letter",
        "bridge",
        "summer",
        "yellow",
        "mountain",
        "simple",
        "number",
        "island",
        "station",
        "little",
        "village",
        "orange",
        "moment",
        "engine",
        "quiet",
        "history",
        "doctor",
        "animal",
        "thunder",
        "kitchen",
    ]
)


@dataclass
class OfflineResult:
    model: str
    architecture: str
    device: str  # the device asked for (--device)
    n_gpu_layers: int | str  # the layers asked on the GPU (-ngl)
    backend: str  # where it computed (placement): "cpu", "cuda layers 0-9 + cpu layers 10-29"
    threads: int
    matmul: str | None  # the CPU kernels' mode; None where no layer ran on them
    kv_cache: str  # KV-cache storage of the prefill and decode rows
    load_cold_s: float | None  # open + build in a fresh process (--device cpu only)
    # cpu: open + build a second time in this process; another device: open + placement, once
    load_warm_s: float
    import_s: float | None  # importing the runtime in a fresh process (not in load_cold_s)
    skipped: dict[str, str] = field(default_factory=dict)  # a field left None -> why
    prefill_tps: dict[int, float] = field(default_factory=dict)  # prompt length -> tok/s
    decode_tps: dict[int, float] = field(default_factory=dict)  # batch -> aggregate tok/s
    decode_steps: int = 0
    peak_rss_mb: float = 0.0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["prefill_tps"] = {str(k): v for k, v in self.prefill_tps.items()}
        d["decode_tps"] = {str(k): v for k, v in self.decode_tps.items()}
        return d


def peak_rss_mb(pid: int | str = "self") -> float:
    """The process's peak resident set (``VmHWM``) in MB (1e6 bytes); 0 if unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    import resource

    if pid == "self":
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6
    return 0.0


def prompt_tokens(
    n: int, vocab: int, encode: Callable[[str], list[int]] | None, seed: int
) -> list[int]:
    """Exactly ``n`` token ids of varied text (random ids when there is no tokenizer)."""
    rng = np.random.default_rng(seed)
    if encode is not None:
        ids: list[int] = []
        while len(ids) < n:
            ids += encode(" " + " ".join(rng.choice(WORDS, size=max(64, n)).tolist()))
        return ids[:n]
    return [int(t) for t in rng.integers(100, vocab, size=n)]


_COLD = """
import json, sys, time
t0 = time.perf_counter()
from modelc.artifact import load_artifact
from modelc.runtime.arch import build
from modelc.runtime.backends.cpu import CpuBackend
t1 = time.perf_counter()
ir = load_artifact(sys.argv[1])
model = build(ir, CpuBackend(threads=int(sys.argv[2]), matmul=sys.argv[3]))
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "open_s": t2 - t1}))
"""


def cold_load_s(path: Path, threads: int, matmul: str) -> tuple[float, float]:
    """(import, open + build) seconds for ``path`` in a fresh interpreter."""
    r = subprocess.run(
        [sys.executable, "-c", _COLD, str(path), str(threads), matmul],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode != 0:
        raise UnsupportedError(f"cold load of {path} failed: {r.stderr.strip()[-400:]}")
    d = json.loads(r.stdout.strip().splitlines()[-1])
    return float(d["import_s"]), float(d["open_s"])


def _parts(model: object, host: Backend) -> list[tuple[Backend, str]]:
    """Each part of ``model`` (one, unless it is split by layers) and its backend."""
    from modelc.runtime.split import SplitLM

    def backend(m: object) -> Backend:
        be: Backend = getattr(m, "be", host)  # the runtime models (CudaLlama too) keep theirs
        return be

    if isinstance(model, SplitLM):
        return [(backend(p), f" layers {p.first}-{p.stop - 1}") for p in model.parts]
    return [(backend(model), "")]


def placement(model: object, host: Backend) -> str:
    """Where ``model`` computes, in words: its backend's name (with a WebGPU adapter's
    description), or, for a model split by layers (``-ngl``), each part's and its layers."""
    words = []
    for be, layers in _parts(model, host):
        adapter = getattr(be, "device_name", None)  # a WebGPU adapter
        words.append(f"{be.name}{f' ({adapter})' if adapter else ''}{layers}")
    return " + ".join(words)


def run_offline(
    model_arg: str,
    *,
    prompt_lens: Sequence[int] = (128, 512, 2048),
    batches: Sequence[int] = (1, 2, 4, 8),
    steps: int = 32,
    reps: int = 2,
    threads: int | None = None,
    matmul: str | None = None,
    kv_cache: str = "f16",
    device: str = "cpu",
    n_gpu_layers: int | str = "auto",
    progress: Callable[[str], None] | None = None,
    n_cpu_moe: int = 0,
) -> OfflineResult:
    """Measure ``model_arg`` (a path, store or catalog name; see :mod:`modelc.resolve`) on
    ``device`` (``cpu``; ``cuda`` with ``n_gpu_layers`` of its layers and the experts of
    the first ``n_cpu_moe`` on the CPU, ``webgpu``,
    ``metal``, ``auto``: placed as ``modelc run --device`` places it, without the
    fresh-process load timings, which measure the CPU path)."""
    from modelc.artifact import load_artifact
    from modelc.bench.timing import GreedyBatch, prefill_seconds
    from modelc.engine import EngineOptions, build_runtime
    from modelc.resolve import resolve_model
    from modelc.runtime.arch import build
    from modelc.runtime.backends.cpu import CpuBackend, default_threads, matmul_tol
    from modelc.runtime.model import CausalLM, SeqChunk
    from modelc.runtime.tokenizer import Tokenizer

    say = progress or (lambda _s: None)
    if steps < 1 or reps < 1:
        raise UsageError("--steps and --reps must be at least 1")
    if any(n < 1 for n in prompt_lens) or any(b < 1 for b in batches):
        raise UsageError("prompt lengths and batch sizes must be at least 1")
    threads = threads or default_threads()
    mode = (matmul or "").strip().lower() or None
    matmul_tol(mode)  # validates the name
    if mode is not None and device != "cpu":
        raise UsageError(
            f"--matmul sets the CPU kernels of --device cpu; the CPU layers of --device {device} "
            "take MODELC_MATMUL"
        )
    opt = EngineOptions(
        device=device,
        kv_cache=kv_cache,
        threads=threads,
        max_concurrent=max(batches),
        n_gpu_layers=n_gpu_layers,
        n_cpu_moe=n_cpu_moe,
    )
    opt.validate()  # -ngl with --device cpu, say: one line now
    import os

    mode_name = mode or os.environ.get("MODELC_MATMUL", "").strip().lower() or "fast"

    say("resolving model")
    path = resolve_model(model_arg)
    imp: float | None = None
    cold: float | None = None
    skipped: dict[str, str] = {}
    if device != "cpu":
        why = "measured with --device cpu only (the fresh process builds on the CPU kernels)"
        skipped = {"import_s": why, "load_cold_s": why}
    else:
        say("cold load (fresh process)")
        imp, cold = cold_load_s(path, threads, mode_name)
        model = build(load_artifact(path), CpuBackend(threads=threads, matmul=mode))  # first
        del model  # with its backend (and what that derived from the weights)
    t1 = time.perf_counter()
    ir = load_artifact(path)
    if device == "cpu":
        backend: Backend = CpuBackend(threads=threads, matmul=mode)
        model = build(ir, backend)
    else:
        say(f"placing the model ({device})")
        model, backend = build_runtime(ir, opt)
    warm = time.perf_counter() - t1
    placed = placement(model, backend)
    if not isinstance(model, CausalLM):
        raise UnsupportedError(
            f"{model_arg} is a {ir.architecture} model; `modelc bench` measures language models"
        )
    encode = None
    if ir.tokenizer is not None:
        tok = Tokenizer(ir.tokenizer)

        def encode(s: str) -> list[int]:
            return list(tok.encode(s, add_special=False))

    res = OfflineResult(
        model=model_arg,
        architecture=ir.architecture,
        device=device,
        n_gpu_layers=n_gpu_layers,
        backend=placed,
        threads=threads,
        matmul=mode_name if any(be.name == "cpu" for be, _ in _parts(model, backend)) else None,
        kv_cache=kv_cache,
        load_cold_s=cold,
        load_warm_s=warm,
        import_s=imp,
        skipped=skipped,
        decode_steps=steps,
    )
    longest = max([*prompt_lens, 16 + steps * reps])
    if longest > model.n_ctx:
        raise UsageError(f"prompt length {longest} exceeds the model's context {model.n_ctx}")

    # warm-up: touch every weight page and the kernels' thread pool
    model.forward(
        [
            SeqChunk(
                model.new_cache(kv_cache, max_tokens=64),
                prompt_tokens(16, model.n_vocab, encode, 0),
            )
        ]
    )

    for n in prompt_lens:
        ids = prompt_tokens(n, model.n_vocab, encode, seed=n)
        best = float("inf")
        for r in range(reps):
            say(f"prefill {n} tokens ({r + 1}/{reps})")
            best = min(best, prefill_seconds(model, ids, kv_cache))
        res.prefill_tps[n] = n / best

    for b in batches:
        prompts = [prompt_tokens(16, model.n_vocab, encode, seed=100 + i) for i in range(b)]
        seqs = GreedyBatch(model, prompts, steps * reps, kv_cache)
        best = float("inf")
        for r in range(reps):  # each rep continues the same sequences for `steps` more tokens
            say(f"decode batch {b} ({r + 1}/{reps})")
            best = min(best, seqs.run(steps).total)
        res.decode_tps[b] = b * steps / best

    res.peak_rss_mb = peak_rss_mb()
    return res
