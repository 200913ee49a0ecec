"""A model split by layers between two backends (``--n-gpu-layers``), against the whole
model on the CPU kernels in exact mode (the reference).

The numpy backend stands in for the GPU: the first layers run there, the rest on the CPU
kernels, the hidden state handed over each step.  Split on one backend the logits are the
whole model's bit for bit (the split itself adds nothing); split across the two they agree
within f32 rounding and greedy tokens are equal, also through the engine: batching,
chunked prefill, speculation's rollbacks, the prefix cache and context shifts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from modelc.engine import EngineOptions, LLMEngine, build_engine
from modelc.engine.api import FinishEvent, FinishReason, GenerationRequest, TokenEvent
from modelc.errors import UnsupportedError, UsageError, WindowError
from modelc.formats import load_model
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import build
from modelc.runtime.arch.decoder import Decoder
from modelc.runtime.backend import KVArray
from modelc.runtime.backends.cuda_offload import build_op_by_op
from modelc.runtime.backends.numpy_ref import NumpyBackend
from modelc.runtime.kv_cache import KVCache, KVShape
from modelc.runtime.model import SeqChunk
from modelc.runtime.sampling import SamplingParams
from modelc.runtime.split import SplitKVCache, SplitLM, split_decoder
from tests.assets import smollm2_gguf
from tests.gen_families import ensure_family
from tests.runtime_support import CountedNumpy, make_backend

FAMILIES = ["qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3"]
MODELS = ["smollm2", *FAMILIES]
_IRS: dict[str, ModelIR] = {}


def model_ir(name: str) -> ModelIR:
    if name not in _IRS:
        path = smollm2_gguf() if name == "smollm2" else ensure_family(name)[1]
        _IRS[name] = load_model(path)
    return _IRS[name]


def whole(ir: ModelIR) -> Decoder:
    model = build(ir, make_backend("cpu-exact"))
    assert isinstance(model, Decoder)
    return model


def split(ir: ModelIR, n_first: int, first: str = "numpy", head_first: bool = False) -> SplitLM:
    be = make_backend(first)
    return split_decoder(ir, n_first, be, make_backend("cpu-exact"), head_first=head_first)


def steps(model: Any, prompts: list[list[int]], n_decode: int) -> tuple[list[Any], list[int]]:
    """Two sequences: both prompts in one step (every row's logits of the second), then
    ``n_decode`` batched greedy steps; every step's logits and the tokens chosen."""
    caches = [model.new_cache("f32") for _ in prompts]
    rows = tuple(range(len(prompts[1])))
    out = [model.forward([SeqChunk(caches[0], prompts[0]), SeqChunk(caches[1], prompts[1], rows)])]
    toks = [int(out[0][0].argmax()), int(out[0][-1].argmax())]
    chosen = toks + decode(model, caches, toks, n_decode, out)
    assert all(c.n == len(p) + n_decode for c, p in zip(caches, prompts, strict=True))
    return out, chosen


def decode(model: Any, caches: list[KVCache], toks: list[int], n: int, out: list[Any]) -> list[int]:
    """``n`` batched greedy steps from ``toks``, one a sequence, their logits appended to
    ``out``; the tokens chosen."""
    chosen = []
    for _ in range(n):
        logits = model.forward([SeqChunk(c, [t]) for c, t in zip(caches, toks, strict=True)])
        out.append(logits)
        toks = [int(r.argmax()) for r in logits]
        chosen += toks
    return chosen


@pytest.mark.parametrize("name", [*MODELS, "qwen3moe", "mixtral"])
def test_split_forward_equals_the_whole_model(name: str) -> None:
    ir = model_ir(name)
    n = ir.hparams.n_layer
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 300, k).tolist() for k in (11, 6)]
    ref, ref_tokens = steps(whole(ir), prompts, 6)
    for k in sorted({1, n // 2, n - 1}):
        same, _ = steps(split(ir, k, "cpu-exact"), prompts, 6)
        for a, b in zip(same, ref, strict=True):
            np.testing.assert_array_equal(a, b)
        across, tokens = steps(split(ir, k), prompts, 6)
        for a, b in zip(across, ref, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * float(np.abs(b).max()))
        assert tokens == ref_tokens, (name, k)


def test_split_cache_is_one_cache_of_every_layer() -> None:
    """Against one cache of every layer, written alike: windowed layers bounded (rows
    dropped, truncation refused past them), rows read back, a shift, a prefix-cache fill."""
    shape, wins = KVShape(6, 2, 32), (8, 0, 8, 8, 0, 8)
    ref = KVCache(shape, 1000, "f16", windows=wins)
    parts = [
        KVCache(KVShape(n, 2, 32), 1000, "f16", windows=w)
        for n, w in ((2, wins[:2]), (4, wins[2:]))
    ]
    cache = SplitKVCache(parts)
    assert cache.shape == shape and cache.bounded == ref.bounded and cache.dtype == np.float16
    rng = np.random.default_rng(2)
    for step in (300, 1, 200, 7):  # a windowed layer drops rows once past 8 + 64 + 256
        for c in (ref, cache):
            c.reserve(c.n + step)
        for layer in range(6):
            k, v = (rng.standard_normal((step, 2, 32)).astype(np.float32) for _ in "kv")
            for c in (ref, cache):
                c.write(layer, c.n, k, v)
        for c in (ref, cache):
            c.advance(step)
    assert cache.n == ref.n == 508 and cache.nbytes == ref.nbytes
    assert cache.nbytes_at(900) == ref.nbytes_at(900)
    for layer in range(6):
        assert cache.held_from(layer) == ref.held_from(layer)
        for a, b in zip(cache.read(layer, 508), ref.read(layer, 508), strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(WindowError):  # no part changes
        cache.truncate(100)
    assert [p.n for p in parts] == [508, 508]
    cache.truncate(505)
    ref.truncate(505)
    assert cache.max_discard(4) == ref.max_discard(4) > 0
    with pytest.raises(WindowError):
        cache.shift(4, ref.max_discard(4) + 1)
    cache.shift(4, 100)
    ref.shift(4, 100)
    for layer in range(6):
        for x, y in zip(cache.read(layer, ref.n), ref.read(layer, ref.n), strict=True):
            np.testing.assert_array_equal(x, y)

    def rows(layer: int, first: int) -> tuple[KVArray, KVArray]:  # as the prefix cache's
        k, v = ref.read(layer, ref.n)
        skip = first - ref.held_from(layer)
        return k[skip:], v[skip:]

    fresh = SplitKVCache([KVCache(p.shape, 1000, "f16", windows=p.bounded) for p in parts])
    fresh_ref = KVCache(shape, 1000, "f16", windows=wins)
    fresh.fill(ref.n, rows)
    fresh_ref.fill(ref.n, rows)
    for layer in range(6):
        assert fresh.held_from(layer) == fresh_ref.held_from(layer)
        for x, y in zip(fresh.read(layer, ref.n), fresh_ref.read(layer, ref.n), strict=True):
            np.testing.assert_array_equal(x, y)
    cache.free()
    assert cache.nbytes == 0


def test_split_refusals() -> None:
    ir = model_ir("qwen3")
    with pytest.raises(UsageError, match=r"layers 0\.\.3 of 3"):
        split(ir, 4)
    part = Decoder(ir, make_backend("numpy"))
    part.keep_layers(1, 3)
    with pytest.raises(UsageError, match="do not chain"):
        SplitLM([part])
    with pytest.raises(UsageError, match="hidden state"):
        part.forward_part([SeqChunk(part.new_cache(), [1])], None)
    lm = split(ir, 1)
    with pytest.raises(UnsupportedError, match="its own new_cache"):
        lm.forward([SeqChunk(whole(ir).new_cache(), [1])])


def test_split_phi3_keeps_to_its_original_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts cannot recompute a sequence with LongRoPE's long factors (the whole model does
    past its original context): a split Phi-3 with long factors stops there, as on the GPU."""
    from tests import gen_families as gf

    short = gf.PHI3_SHORT
    rope = {"type": "longrope", "short_factor": short, "long_factor": [2 * f for f in short]}
    monkeypatch.setitem(gf.CONFIGS, "phi3", {**gf.CONFIGS["phi3"], "rope_scaling": rope})
    gf.write_gguf("phi3", gf.make_weights("phi3"), tmp_path / "phi3.gguf")
    ir = load_model(tmp_path / "phi3.gguf")
    after = whole(ir).spec.long_rope_after
    assert 0 < after < whole(ir).n_ctx and split(ir, 1).n_ctx == after
    prompt = list(range(3, 3 + after - 8))
    ref, _ = steps(whole(ir), [prompt, prompt[:5]], 4)
    got, _ = steps(split(ir, 2, "cpu-exact"), [prompt, prompt[:5]], 4)
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_array_equal(a, b)


# -- the output head on the first part (the GPU's, in --n-gpu-layers) --------------------
def head_steps(model: Any, prompts: list[list[int]], n_decode: int) -> tuple[list[Any], list[int]]:
    """Three sequences in prompt chunks, logits wanted of some rows of some sequences only
    (none at all in the first step), then ``n_decode`` batched greedy steps of all three;
    every step's logits and the tokens chosen."""
    a, b, c = prompts
    caches = [model.new_cache("f32") for _ in prompts]
    out = [model.forward([SeqChunk(caches[0], a[:4], ())])]  # a chunk before its last
    out.append(
        model.forward(
            [
                SeqChunk(caches[0], a[4:], (0, len(a) - 5)),  # a middle row and the last
                SeqChunk(caches[1], b[:3], ()),
                SeqChunk(caches[2], c),  # its last row
            ]
        )
    )
    toks = [int(out[1][1].argmax()), -1, int(out[1][2].argmax())]
    out.append(
        model.forward(
            [
                SeqChunk(caches[1], b[3:], tuple(range(len(b) - 3))),  # every row
                SeqChunk(caches[0], [toks[0]], ()),  # a decode row nobody samples
            ]
        )
    )
    toks[0], toks[1] = 11, int(out[2][-1].argmax())
    return out, toks + decode(model, caches, toks, n_decode, out)


def close(got: list[Any], want: list[Any]) -> None:
    """Each step's logits within f32 rounding of the reference's (as the split tests')."""
    for x, y in zip(got, want, strict=True):
        assert x.shape == y.shape
        if y.size:
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-4 * float(np.abs(y).max()))


# untied heads, then tied ones (gemma2: soft-capped logits; smollm2: a Q8_0 table)
@pytest.mark.parametrize("name", ["qwen2", "phi3", "mixtral", "qwen3", "gemma2", "smollm2"])
def test_split_with_the_head_on_the_first_part(name: str) -> None:
    """GPU layers, CPU layers, GPU head: the logits are the whole model's (bit for bit on
    one backend, within f32 rounding across two), the first part's backend multiplies by
    the head and the last part gives only the wanted rows' hidden state."""
    ir = model_ir(name)
    n, vocab = ir.hparams.n_layer, whole(ir).n_vocab
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 300, k).tolist() for k in (9, 7, 5)]
    ref, ref_tokens = head_steps(whole(ir), prompts, 4)
    assert [r.shape[0] for r in ref[:3]] == [0, 3, 4]
    for k in sorted({1, n // 2, n - 1}):
        same, _ = head_steps(split(ir, k, "cpu-exact", head_first=True), prompts, 4)
        for x, y in zip(same, ref, strict=True):
            np.testing.assert_array_equal(x, y)
        gpu = CountedNumpy()
        lm = split_decoder(ir, k, gpu, make_backend("cpu-exact"), head_first=True)
        a, b = lm.parts
        assert isinstance(a, Decoder) and isinstance(b, Decoder)
        assert lm.head is a and a.head and not b.head and lm.n_vocab == vocab
        across, tokens = head_steps(lm, prompts, 4)
        close(across, ref)
        assert tokens == ref_tokens, (name, k)
        assert id(a.output) in gpu.seen, "the first part never multiplied by the head"
        cache = b.new_cache("f32")  # the last part alone: the wanted rows' hidden state
        hidden = b.forward_part([SeqChunk(cache, [5, 6, 7], (0, 2))], np.ones((3, b.d), np.float32))
        assert hidden.shape == (2, b.d)


def test_offload_head_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--n-gpu-layers``' split holds the head on its GPU part; ``MODELC_OFFLOAD_HEAD=last``
    keeps it with the last layer (llama.cpp's placement), the logits the same; a split
    needs one part with the head."""
    ir = model_ir("qwen2")
    ref, ref_tokens = head_steps(whole(ir), [[5, 6, 7, 8, 9], [3, 4, 5, 6], [7, 8]], 3)

    def offload() -> SplitLM:
        lm = build_op_by_op(ir, 1, NumpyBackend, lambda: make_backend("cpu-exact"))
        assert isinstance(lm, SplitLM)
        got, tokens = head_steps(lm, [[5, 6, 7, 8, 9], [3, 4, 5, 6], [7, 8]], 3)
        close(got, ref)
        assert tokens == ref_tokens
        return lm

    lm = offload()
    assert lm.head is lm.parts[0] and [p.head for p in lm.parts] == [True, False]
    monkeypatch.setenv("MODELC_OFFLOAD_HEAD", "last")
    lm = offload()
    assert lm.head is lm.parts[-1] and [p.head for p in lm.parts] == [False, True]
    monkeypatch.setenv("MODELC_OFFLOAD_HEAD", "gpu")
    with pytest.raises(UsageError, match="MODELC_OFFLOAD_HEAD=gpu: use first"):
        offload()
    a, b = Decoder(ir, NumpyBackend()), Decoder(ir, NumpyBackend())
    a.keep_layers(0, 1, head=True)
    b.keep_layers(1, ir.hparams.n_layer)
    with pytest.raises(UsageError, match="one part with the head, not 2"):
        SplitLM([a, b])


# -- through the engine ------------------------------------------------------------------
@asynccontextmanager
async def running(eng: LLMEngine) -> AsyncIterator[LLMEngine]:
    async with trio.open_nursery() as n:
        await n.start(eng.run)
        yield eng
        n.cancel_scope.cancel()


async def collect(handle: Any) -> tuple[list[int], FinishEvent]:
    toks, fin = [], None
    async for ev in handle:
        if isinstance(ev, TokenEvent):
            toks.append(ev.token_id)
        else:
            fin = ev
    assert fin is not None
    return toks, fin


async def serve(eng: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[Any]:
    """The first prompt alone, then the others at once (their shared prefix cached)."""
    p = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    got: dict[int, tuple[list[int], FinishEvent]] = {}
    async with running(eng):

        async def one(i: int) -> None:
            got[i] = await collect(
                eng.submit(GenerationRequest(f"r{i}", prompts[i], p, ignore_eos=True))
            )

        await one(0)
        async with trio.open_nursery() as n:
            for i in range(1, len(prompts)):
                n.start_soon(one, i)
    return [got[i] for i in range(len(prompts))]


@pytest.mark.parametrize("name", ["smollm2", "qwen3", "gemma3", "phi3"])
async def test_engine_split_equals_whole(name: str) -> None:
    """Batched, chunked, speculating (drafts rolled back), prefix-cached and, with a short
    context, shifting: the split model's greedy tokens are the whole model's."""
    ir = model_ir(name)
    k = ir.hparams.n_layer // 2
    rng = np.random.default_rng(1)
    shared = rng.integers(3, 300, 13).tolist()
    prompts = [shared + rng.integers(3, 300, m).tolist() for m in (3, 1, 6, 2)]
    prompts[2] += prompts[2][-4:] * 2  # prompt lookup finds drafts here
    opts: dict[str, Any] = dict(
        device="cpu",
        kv_cache="f32",
        prefill_chunk=5,
        step_tokens=16,
        prefix_block_tokens=4,
        spec_adaptive=False,
        spec_max_running=8,
        spec_min_prompt=0,
    )
    ref = build_engine(ir, EngineOptions(**opts), backend=make_backend("cpu-exact"))
    eng = build_engine(ir, EngineOptions(**opts), runtime_factory=lambda ir, be: split(ir, k))
    assert isinstance(eng.lm, SplitLM)
    want, got = await serve(ref, prompts, 10), await serve(eng, prompts, 10)
    assert [t for t, _ in got] == [t for t, _ in want]
    assert all(f.cached_tokens == 12 for _, f in got[1:])
    shift = dict(opts, max_context=24, context_shift=True, anchor_tokens=4)
    ref = build_engine(ir, EngineOptions(**shift), backend=make_backend("cpu-exact"))
    eng = build_engine(ir, EngineOptions(**shift), runtime_factory=lambda ir, be: split(ir, k))
    want, got = await serve(ref, prompts[:2], 30), await serve(eng, prompts[:2], 30)
    assert [t for t, _ in got] == [t for t, _ in want]
    assert all(len(t) == 30 and f.reason is FinishReason.LENGTH for t, f in got)
