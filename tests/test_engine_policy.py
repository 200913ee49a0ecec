"""The scheduling policy and the prefix cache alone: no model, no trio."""

from __future__ import annotations

import numpy as np
import pytest

from modelc.engine.policy import Policy, SeqResult, StepPlan, StepResult
from modelc.engine.prefix_cache import PrefixCache
from modelc.engine.speculative import NGramDraft, PromptLookup, verify
from modelc.errors import CapacityError, UsageError
from modelc.runtime.kv_cache import KVCache, KVShape
from modelc.runtime.sampling import Sampler, SamplingParams


def run_step(p: Policy, plan: StepPlan, finished: tuple[str, ...] = ()) -> list[str]:
    """Pretend the step ran: every scheduled token computed, one token sampled per sample."""
    res = []
    for s in plan.seqs:
        computed = s.start + s.n_tokens - s.n_draft
        res.append(
            SeqResult(s.request_id, computed, 1 if s.sample else 0, s.request_id in finished)
        )
    return p.update(StepResult(tuple(res)))


def test_decode_first_then_chunked_prefill_under_budget() -> None:
    p = Policy(max_concurrent=4, step_tokens=64, prefill_chunk=32, max_context=4096)
    p.add("a", 5, 10)
    plan = p.schedule()
    assert [(s.request_id, s.start, s.n_tokens, s.sample, s.admitted) for s in plan.seqs] == [
        ("a", 0, 5, True, True)
    ]
    run_step(p, plan)
    p.add("long", 100, 10)
    plan = p.schedule()
    # the running stream gets its decode token, the long prompt one chunk
    assert [(s.request_id, s.n_tokens, s.sample) for s in plan.seqs] == [
        ("a", 1, True),
        ("long", 32, False),
    ]
    run_step(p, plan)
    chunks = []
    while p.seq("long").prefilling:
        plan = p.schedule()
        assert plan.seqs[0].request_id == "a" and plan.seqs[0].n_tokens == 1
        assert plan.n_tokens <= 64
        chunks.append(plan.seqs[1].n_tokens)
        run_step(p, plan)
    assert chunks == [32, 32, 4]
    assert p.seq("long").num_tokens == 101  # prompt + the token sampled from its last chunk


def test_a_chunk_takes_an_image_whole() -> None:
    """Spans (images attending both ways) are never split: a chunk that would end inside
    one stops before it, or takes all of it when it starts there."""
    p = Policy(step_tokens=64, prefill_chunk=8, max_context=4096)
    p.add("a", 45, 4, whole=((5, 25), (30, 33), (38, 42)))
    chunks = []
    while p.seq("a").prefilling:
        plan = p.schedule()
        (s,) = plan.seqs
        chunks.append((s.start, s.n_tokens))
        run_step(p, plan)
    assert chunks == [(0, 5), (5, 20), (25, 8), (33, 5), (38, 7)]


def test_prefill_unchunked_feeds_whole_prompt() -> None:
    p = Policy(step_tokens=16, prefill_chunk=0, max_context=4096)
    p.add("a", 300, 4)
    (s,) = p.schedule().seqs
    assert s.n_tokens == 300 and s.sample


def test_budget_shared_between_new_prompts() -> None:
    p = Policy(max_concurrent=8, step_tokens=40, prefill_chunk=32, max_context=4096)
    for i in range(3):
        p.add(f"r{i}", 30, 4)
    plan = p.schedule()
    assert [(s.request_id, s.n_tokens) for s in plan.seqs] == [("r0", 30), ("r1", 10)]
    assert list(p.waiting) == ["r2"]  # admitted next step
    run_step(p, plan)
    plan = p.schedule()
    assert [(s.request_id, s.n_tokens, s.sample) for s in plan.seqs] == [
        ("r0", 1, True),
        ("r1", 20, True),
        ("r2", 19, False),
    ]


