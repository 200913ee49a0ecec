"""Sliding-window KV caches: a windowed layer keeps only its window (plus slack), and
everything that reads or moves a cache gives what a full cache gives.

The tiny random Mistral (window 8), Gemma 2 (4; layers 0 and 2) and Gemma 3 (4; layers
0-4) of ``tests/gen_families.py``, Gemma 4 (4; layers 0 and 2, read by 2 and 3 too) of
``tests/gen_gemma4.py`` and Llama 4 (chunks of 8 on layers 0-2, bounded as windows of 8) of
``tests/gen_llama4.py`` run with small ``window_slack`` / ``window_keep`` so
that a couple of hundred tokens move the rows many times; every logit is compared with
the same model over a full cache (``full=True``), bitwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import trio

from modelc.engine import EngineOptions, build_engine
from modelc.engine.api import FinishEvent, GenerationRequest
from modelc.engine.prefix_cache import PrefixCache
from modelc.errors import WindowError
from modelc.formats import load_model
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import build
from modelc.runtime.kv_cache import WINDOW_KEEP, WINDOW_SLACK, KVBudget, KVCache, KVShape
from modelc.runtime.model import CausalLM, SeqChunk
from modelc.runtime.sampling import SamplingParams
from tests.gen_families import ensure_family
from tests.gen_gemma4 import ensure_gemma4
from tests.gen_llama4 import ensure_model as ensure_llama4
from tests.runtime_support import make_backend

# gemma4: windowed layers of another head size than the global ones, KV-sharing layers
# reading them (tests/gen_gemma4.py)
FAMILIES = ["mistral", "gemma2", "gemma3", "gemma4", "llama4"]
SLACK, KEEP = 5, 3


def model(family: str) -> CausalLM:
    if family == "llama4":  # chunks of 8 (the GGUF's are 8192) in a context of 256
        ir = load_model(ensure_llama4()[1])
        ir.hparams.attn_chunk, ir.hparams.n_ctx = 8, 256
        m = build(ir, make_backend("cpu-exact"))
    else:
        gguf = ensure_gemma4()[1] if family == "gemma4" else ensure_family(family)[1]
        m = build(load_model(gguf), make_backend("cpu-exact"))
    assert isinstance(m, CausalLM) and any(m.kv_windows)
    return m


def windowed(m: CausalLM, mode: str, slack: int = SLACK, keep: int = KEEP) -> KVCache:
    return KVCache(
        m.kv_shape, m.n_ctx, mode, windows=m.kv_windows, window_slack=slack, window_keep=keep
    )


def step(m: CausalLM, caches: Sequence[KVCache], toks: Sequence[int]) -> list[np.ndarray]:
    """Feed ``toks`` to every cache in one batch; each cache's logits (len(toks), vocab)."""
    rows = tuple(range(len(toks)))
    out = m.forward([SeqChunk(c, list(toks), rows) for c in caches])
    return [out[i * len(toks) : (i + 1) * len(toks)] for i in range(len(caches))]


def held_rows(c: KVCache, layer: int) -> int:
    return c.rows(layer)


