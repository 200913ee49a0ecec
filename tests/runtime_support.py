"""Shared helpers for the runtime tests: golden files, backends, log-softmax, greedy loops."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelc.formats import load_model
from modelc.runtime.arch import build
from modelc.runtime.backend import Backend
from modelc.runtime.backends.numpy_ref import NumpyBackend
from modelc.runtime.kv_cache import KVCache
from modelc.runtime.model import ImageSpan, LanguageModel, SeqChunk
from modelc.runtime.sampling import Sampler, SamplingParams

GOLDEN = Path(__file__).parent / "golden"
# golden tolerance of the issue: top-10 next-token log-probabilities within 2e-3
LOGPROB_TOL = 2e-3


def golden(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN / name).read_text())
    return data


class CountedNumpy(NumpyBackend):
    """The numpy stand-in for a GPU, noting (by id) every weight it multiplies by."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[int] = set()

    def matmul(self, w: Any, x: Any, out: Any = None) -> Any:
        self.seen.add(id(w))
        return super().matmul(w, x, out)


def make_backend(name: str) -> Backend:
    """``numpy`` (reference twins) or ``cpu-exact`` (compiled kernels, f32 activations)."""
    if name == "numpy":
        return NumpyBackend()
    try:
        from modelc.runtime.backends.cpu import CpuBackend
    except ImportError as e:
        pytest.skip(f"compiled kernels not built ({e}); run pip install -e .")
    return CpuBackend(matmul="exact" if name == "cpu-exact" else "fast")


