"""Checks every recurrent family (Qwen3.5 / Qwen3-Next's Gated DeltaNet, LFM2's short
convolutions) is held to: its per-sequence state through the engine (continuous batching,
a cancelled neighbour, prefix-cache hits, speculative rollback), its checkpoints, and a
prefix-cache hit starting from the state kept with a block.  Each test module calls them
on its own tiny model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import trio

from modelc.engine import EngineOptions, LLMEngine, build_engine
from modelc.engine.api import FinishEvent, FinishReason, GenerationRequest, TokenEvent
from modelc.errors import UsageError
from modelc.formats.ir import ModelIR
from modelc.runtime.model import LanguageModel, SeqChunk
from modelc.runtime.sampling import SamplingParams
from tests.runtime_support import decode_alone, make_backend

PROMPTS = [
    [5, 17, 200, 31, 99],
    [300, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
    list(range(100, 140)),
    [42] * 20,
]


def make(ir: ModelIR, **kw: Any) -> LLMEngine:
    return build_engine(ir, EngineOptions(kv_cache="f32", **kw), backend=make_backend("cpu"))


def alone(eng: LLMEngine, prompt: list[int], n: int) -> list[int]:
    """The one-at-a-time greedy tokens, the end-of-generation ids banned as the engine
    bans them for ``ignore_eos``."""
    assert eng.lm is not None
    eog = sorted(eng.prompt.eog_ids) if eng.prompt is not None else []
    p = SamplingParams(temperature=0, max_tokens=n, banned_token_ids=eog)
    return decode_alone(eng.lm, eng.lm.new_cache("f32"), prompt, p, [])


async def collect(handle: Any) -> tuple[list[int], FinishEvent]:
    toks, fin = [], None
    async for ev in handle:
        if isinstance(ev, TokenEvent):
            toks.append(ev.token_id)
        else:
            fin = ev
    assert fin is not None
    return toks, fin


ENGINE_CHECK = dict(
    speculative=True, spec_adaptive=False, spec_min_prompt=0, spec_gamma=4, prefix_block_tokens=4
)


async def check_engine_equal_alone(ir: ModelIR, eng: LLMEngine | None = None) -> None:
    """Issue 34's must-show 2: each sequence's greedy tokens through continuous batching
    with other requests (one joining late, one cancelled mid-way), prefix-cache hits (the
    same prompt again, and the next turn: prompt + answer + more, each starting from the
    state checkpoint kept with the block it ends on) and speculative drafts rolled back,
    equal the one-at-a-time ones.  ``eng``: an engine of ``ir`` built with
    :data:`ENGINE_CHECK` and an f32 cache on another device (default: the CPU's)."""
    n = 24
    eng = eng if eng is not None else make(ir, **ENGINE_CHECK)
    expected = [alone(eng, p, n) for p in PROMPTS]
    p = SamplingParams(temperature=0, max_tokens=n)
    async with trio.open_nursery() as nursery:
        await nursery.start(eng.run)

        results: dict[str, list[int]] = {}

        async def run(i: int, rid: str, delay: float = 0.0) -> None:
            await trio.sleep(delay)
            req = GenerationRequest(rid, PROMPTS[i], p, ignore_eos=True)
            toks, _ = await collect(eng.submit(req))
            results[rid] = toks

        async def victim() -> None:
            handle = eng.submit(GenerationRequest("victim", PROMPTS[2], p, ignore_eos=True))
            seen = 0
            async for ev in handle:
                seen += 1
                if seen == 3:
                    handle.cancel()
                if isinstance(ev, FinishEvent):
                    assert ev.reason is FinishReason.CANCELLED

        async with trio.open_nursery() as inner:
            inner.start_soon(run, 0, "a")
            inner.start_soon(run, 1, "b")
            inner.start_soon(victim)
            inner.start_soon(run, 3, "late", 0.05)
        await run(0, "again")  # the same prompt again: its first block from the cache
        nxt = [*PROMPTS[0], *results["a"], 9, 8, 7]  # the next turn of a chat
        handle = eng.submit(GenerationRequest("next", nxt, p, ignore_eos=True))
        results["next"], fin = await collect(handle)
        nursery.cancel_scope.cancel()
    assert results["a"] == results["again"] == expected[0]
    assert results["b"] == expected[1]
    assert results["late"] == expected[3]
    st = eng.stats()
    assert st.spec_drafted > 0 and st.spec_drafted > st.spec_accepted  # drafts rolled back
    assert st.prefix_cache_hits >= 2 and st.kv_bytes_used == 0
    # the first turn's KV ended at its last fed token: its blocks, the last with its state
    assert fin.cached_tokens == (len(PROMPTS[0]) + n - 1) // 4 * 4 > len(PROMPTS[0])
    assert results["next"] == alone(eng, nxt, n)


def check_rollback(model: LanguageModel) -> None:
    """A step asking for several rows' logits (a draft) keeps the state after each token:
    truncating to one of them equals having fed only that far; elsewhere is refused."""
    prompt, draft = [5, 17, 200, 31], [99, 64, 128]
    a = model.new_cache()
    model.forward([SeqChunk(a, prompt)])
    model.forward([SeqChunk(a, [7, *draft], tuple(range(4)))])
    a.truncate(len(prompt) + 2)  # the known token and the first draft kept
    b = model.new_cache()
    model.forward([SeqChunk(b, prompt)])
    model.forward([SeqChunk(b, [7, draft[0]])])
    assert a.state is not None and b.state is not None
    for li, named in a.state.shapes.items():
        for k in named:
            np.testing.assert_array_equal(a.state.layer(li)[k], b.state.layer(li)[k])
    nxt = [SeqChunk(a, [3])], [SeqChunk(b, [3])]
    np.testing.assert_array_equal(model.forward(nxt[0]), model.forward(nxt[1]))
    with pytest.raises(UsageError, match="cannot go back"):
        a.truncate(2)
    assert a.max_discard(1) == 0  # no context shift


def check_prefix_hit(model: LanguageModel, moved: float = 0.1) -> None:
    """Blocks and the state kept with the last of them, loaded into a fresh cache, give
    the logits of computing the whole prompt (bit for bit); without the state they do not
    (by more than ``moved``)."""
    from modelc.engine.prefix_cache import PrefixCache

    prompt = [(5 * i + 3) % 384 for i in range(27)]
    prefix = PrefixCache(model.new_cache().shape, 1 << 24, 8, recurrent=True)
    a = model.new_cache()
    assert a.state is not None
    a.state.boundary = 8
    want = model.forward([SeqChunk(a, prompt)])
    prefix.insert(prompt, a)  # 3 blocks; the state at 24 with the last
    blocks = prefix.match(prompt)
    assert len(blocks) == 3 and blocks[-1].state is not None
    for restore in (True, False):
        b = model.new_cache()
        if not restore:  # the KV blocks alone (the check that refuses them turned off)
            blocks[-1].state, kept = None, blocks[-1].state
            prefix.recurrent = False
        prefix.load(blocks, b)
        got = model.forward([SeqChunk(b, prompt[24:])])
        if restore:
            np.testing.assert_array_equal(got, want)
        else:
            blocks[-1].state = kept
            assert np.abs(got - want).max() > moved
    prefix.release(blocks)
    prefix.recurrent = True
    shorter = [*prompt[:20], 1, 2, 3, 4, 5]  # shares two blocks, no state kept after them
    assert prefix.match(shorter) == []