def test_admission_limits_and_queue() -> None:
    p = Policy(max_concurrent=2, queue_size=1, max_context=100)
    p.add("a", 3, 4)
    p.add("b", 3, 4)
    p.add("c", 3, 4)  # a and b get the free slots, c queues
    with pytest.raises(CapacityError, match="queue full"):
        p.add("d", 3, 4)
    plan = p.schedule()
    assert {s.request_id for s in plan.seqs} == {"a", "b"} and list(p.waiting) == ["c"]
    with pytest.raises(CapacityError):
        p.add("d", 3, 4)
    run_step(p, plan, finished=("a",))
    assert "a" not in p
    plan = p.schedule()
    assert [s.request_id for s in plan.seqs] == ["b", "c"]


def test_bad_requests_refused() -> None:
    p = Policy(max_context=10)
    with pytest.raises(UsageError, match="context holds 10"):
        p.add("a", 10, 1)
    with pytest.raises(UsageError, match="empty"):
        p.add("a", 0, 1)
    p.add("a", 2, 1)
    with pytest.raises(UsageError, match="already in use"):
        p.add("a", 2, 1)
    small = Policy(max_context=1000, kv_budget=100, kv_cost=lambda n: n)
    with pytest.raises(UsageError, match="more than the whole budget"):
        small.add("x", 50, 100)


def test_kv_budget_reserved_and_released() -> None:
    p = Policy(max_concurrent=8, max_context=1000, kv_budget=250, kv_cost=lambda n: n)
    p.add("a", 50, 50)  # needs 100
    p.add("b", 50, 50)  # 100
    p.add("c", 50, 50)  # 100: does not fit beside a and b
    p.add("d", 10, 10)  # 20 would fit, but FIFO: it waits behind c
    plan = p.schedule()
    assert [s.request_id for s in plan.seqs] == ["a", "b"]
    assert p.kv_reserved == 200
    assert p.abort("a")
    assert p.kv_reserved == 100
    run_step(p, plan)  # the step's result for aborted "a" is ignored
    plan = p.schedule()
    assert [s.request_id for s in plan.seqs] == ["b", "c", "d"]
    assert p.kv_reserved == 220
    assert not p.abort("zzz")


def test_drafts_and_rollback() -> None:
    p = Policy(step_tokens=6, max_context=100)
    p.add("a", 4, 20)
    run_step(p, p.schedule())
    p.set_draft("a", 3)
    (s,) = p.schedule().seqs
    assert (s.start, s.n_tokens, s.n_draft, s.sample) == (4, 4, 3, True)
    # two drafts accepted, then a correction: 3 new tokens; KV keeps last + 2 drafts
    p.update(StepResult((SeqResult("a", 7, 3),)))
    st = p.seq("a")
    assert (st.num_computed, st.num_tokens, st.draft) == (7, 8, 0)
    p.set_draft("a", 10)  # trimmed to the step budget
    (s,) = p.schedule().seqs
    assert (s.n_tokens, s.n_draft) == (6, 5)


def test_prefix_cached_tokens_skip_prefill() -> None:
    p = Policy(step_tokens=512, max_context=1000)
    p.add("a", 100, 4, num_cached=96)
    (s,) = p.schedule().seqs
    assert (s.start, s.n_tokens, s.admitted) == (96, 4, True)
    p.add("b", 64, 4, num_cached=64)  # always one token left to compute
    run_step(p, StepPlan((s,)))
    sb = p.schedule().seqs[1]
    assert (sb.start, sb.n_tokens) == (63, 1)


def test_context_shift_bookkeeping() -> None:
    p = Policy(max_context=100)
    p.add("a", 10, 200)
    run_step(p, p.schedule())
    p.shifted("a", 4)
    st = p.seq("a")
    assert (st.num_computed, st.num_tokens) == (6, 7)


# -- prefix cache -------------------------------------------------------------------------

SHAPE = KVShape(n_layer=2, n_head_kv=1, head_dim=4)


def filled_cache(tokens: list[int]) -> KVCache:
    c = KVCache(SHAPE, 512)
    c.reserve(len(tokens))
    for layer in range(SHAPE.n_layer):
        k = np.array([[[t, layer, 0, 1]] for t in tokens], np.float32)  # (n, 1, 4)
        c.write(layer, 0, k, -k)
    c.advance(len(tokens))
    return c