def log_softmax(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    z = x.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def prompt_logprob_error(
    model: LanguageModel, rec: dict[str, Any], cache: KVCache
) -> tuple[float, int]:
    """Max |logprob - golden| over the golden top-10 ids after the prompt; our top-1 id."""
    return _top_error(model.forward([SeqChunk(cache, rec["prompt_ids"])])[0], rec)


def _top_error(logits: np.ndarray[Any, Any], rec: dict[str, Any]) -> tuple[float, int]:
    """Max |logprob - golden| over the golden top-10 ids of ``logits`` (vocab,); top-1 id."""
    lp = log_softmax(logits)
    err = float(np.max(np.abs(lp[rec["top_ids"]] - np.asarray(rec["top_logprobs"]))))
    return err, int(np.argmax(logits))


def write_alike(caches: Sequence[KVCache], n0: int, n: int, rng: np.random.Generator) -> None:
    """The same random keys and values at positions ``n0`` .. ``n0 + n - 1`` of every layer
    of each of ``caches`` (room reserved first; each advanced by the caller)."""
    s = caches[0].shape
    for c in caches:
        c.reserve(n0 + n)
    for layer in range(s.n_layer):
        k, v = rng.standard_normal((2, n, s.n_head_kv, s.head_dim)).astype(np.float32)
        for c in caches:
            c.write(layer, n0, k, v)


def greedy(model: LanguageModel, cache: KVCache, first: int, n: int) -> list[int]:
    """``n`` greedy tokens starting with ``first`` (already chosen), prompt in ``cache``."""
    out = [first]
    while len(out) < n:
        out.append(int(np.argmax(model.forward([SeqChunk(cache, [out[-1]])])[0])))
    return out


def exact_lm(path: Path) -> LanguageModel:
    """The model file ``path`` on the ``cpu-exact`` backend (the goldens' mode)."""
    model = build(load_model(str(path)), make_backend("cpu-exact"))
    assert isinstance(model, LanguageModel)
    return model


def first_and_greedy(
    model: LanguageModel, ids: Sequence[int], n: int, images: tuple[ImageSpan, ...] = ()
) -> tuple[np.ndarray[Any, Any], list[int]]:
    """The log-probabilities after the prompt ``ids`` (its ``images`` placed) and ``n``
    greedy ids after it."""
    cache = model.new_cache(max_tokens=len(ids) + n + 1)
    logits = model.forward([SeqChunk(cache, ids, None, images)])
    lp = log_softmax(logits[-1])
    out: list[int] = []
    for _ in range(n):
        out.append(int(np.argmax(logits[-1])))
        logits = model.forward([SeqChunk(cache, [out[-1]], None, images)])
    return lp, out


def assert_greedy_as_golden(
    model: LanguageModel,
    ids: Sequence[int],
    want: dict[str, Any],
    images: tuple[ImageSpan, ...] = (),
    label: object = None,
) -> None:
    """``model`` after ``ids`` (``images`` placed) against a transformers golden ``want``:
    the first token's ``top_logprobs`` within 2e-3 and the ``greedy`` answer."""
    lp, out = first_and_greedy(model, ids, len(want["greedy"]), images)
    for tok, p in want["top_logprobs"]:
        assert abs(lp[tok] - p) < 2e-3, (label, tok, lp[tok], p)
    assert out == want["greedy"], label


def gpu_path(
    ir: Any,
    gpu: Any,
    ngl: int | str = "auto",
    *,
    fused_only: bool = False,
    n_cpu_moe: int = 0,
    max_concurrent: int = 1,
) -> Any:
    """The model ``--device cuda`` builds (:func:`~modelc.runtime.backends.cuda_offload.
    build_gpu`) with ``gpu`` making its op-level backend, the CPU's exact mode for the
    CPU's layers, an f32 KV cache at the model's context."""
    from modelc.runtime.backends.cuda_offload import build_gpu

    return build_gpu(
        ir,
        ngl,
        gpu,
        lambda: make_backend("cpu-exact"),
        kv_mode="f32",
        max_context=None,
        max_concurrent=max_concurrent,
        kv_budget_bytes=None,
        fused_only=fused_only,
        n_cpu_moe=n_cpu_moe,
    )


def same_as_reference(ref: Any, model: Any, prompt: list[int], n: int) -> float:
    """``model`` against ``ref`` (the CPU backend) after ``prompt`` (one prefill, f32
    caches): top-10 next-token log-probs within :data:`LOGPROB_TOL` and the same ``n``
    greedy tokens (the issue's bar); returns the log-prob error."""
    got = []
    for m in (ref, model):
        cache = m.new_cache("f32")
        lp = log_softmax(m.forward([SeqChunk(cache, prompt)])[0])
        got.append((lp, greedy(m, cache, int(np.argmax(lp)), n)))
        cache.free()
    (lp_ref, gen_ref), (lp, gen) = got
    top = np.argsort(lp_ref)[-10:]
    err = float(np.max(np.abs(lp[top] - lp_ref[top])))
    assert err <= LOGPROB_TOL, f"top-10 log-prob error {err:.2e}"
    assert gen == gen_ref, f"greedy continuations differ: {gen} vs {gen_ref}"
    return err


def check_record(
    model: LanguageModel, rec: dict[str, Any], mode: str = "f32"
) -> tuple[float, list[int]]:
    cache = model.new_cache(mode, hot_window=16)
    err, top1 = prompt_logprob_error(model, rec, cache)
    return err, greedy(model, cache, top1, len(rec["greedy"]))


def check_records(
    model: LanguageModel, recs: Sequence[dict[str, Any]], mode: str = "f32"
) -> list[tuple[float, list[int]]]:
    """:func:`check_record` of every record, the sequences fed together: one forward for
    every prompt, then one a greedy step for all. With the compiled kernels each row is
    computed as it is alone (test_runtime_llama's batched-equals-alone tests), so this
    gives the same answers in a fraction of the time (one pass over the weights a step
    instead of one per sequence); the numpy twins' rows move by BLAS's summation order
    only (SmolLM2: top-10 log-prob errors 3e-5, every greedy token the goldens')."""
    caches = [model.new_cache(mode, hot_window=16) for _ in recs]
    logits = model.forward(
        [SeqChunk(c, r["prompt_ids"]) for c, r in zip(caches, recs, strict=True)]
    )  # (n_recs, vocab)
    firsts = [_top_error(row, r) for row, r in zip(logits, recs, strict=True)]
    gens = [[top1] for _, top1 in firsts]
    n = max(len(r["greedy"]) for r in recs)
    for _ in range(n - 1):
        live = [j for j, r in enumerate(recs) if len(gens[j]) < len(r["greedy"])]
        logits = model.forward([SeqChunk(caches[j], [gens[j][-1]]) for j in live])
        for j, row in zip(live, logits, strict=True):
            gens[j].append(int(np.argmax(row)))
    return [(err, gen) for (err, _), gen in zip(firsts, gens, strict=True)]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
    """Index of the first differing token (len if equal)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def decode_alone(
    model: LanguageModel,
    cache: KVCache,
    prompt: Sequence[int],
    params: SamplingParams,
    stop_ids: Sequence[int] = (),
) -> list[int]:
    """A reference for the engine: the plain one-sequence loop (whole-prompt prefill, one
    forward per token, the same sampler), returning the ids generated before a stop id
    or ``params.max_tokens`` (default: until the cache is full)."""
    sampler = Sampler(params, model.n_vocab, prompt)
    limit = params.max_tokens if params.max_tokens is not None else cache.max_tokens - len(prompt)
    logits = model.forward([SeqChunk(cache, list(prompt))])[0]
    out: list[int] = []
    while len(out) < limit:
        s = sampler.sample(logits)
        sampler.accept(s.token)
        if s.token in stop_ids:
            break
        out.append(s.token)
        if len(out) < limit:
            logits = model.forward([SeqChunk(cache, [s.token])])[0]
    return out


def vision_engine(model: Path, mmproj: Path, prefill_chunk: int, block: int) -> Any:
    """An ``LLMEngine`` of ``model`` with the projector ``mmproj`` on ``cpu-exact`` (f32 KV
    cache, no speculation): prompts fed ``prefill_chunk`` tokens a step, the prefix cache
    in blocks of ``block`` tokens."""
    from modelc.engine import EngineOptions, build_engine

    opt = EngineOptions(prefill_chunk=prefill_chunk, prefix_block_tokens=block)
    opt.mmproj, opt.kv_cache, opt.speculative = str(mmproj), "f32", False
    return build_engine(model, opt, backend=make_backend("cpu-exact"))


async def engine_in_turn(eng: Any, requests: Sequence[Any]) -> list[tuple[list[int], int]]:
    """Each ``GenerationRequest`` submitted to ``eng`` (run for the while) once the one
    before has finished, so the prefix cache holds the earlier prompts: each one's token
    ids and cached prompt tokens."""
    import trio

    from modelc.engine.api import FinishEvent, TokenEvent

    got = []
    async with trio.open_nursery() as n:
        await n.start(eng.run)
        for req in requests:
            toks, cached = [], -1
            async for ev in eng.submit(req):
                if isinstance(ev, TokenEvent):
                    toks.append(ev.token_id)
                elif isinstance(ev, FinishEvent):
                    cached = ev.cached_tokens
            got.append((toks, cached))
        n.cancel_scope.cancel()
    return got


async def engine_events(eng: Any, requests: Sequence[Any]) -> Any:
    """Every ``GenerationRequest`` submitted at once to ``eng`` (an ``LLMEngine``, run for
    the while): each one's token events, in request order."""
    import trio

    from modelc.engine.api import TokenEvent

    out: dict[int, list[TokenEvent]] = {}
    async with trio.open_nursery() as n:
        await n.start(eng.run)

        async def one(i: int, req: Any) -> None:
            out[i] = [ev async for ev in eng.submit(req) if isinstance(ev, TokenEvent)]

        async with trio.open_nursery() as reqs:
            for i, req in enumerate(requests):
                reqs.start_soon(one, i, req)
        n.cancel_scope.cancel()
    return [out[i] for i in range(len(requests))]


def webgpu_backend() -> Any:
    """The WebGPU backend on this machine's adapter (lavapipe in CI), or a skip where there
    is none; under ``MODELC_REQUIRE_WEBGPU=1`` (CI) a missing adapter is an error."""
    import os

    from modelc.errors import UsageError
    from modelc.runtime.backends.webgpu import WebGPUBackend

    try:
        return WebGPUBackend()
    except UsageError as e:
        if os.environ.get("MODELC_REQUIRE_WEBGPU"):
            raise
        pytest.skip(f"no WebGPU adapter: {e}")