@pytest.mark.parametrize("mode", ["f32", "f16", "int8", "mixed"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_logits_match_the_full_cache(family: str, mode: str) -> None:
    """Prefill chunks (one longer than the slack), decode steps and speculative-style
    rollbacks, the windowed and the full cache in one batch: identical logits."""
    m = model(family)
    full, win = m.new_cache(mode, full=True), windowed(m, mode)
    assert win.bounded == m.kv_windows and not any(full.bounded)
    rng = np.random.default_rng(1)
    a, b = step(m, [full, win], list(range(3, 20)))  # prefill 17 tokens
    np.testing.assert_array_equal(a, b)
    moves, n_base = 0, 0
    while full.n < m.n_ctx - 12:
        t = int(np.argmax(a[-1]))
        if full.n == 120:  # a chunk longer than window + keep + slack
            toks = [t, *rng.integers(3, m.n_vocab, 11).tolist()]
        elif full.n % 7 == 0:  # a draft of 3, then keep the known token and one more
            toks = [t, *rng.integers(3, m.n_vocab, 3).tolist()]
        else:
            toks = [t]
        n0 = full.n
        a, b = step(m, [full, win], toks)
        np.testing.assert_array_equal(a, b)
        if len(toks) == 4:
            full.truncate(n0 + 2)
            win.truncate(n0 + 2)
            a, b = a[:2], b[:2]
        bases = [win.held_from(li) for li in range(len(m.kv_windows))]
        moves += bases[0] != n_base
        n_base = bases[0]
        for li, w in enumerate(m.kv_windows):
            if w:
                assert 0 < held_rows(win, li) <= max(w + KEEP + SLACK, w - 1 + KEEP + 12)
                assert bases[li] == 0 or bases[li] <= win.n - w + 1 - KEEP
            else:
                assert bases[li] == 0 and held_rows(win, li) >= win.n
    assert moves > 20  # rows were moved to the front many times
    assert win.nbytes < full.nbytes


@pytest.mark.parametrize("family", FAMILIES)
def test_rollback_past_the_kept_rows_is_a_typed_error(family: str) -> None:
    m = model(family)
    c = windowed(m, "f32")
    step(m, [c], list(range(3, 43)))
    for t in range(40):
        step(m, [c], [t + 3])
    w = max(m.kv_windows)
    base = max(c.held_from(li) for li in range(len(m.kv_windows)))
    assert base > 0
    n = c.n
    with pytest.raises(WindowError):
        c.truncate(base + w - 2)  # its query would need the row before base
    assert c.n == n
    c.truncate(base + w - 1)  # the first position still fully visible
    assert c.n == base + w - 1


@pytest.mark.parametrize("mode", ["f32", "f16", "int8", "mixed"])
@pytest.mark.parametrize("family", FAMILIES)
def test_context_shift_matches_the_full_cache(family: str, mode: str) -> None:
    """Shifts as the engine does them, at and beyond max_discard, then more decoding."""
    m = model(family)
    full, win = m.new_cache(mode, full=True), windowed(m, mode)
    a, _ = step(m, [full, win], list(range(3, 30)))
    for _round in range(3):
        for _ in range(40):
            t = int(np.argmax(a[-1]))
            a, b = step(m, [full, win], [t])
            np.testing.assert_array_equal(a, b)
        keep = 4
        most = win.max_discard(keep)
        assert 0 < most <= full.max_discard(keep) == full.n - keep
        if most < full.n - keep:
            with pytest.raises(WindowError):
                win.shift(keep, most + 1)
        discard = min(most, (full.n - keep) // 2)
        m.shift_context(full, keep, discard)
        m.shift_context(win, keep, discard)
        assert full.n == win.n
    # the boundary: a window that reaches back into the anchors exactly as far as held
    c2 = windowed(m, mode)
    f2 = m.new_cache(mode, full=True)
    a, _ = step(m, [f2, c2], list(range(3, 60)))
    keep = 12
    most = c2.max_discard(keep)
    m.shift_context(f2, keep, most)
    m.shift_context(c2, keep, most)
    for _ in range(10):
        t = int(np.argmax(a[-1]))
        a, b = step(m, [f2, c2], [t])
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode", ["f16", "int8", "mixed"])
def test_memory_is_bounded_for_windowed_layers_only(mode: str) -> None:
    """A Gemma-3-shaped cache (5 windowed layers of 1024 to 1 global) at 8k tokens, fed in
    256-token chunks then single tokens; bytes against the budget and nbytes_at (int8 and
    mixed: their scratch and rings included), and what the windows see."""
    shape = KVShape(n_layer=6, n_head_kv=1, head_dim=16)
    wins = (1024,) * 5 + (0,)
    budget = KVBudget(1 << 30)
    c = KVCache(shape, 8192, mode, windows=wins, budget=budget)
    full = KVCache(shape, 8192, mode)
    rng = np.random.default_rng(0)
    row_bytes = 2 * 16 * 2  # K and V, one head of 16, f16
    limit = 1024 + WINDOW_KEEP + WINDOW_SLACK
    n = 0
    while n < 8192:
        m = 256 if n < 4096 else 1
        kv = rng.standard_normal((m, 1, 16)).astype(np.float32)
        for cache in (c, full):
            cache.reserve(n + m)
            for li in range(6):
                cache.write(li, n, kv + li, -kv)
            cache.advance(m)
        n += m
        assert budget.used == c.nbytes <= c.nbytes_at(n, 256)
        for li in range(5 if mode == "f16" or n % 64 == 0 else 0):  # (dequantizing is slow)
            # what a query at n sees is what the full cache holds
            got = c.read(li, n)[0][-1023:]
            np.testing.assert_array_equal(got, full.read(li, n)[0][-1023:])
    assert c.nbytes == c.nbytes_at(8192, 1)
    if mode == "f16":
        assert c.nbytes == (5 * limit + 8192) * row_bytes
        assert full.nbytes == 6 * 8192 * row_bytes
    per_row = shape.bytes_per_token(c.mode) // 6
    assert full.nbytes - c.nbytes == 5 * (8192 - limit) * per_row  # the scratch is the same
    c.free()
    assert budget.used == 0


@pytest.mark.parametrize("mode", ["f32", "f16"])
def test_prefix_blocks_from_a_windowed_cache(mode: str) -> None:
    """Blocks copied out of a windowed cache lack its oldest rows; the longest run whose
    windows are held loads into a fresh windowed cache and continues exactly as the full
    cache; a full cache's insert fills the gaps so shorter prefixes load too."""
    m = model("gemma3")
    bt = 8
    win = windowed(m, mode, keep=bt)
    full = m.new_cache(mode, full=True)
    toks = list(range(3, 40))
    a, _ = step(m, [full, win], toks)
    while len(toks) < 150:
        toks.append(int(np.argmax(a[-1])))
        a, _ = step(m, [full, win], [toks[-1]])
    assert win.held_from(0) > 100
    pc = PrefixCache(m.kv_shape, 1 << 24, block_tokens=bt)
    assert pc.insert(toks, win) == len(toks) // bt
    blocks = list(pc.blocks.values())
    assert any(b.gaps for b in blocks) and all(5 not in b.gaps for b in blocks)
    nxt = [*toks, 7, 8, 9]
    got = pc.match(nxt)
    assert len(got) == len(toks) // bt  # the whole run: its windows are held
    fresh, ref = windowed(m, mode, keep=bt), m.new_cache(mode, full=True)
    n = pc.load(got, fresh)
    pc.release(got)
    step(m, [ref], nxt[:n])
    x, y = step(m, [ref, fresh], nxt[n:])
    np.testing.assert_array_equal(x, y)
    assert fresh.nbytes < ref.nbytes
    short = toks[:40]
    assert pc.match(short) == []  # those blocks lack the windowed rows
    pc.insert(toks, full)  # fills every gap
    assert not any(b.gaps for b in pc.blocks.values())
    got = pc.match(short)
    assert len(got) == (len(short) - 1) // bt
    fresh = windowed(m, mode, keep=bt)
    n = pc.load(got, fresh)
    ref = m.new_cache(mode, full=True)
    step(m, [ref], short[:n])
    x, y = step(m, [ref, fresh], [*short[n:], 5, 6])
    np.testing.assert_array_equal(x, y)


async def _serve(
    ir: ModelIR, m: CausalLM, reqs: list[tuple[list[int], int]], **kw: Any
) -> tuple[list[list[int]], list[FinishEvent], int]:
    """Each request's greedy tokens and finish event, and the most KV bytes held."""
    eng = build_engine(ir, EngineOptions(kv_cache="f16", **kw), runtime_factory=lambda *_: m)
    outs: list[list[int]] = []
    fins: list[FinishEvent] = []
    peak = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(eng.run)
        for i, (prompt, n) in enumerate(reqs):
            p = SamplingParams(temperature=0, max_tokens=n)
            toks: list[int] = []
            async for ev in eng.submit(GenerationRequest(f"r{i}", prompt, p, ignore_eos=True)):
                peak = max(peak, eng.kv_budget.used)
                if isinstance(ev, FinishEvent):
                    fins.append(ev)
                else:
                    toks.append(ev.token_id)
            outs.append(toks)
        nursery.cancel_scope.cancel()
    assert eng.kv_budget.used == 0
    return outs, fins, peak


@pytest.mark.parametrize(
    "family", ["gemma3", "mistral", pytest.param("llama4", marks=pytest.mark.slow)]
)
async def test_engine_generates_what_the_full_cache_generates(family: str) -> None:
    """The engine with the default slack on a 1024-token context (windowed caches), with
    speculation, prefix reuse of a previous turn and context shifts, against the same model
    with full caches (its windows still mask, only storage differs)."""
    ir = load_model(ensure_llama4()[1] if family == "llama4" else ensure_family(family)[1])
    ir.hparams.n_ctx = 1024  # RoPE: any length runs; the windows then bound storage
    if family == "llama4":  # chunks of 8 (its own are 8192)
        ir.hparams.attn_chunk = 8
    m = build(ir, make_backend("cpu-exact"))
    ref = build(ir, make_backend("cpu-exact"))
    assert isinstance(m, CausalLM) and isinstance(ref, CausalLM)
    ref.kv_windows = ()
    assert m.new_cache("f16").bounded == m.kv_windows
    prompt = [3 + (i * 7) % 50 for i in range(40)]
    kw: dict[str, Any] = dict(spec_min_prompt=0, spec_adaptive=False, prefix_block_tokens=32)
    want, _, _ = await _serve(ir, ref, [(prompt, 700)], **kw)
    turn2 = [*prompt, *want[0][:-1], 11, 12, 13]
    got, fins, peak = await _serve(ir, m, [(prompt, 700), (turn2, 40)], **kw)
    want2, _, ref_peak = await _serve(ir, ref, [(prompt, 700), (turn2, 40)], **kw)
    assert got == want2 and got[0] == want[0]
    assert fins[0].spec_drafted > 0 and fins[1].cached_tokens > 700  # the answer's KV too
    assert peak < ref_peak / 2
    shift: dict[str, Any] = dict(max_context=400, context_shift=True, speculative=False)
    got, fins, _ = await _serve(ir, m, [(prompt, 900)], **shift)
    want, _, _ = await _serve(ir, ref, [(prompt, 900)], **shift)
    assert got == want and len(got[0]) == 900


async def test_swa_full_keeps_every_position() -> None:
    """``swa_full`` (``modelc run --swa-full``, llama.cpp's flag): a windowed model's
    caches keep every position, so the engine holds as much KV as the same model without
    windows (more than twice the windowed caches' peak) and generates the same tokens."""
    ir = load_model(ensure_family("mistral")[1])
    ir.hparams.n_ctx = 1024
    m = build(ir, make_backend("cpu-exact"))
    ref = build(ir, make_backend("cpu-exact"))
    assert isinstance(m, CausalLM) and isinstance(ref, CausalLM)
    ref.kv_windows = ()
    prompt = [3 + (i * 5) % 50 for i in range(40)]
    kw: dict[str, Any] = dict(speculative=False)
    got, _, peak = await _serve(ir, m, [(prompt, 700)], swa_full=True, **kw)
    want, _, ref_peak = await _serve(ir, ref, [(prompt, 700)], **kw)
    _, _, win_peak = await _serve(ir, m, [(prompt, 700)], **kw)
    assert got == want
    assert peak == ref_peak > 2 * win_peak


def test_mixed_dtype_batches_and_quantized_modes() -> None:
    """A batch of f32 and f16 caches takes the write/read/attention_batch path: a windowed
    cache there reads from its base, as a full one from 0.  int8 and mixed caches are
    windowed too (test_greedy_logits_match_the_full_cache runs them)."""
    m = model("gemma3")
    win, full = windowed(m, "f32"), m.new_cache("f32", full=True)
    other_a, other_b = m.new_cache("f16", full=True), m.new_cache("f16", full=True)
    a, _ = step(m, [full, other_a], list(range(3, 20)))
    b, _ = step(m, [win, other_b], list(range(3, 20)))
    np.testing.assert_array_equal(a, b)
    for _ in range(60):
        t = int(np.argmax(a[-1]))
        a, _ = step(m, [full, other_a], [t])
        b, _ = step(m, [win, other_b], [t])
        np.testing.assert_array_equal(a, b)
    assert win.held_from(0) > 0
    for mode in ("int8", "mixed"):
        c = windowed(m, mode)
        assert c.windows == c.bounded == m.kv_windows