def test_prefix_cache_match_load_refcount_and_lru() -> None:
    block_bytes = 2 * SHAPE.n_layer * 4 * SHAPE.n_head_kv * SHAPE.head_dim * 4
    pc = PrefixCache(SHAPE, budget_bytes=3 * block_bytes, block_tokens=4)
    a = list(range(10))  # two full blocks
    assert pc.insert(a, filled_cache(a)) == 2
    assert pc.insert(a, filled_cache(a)) == 0  # already there
    got = pc.match([*a[:8], 99, 98])
    assert len(got) == 2 and pc.stats.hits == 1 and pc.stats.hit_tokens == 8
    fresh = KVCache(SHAPE, 512)
    assert pc.load(got, fresh) == 8
    k, v = fresh.read(1, 8)
    assert k[:, 0, 0].tolist() == a[:8] and (v == -k).all() and (k[:, 0, 1] == 1).all()
    assert pc.match([0, 1, 2, 5, 6]) == []  # differs inside the first block
    one = pc.match(a[:8])  # a whole-prompt hit still leaves 1 token to compute
    assert len(one) == 1 and pc.match(a[:4]) == []
    pc.release(one)
    # a new prompt needs 2 blocks; only 1 fits; referenced blocks (got) are never evicted
    b = [50 + i for i in range(8)]
    assert pc.insert(b, filled_cache(b)) == 1
    assert pc.stats.evicted_blocks == 0
    pc.release(got)
    c = [70 + i for i in range(8)]
    assert pc.insert(c, filled_cache(c)) == 2  # evicts unreferenced blocks, oldest first
    assert pc.stats.evicted_blocks == 2 and pc.bytes_used <= 3 * block_bytes
    assert len(pc.match([*c, 1])) == 2


def test_prefix_cache_off() -> None:
    pc = PrefixCache(SHAPE, budget_bytes=0, block_tokens=4)
    a = list(range(10))
    assert pc.insert(a, filled_cache(a)) == 0 and pc.match(a) == []


# -- drafters -----------------------------------------------------------------------------


def test_prompt_lookup_and_ngram_drafts() -> None:
    toks = [1, 2, 3, 4, 5, 9, 9, 2, 3]
    assert PromptLookup().propose(toks, 3) == [4, 5, 9]
    assert PromptLookup().propose([1, 2, 3], 3) == []
    assert PromptLookup().propose([7, 1, 7], 2) == [1, 7]
    ng = NGramDraft(n=2)
    assert ng.propose([1, 2, 3, 1, 2], 3) == [3, 1, 2]
    assert ng.propose([5, 6], 2) == []


def test_rejection_sampling_keeps_the_distribution() -> None:
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05], np.float32))
    target = np.exp(logits) / np.exp(logits).sum()
    rows = np.stack([logits, logits])  # (draft + 1, vocab)
    n = 20000
    for draft in (0, 3):  # a likely and an unlikely draft token
        sampler = Sampler(SamplingParams(temperature=1.0, seed=draft), 5)
        first = np.zeros(5)
        accepted = 0
        for _ in range(n):
            out = verify(sampler, rows, [draft])
            first[out[0].token] += 1
            accepted += len(out) == 2
        assert np.abs(first / n - target).max() < 0.015, (draft, first / n)
        assert abs(accepted / n - target[draft]) < 0.015


def test_greedy_verify_accepts_matching_drafts() -> None:
    rows = np.zeros((4, 6), np.float32)
    for i, t in enumerate([2, 4, 1, 5]):
        rows[i, t] = 1.0
    s = Sampler(SamplingParams(temperature=0.0), 6)
    assert [x.token for x in verify(s, rows, [2, 4, 0])] == [2, 4, 1]  # third draft wrong
    s = Sampler(SamplingParams(temperature=0.0), 6)
    assert [x.token for x in verify(s, rows, [2, 4, 1])] == [2, 4, 1, 5]  # all right + bonus
    assert s.history == [2, 4, 1, 5]
