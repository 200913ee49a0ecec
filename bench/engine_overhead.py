"""The engine's own work a step at 64 decoding sequences, on a model that computes nearly nothing.

    .venv/bin/python -m bench.engine_overhead [--model PATH] [--streams 64] [--requests 128]
        [--tokens 64,128] [--reps 3] [--device-sampling on|off] [--profile out.prof]
        [--real-forward [--device cuda] [--prompt-len 192]] [--scheduler-steps N]

(``--real-forward --device cuda --model M``: the engine in process on the GPU at the HTTP
load's shape, to split a served step's time between the model, the step thread and the
event loop without HTTP.)

The engine is built as ``modelc run MODEL --device cpu --max-concurrent N --max-context
256 --speculate off --threads 1`` builds it, around a random llama of a 32,000-token
vocabulary and next to no compute (d 64, 2 layers, Q8_0; written to a temporary file
unless ``--model`` names one), so that what a step costs is the engine's own work:
the scheduler on the event loop (reaping, pacing, ``policy.schedule``, delivery:
detokenizing, stop checks, held tokens, ``policy.update``) and the runner on the step
thread (batch building, sampling's host side, prefix-cache inserts).  ``--requests``
greedy ``ignore_eos`` requests of a 32-token prompt and ``--tokens`` lo,hi new tokens
(spread evenly) run ``--streams`` at a time; each rep reports

* engine steps/s and output tokens/s (wall clock, first step to last);
* the event loop's CPU µs a step and a token (the main thread's ``thread_time``: the
  scheduler plus the bench's own readers, which only count events), and of that the
  scheduler's loop alone (its ``_reap``/``_prepare``/``schedule``/``_deliver``, timed);
* the step thread's CPU µs a step outside the model (``execute`` less ``forward`` /
  ``forward_sample``, both timed here by wrapping them) and the model's own.

``--device-sampling on`` (default) samples in ``forward_sample`` as the CUDA model does
(its host side: ``BatchParams.gather``); ``off`` samples each row on the host.
``--profile FILE`` writes a cProfile of the last rep (both threads) to FILE.
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import trio

from modelc.engine import EngineOptions, LLMEngine, build_engine
from modelc.engine.api import GenerationRequest, TokenEvent
from modelc.runtime.model import SeqChunk
from modelc.runtime.sampling import SamplingParams


@dataclass
class Timers:
    """Seconds accumulated by the wrapped calls (each thread adds to its own)."""

    loop: float = 0.0  # the scheduler's own calls, event loop (perf_counter)
    execute_cpu: float = 0.0  # runner.execute, step thread (thread_time)
    model_cpu: float = 0.0  # model.forward / forward_sample inside it (thread_time)
    model_wall: float = 0.0
    steps: int = 0
    step_times: list[float] = field(default_factory=list)
    step_prof: cProfile.Profile | None = None  # profiles the step thread's execute calls
    kept_prof: cProfile.Profile | None = None  # the last rep's


def _timed(fn: Callable[..., Any], add: Callable[[float], None]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            add(time.perf_counter() - t0)

    return wrapper


def instrument(eng: LLMEngine, t: Timers) -> None:
    """Wrap the engine's loop calls, the runner's execute and the model's forward."""

    def add_loop(dt: float) -> None:
        t.loop += dt

    for name in ("_reap", "_prepare", "_deliver"):
        setattr(eng, name, _timed(getattr(eng, name), add_loop))
    eng.policy.schedule = _timed(eng.policy.schedule, add_loop)  # type: ignore[method-assign]
    runner, lm = eng.runner, eng.lm
    assert runner is not None and lm is not None

    depth = [0]  # forward_sample calls forward: the outer call alone is timed

    def model_call(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if depth[0]:
                return fn(*args, **kwargs)
            depth[0] += 1
            t.steps += 1  # a model step (a multi-step batch makes several)
            c0, w0 = time.thread_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                t.model_cpu += time.thread_time() - c0
                t.model_wall += time.perf_counter() - w0

        return wrapper

    lm.forward = model_call(lm.forward)  # type: ignore[method-assign]
    if hasattr(lm, "forward_sample"):
        lm.forward_sample = model_call(lm.forward_sample)  # type: ignore[attr-defined]
    execute = runner.execute

    def timed_execute(*args: Any, **kwargs: Any) -> Any:
        c0, prof = time.thread_time(), t.step_prof
        if prof is not None:
            prof.enable()
        try:
            return execute(*args, **kwargs)
        finally:
            if prof is not None:
                prof.disable()
            t.execute_cpu += time.thread_time() - c0
            t.step_times.append(time.perf_counter())

    runner.execute = timed_execute  # type: ignore[method-assign]


async def run_load(
    eng: LLMEngine, streams: int, requests: int, lo: int, hi: int, tag: str, plen: int = 32
) -> tuple[int, float, float]:
    """(tokens, wall seconds, main-thread CPU seconds) of one load."""
    prompt = [1 + (7 * k) % 31000 for k in range(plen)]
    limit = trio.Semaphore(streams)
    n_tokens = 0

    async def one(k: int) -> None:
        nonlocal n_tokens
        n = lo + (hi - lo) * k // max(requests - 1, 1)
        p = SamplingParams(temperature=0.0, max_tokens=n)
        async with limit:
            req = GenerationRequest(f"{tag}-{k}", [*prompt[:-1], 1 + k % 31000], p, ignore_eos=True)
            async for ev in eng.submit(req):
                if isinstance(ev, TokenEvent):
                    n_tokens += 1

    c0, w0 = time.thread_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for k in range(requests):
            nursery.start_soon(one, k)
    return n_tokens, time.perf_counter() - w0, time.thread_time() - c0


def advance_and_peak(batch: Sequence[SeqChunk], n_vocab: int) -> list[int]:
    """Advance each chunk's cache past its tokens, as a step does; the token each of its
    rows would choose: one that depends on the position (greedy output that looks like
    text to the detokenizer, not one repeated id)."""
    peaks = []
    for c in batch:
        c.cache.reserve(c.cache.n + len(c.tokens))
        for r in c.rows():
            peaks.append(100 + (c.cache.n + r) * 7919 % (n_vocab - 200))
        c.cache.advance(len(c.tokens))
    return peaks


def fake_forward(lm: Any) -> None:
    """Make ``lm``'s step nearly free: no layers, each cache advanced past its chunk, and
    logits whose every row peaks at a token that depends on the position (greedy output
    that looks like text to the detokenizer, not one repeated id); ``forward_sample``
    (the numpy one: ``sample_batch`` on these logits) is kept."""
    n_vocab = lm.n_vocab
    pool = np.zeros((512, n_vocab), np.float32)
    last: list[int] = []

    def forward(batch: Sequence[SeqChunk]) -> npt.NDArray[np.float32]:
        peaks = advance_and_peak(batch, n_vocab)
        n = len(peaks)
        pool[np.arange(len(last)), last] = 0.0  # the last step's peaks (the rest stays 0)
        pool[np.arange(n), peaks] = 1.0
        last[:] = peaks
        return pool[:n]

    lm.forward = forward


def model_path(given: str | None, tmp: Path) -> Path:
    if given:
        return Path(given)
    from modelc.formats.ir import DType
    from tests.gen_cuda_models import Shape, write_random_llama

    shape = Shape(n_vocab=32000, d=64, n_layer=2, n_head=2, n_head_kv=1, ff=128, n_ctx=512)
    return write_random_llama(tmp / "tiny32k.gguf", DType.Q8_0, shape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--tokens", default="64,128")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device-sampling", default="on", choices=("on", "off"))
    ap.add_argument("--profile")
    ap.add_argument("--real-forward", action="store_true", help="the model's own layers")
    ap.add_argument("--device", default="cpu", help="as modelc run's (cuda: with --real-forward)")
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens a request")
    ap.add_argument("--scheduler-steps", type=int, default=1, help="as modelc run's")
    a = ap.parse_args()
    lo, hi = (int(x) for x in a.tokens.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        path = model_path(a.model, Path(tmp))
        opt = EngineOptions(
            max_concurrent=a.streams,
            max_context=256,
            speculative=False,
            device=a.device,
            threads=1,
            device_sampling=a.device_sampling,
            scheduler_steps=a.scheduler_steps,
        )
        eng = build_engine(path, opt)
    if not a.real_forward:
        fake_forward(eng.lm)
    t = Timers()
    instrument(eng, t)
    rows = []
    prof = cProfile.Profile() if a.profile else None

    async def session() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(eng.run)
            await run_load(eng, a.streams, a.streams, 8, 8, "warm")  # the first steps' setup
            for rep in range(a.reps):
                last = rep == a.reps - 1
                snap = (t.loop, t.execute_cpu, t.model_cpu, t.model_wall, t.steps)
                if prof is not None and last:
                    t.step_prof = cProfile.Profile()
                    prof.enable()
                n, wall, main_cpu = await run_load(
                    eng, a.streams, a.requests, lo, hi, f"r{rep}", a.prompt_len
                )
                if prof is not None and last:
                    prof.disable()
                    t.kept_prof, t.step_prof = t.step_prof, None
                steps = t.steps - snap[4]
                rows.append(
                    {
                        "steps/s": steps / wall,
                        "tok/s": n / wall,
                        "main µs/step": 1e6 * main_cpu / steps,
                        "main µs/tok": 1e6 * main_cpu / n,
                        "loop µs/step": 1e6 * (t.loop - snap[0]) / steps,
                        "step-thread µs/step": 1e6
                        * ((t.execute_cpu - snap[1]) - (t.model_cpu - snap[2]))
                        / steps,
                        "model µs/step": 1e6 * (t.model_cpu - snap[2]) / steps,
                        "model wall µs/step": 1e6 * (t.model_wall - snap[3]) / steps,
                        "tok/step": n / steps,
                    }
                )
            nursery.cancel_scope.cancel()

    trio.run(session)
    keys = list(rows[0])
    print("| rep | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for i, r in enumerate(rows):
        print(f"| {i + 1} | " + " | ".join(f"{r[k]:,.1f}" for k in keys) + " |")
    med = {k: statistics.median(r[k] for r in rows) for k in keys}
    print("| median | " + " | ".join(f"{med[k]:,.1f}" for k in keys) + " |")
    graphs = getattr(eng.lm, "graph_steps", None)  # a CUDA model: its steps replayed, eager
    if graphs is not None:
        print("CUDA steps: " + ", ".join(f"{k} {v}" for k, v in sorted(graphs.items())))
        # the shapes kept (rows, logit rows, attention tiles, f16 cache): how many a load
        # of this shape meets, each an eager step and a capture on a cold server
        keys = sorted(getattr(eng.lm, "_graphs", {}))
        print(f"CUDA graphs kept ({len(keys)}): " + " ".join(f"{k[0]}/{k[1]}/{k[2]}" for k in keys))
    if prof is not None:
        prof.dump_stats(a.profile)
        assert t.kept_prof is not None
        t.kept_prof.dump_stats(a.profile + ".step")


if __name__ == "__main__":
    main()
