"""Multi-step scheduling (``--scheduler-steps N``) on the real SmolLM2 GGUF: a scheduled
batch runs up to N decode steps before the scheduler delivers, and every request's
tokens, text, finish reason and counts equal those of one step a batch (greedy and
seeded sampling, stop ids, stop strings found in the text after more steps ran, max
tokens and the context's end reached inside a batch, cancellation), and what the prefix
cache keeps of a finished request is the same."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
import trio

from modelc.engine import EngineOptions, LLMEngine, build_engine
from modelc.engine.api import FinishEvent, FinishReason, GenerationRequest, TokenEvent
from modelc.engine.batch_depth import BatchDepth
from modelc.engine.policy import Policy
from modelc.engine.runner import ModelRunner
from modelc.errors import ModelcError
from modelc.formats import load_model
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import build
from modelc.runtime.model import LanguageModel
from modelc.runtime.sampling import Sampler, SamplingParams
from tests.assets import smollm2_gguf
from tests.test_engine import PROMPTS, alone, collect, ids, params, running
from tests.test_engine_runner import runner_and_policy

Result = tuple[list[int], str, FinishReason, int, int]


@pytest.fixture(scope="module")
def ir() -> ModelIR:
    return load_model(smollm2_gguf())


@pytest.fixture(scope="module")
def lm(ir: ModelIR) -> LanguageModel:
    model = build(ir)
    assert isinstance(model, LanguageModel)
    return model


def add_greedy(
    runner: ModelRunner,
    policy: Policy,
    rid: str,
    prompt: list[int],
    max_new: int,
    stops: frozenset[int] = frozenset(),
) -> None:
    """A greedy sequence given to the runner and the policy as the engine's submit does."""
    greedy = Sampler(SamplingParams(temperature=0.0), runner.lm.n_vocab, prompt)
    seq = runner.new_seq(list(prompt), greedy)
    seq.max_new, seq.stop_ids = max_new, stops
    policy.add(rid, len(prompt), max_new, seq.cached_tokens)
    runner.add(rid, seq)


def requests(eng: LLMEngine) -> list[GenerationRequest]:
    """Greedy requests of several lengths (not multiples of the batch's steps), a stop
    string met mid-batch, seeded sampling, ignore_eos, and one ending on its stop id."""
    out = []
    for i, text in enumerate(PROMPTS):
        p = params(eng, max_tokens=(5, 12, 23, 9)[i % 4])
        out.append(GenerationRequest(f"g{i}", ids(eng, text), p))
    out.append(GenerationRequest("stop", ids(eng, PROMPTS[0]), params(eng, stop=["."])))
    out.append(GenerationRequest("stop2", ids(eng, PROMPTS[4]), params(eng, 30, stop=[" Celsius"])))
    for seed in (7, 8):
        p = params(eng, 17, temperature=0.8, top_k=40, top_p=0.95, seed=seed)
        out.append(GenerationRequest(f"seed{seed}", ids(eng, PROMPTS[2]), p))
    out.append(GenerationRequest("noeos", ids(eng, PROMPTS[7]), params(eng, 21), ignore_eos=True))
    chat = "<|im_start|>user\nName a fruit.<|im_end|>\n<|im_start|>assistant\n"
    assert eng.prompt is not None
    out.append(GenerationRequest("eos", eng.prompt.encode(chat), params(eng, 64)))
    return out


async def serve(
    eng: LLMEngine, reqs: Sequence[GenerationRequest]
) -> tuple[dict[str, Result], dict[str, Any]]:
    results: dict[str, Result] = {}
    async with running(eng):

        async def one(req: GenerationRequest) -> None:
            toks, text, fin = await collect(eng.submit(req))
            results[req.request_id] = (
                toks,
                text,
                fin.reason,
                fin.completion_tokens,
                fin.cached_tokens,
            )

        async with trio.open_nursery() as n:
            for req in reqs:
                n.start_soon(one, req)
        st = eng.stats()
    return results, {"steps": st.steps, **st.extra, "kv": st.kv_bytes_used}


@pytest.mark.parametrize("steps", [2, 4])
async def test_n_steps_a_batch_equal_one(ir: ModelIR, steps: int) -> None:
    one = build_engine(ir, EngineOptions(speculative=False, max_concurrent=16, scheduler_steps=1))
    many = build_engine(
        ir, EngineOptions(speculative=False, max_concurrent=16, scheduler_steps=steps)
    )
    t0 = time.perf_counter()
    want, st1 = await serve(one, requests(one))
    wall = time.perf_counter() - t0
    got, stn = await serve(many, requests(many))
    assert got == want
    # /metrics' split of the busy time: the step thread's, the scheduler's wake-up after
    # it, its delivery and planning before the next batch: within the wall time
    split = [st1[k] for k in ("step_seconds", "wake_seconds", "plan_seconds")]
    assert split[0] > 0 and min(split) >= 0 and sum(split) <= wall, (split, wall)
    # the references: greedy alone, the stop id, the stop strings, the seeded pair differ
    for i, text in enumerate(PROMPTS):
        p = params(one, max_tokens=(5, 12, 23, 9)[i % 4])
        assert want[f"g{i}"][0] == alone(one, ids(one, text), p)
    assert want["stop"][1] == " Paris" and want["stop"][2] is FinishReason.STOP
    assert (
        want["stop2"][2] is FinishReason.STOP and want["stop2"][1] == " 100°C, which is a perfect"
    )
    assert want["eos"][2] is FinishReason.STOP and want["eos"][3] < 64
    assert want["noeos"][3] == 21 and want["seed7"][0] != want["seed8"][0]
    # the batches really ran several steps each; nothing left held
    assert st1["scheduled_batches"] == st1["steps"]
    assert stn["scheduled_batches"] < stn["steps"] * 0.75
    assert st1["kv"] == stn["kv"] == 0


async def test_what_the_prefix_cache_keeps_is_the_same(ir: ModelIR) -> None:
    """A request ended by a stop string that the scheduler finds after the runner went on:
    the tokens after it are taken back, so the prefix cache holds the same blocks (a
    token each) and the next turn (prompt + answer + more) finds as many cached tokens
    as with one step a batch."""
    cached, blocks = [], []
    for steps in (1, 4):
        opt = EngineOptions(speculative=False, scheduler_steps=steps, prefix_block_tokens=1)
        eng = build_engine(ir, opt)
        a_ids = ids(eng, "Rule: be brief. " * 12 + PROMPTS[2])
        async with running(eng):
            ta, text, fa = await collect(
                eng.submit(GenerationRequest("a", a_ids, params(eng, 60, stop=[","])))
            )
            assert fa.reason is FinishReason.STOP
            blocks.append(set(eng.prefix.blocks))
            c_ids = a_ids + ta + ids(eng, " and then")
            _, _, fc = await collect(eng.submit(GenerationRequest("c", c_ids, params(eng, 4))))
        cached.append((ta, text, fc.cached_tokens))
    # the same answer; its stop token's KV (which the runner's next step computed, where
    # one step a batch never feeds it) is kept too: one block more, nothing after it
    assert cached[0][:2] == cached[1][:2]
    assert blocks[0] <= blocks[1] and len(blocks[1] - blocks[0]) == 1
    ta, _, n_cached = cached[0]
    assert n_cached == len(ids(eng, "Rule: be brief. " * 12 + PROMPTS[2])) + len(ta) - 1
    assert cached[1][2] == n_cached + 1


def test_the_runner_goes_on_only_where_the_scheduler_would(ir: ModelIR, lm: LanguageModel) -> None:
    """Told 8 steps, the runner stops each sequence at its max_new, at a stop id, and
    before a step would write past the context: the cache never holds more."""
    runner, policy = runner_and_policy(lm, max_context=24, speculative=False)
    eng = build_engine(ir, EngineOptions(speculative=False))
    prompt = ids(eng, PROMPTS[0])  # 5 tokens
    second = alone(eng, prompt, params(eng, 2))[1]
    long = ids(eng, PROMPTS[2])  # ~20 tokens: the context's end within 8 steps
    add_greedy(runner, policy, "max", prompt, 3)
    add_greedy(runner, policy, "stop", prompt, 50, frozenset({second}))
    add_greedy(runner, policy, "ctx", long, 50)
    plan = policy.schedule()
    out = runner.execute(plan, 3, steps=8)
    n = {s.request_id: len(o) for s, o in zip(plan.seqs, out, strict=True) if isinstance(o, list)}
    assert n == {"max": 3, "stop": 2, "ctx": 24 - len(long) + 1}
    assert runner.last_steps == n["ctx"]
    assert runner.seqs["ctx"].n_computed == 24 and len(runner.seqs["ctx"].tokens) == 25


async def test_context_end_and_cancel_inside_a_batch(ir: ModelIR) -> None:
    got = []
    for steps in (1, 4):
        eng = build_engine(
            ir, EngineOptions(speculative=False, max_context=40, scheduler_steps=steps)
        )
        prompt = ids(eng, PROMPTS[2])  # ~20 tokens: the context ends inside a batch
        async with running(eng):
            toks, _, fin = await collect(
                eng.submit(GenerationRequest("c", prompt, params(eng, 100), ignore_eos=True))
            )
            h = eng.submit(GenerationRequest("x", prompt[:8], params(eng, 30), ignore_eos=True))
            n = 0
            async for ev in h:
                if isinstance(ev, TokenEvent):
                    n += 1
                    if n == 3:
                        h.cancel()
                elif isinstance(ev, FinishEvent):
                    assert ev.reason is FinishReason.CANCELLED
            await trio.sleep(0.05)
            assert eng.stats().kv_bytes_used == 0
        assert fin.reason is FinishReason.LENGTH
        assert len(prompt) + len(toks) == 41  # the one past the context ends it, as alone
        got.append(toks)
    assert got[0] == got[1]


def test_scheduler_steps_bounds() -> None:
    from modelc.errors import UsageError

    for bad in (-1, 65):
        with pytest.raises(UsageError, match=r"--scheduler-steps must be 0 \(auto\) \.\. 64"):
            EngineOptions(scheduler_steps=bad).validate()


def test_auto_depth_pays_the_gap_within_the_latency_budget() -> None:
    """Auto: one step a batch where the gap between batches is short beside a step (a
    CPU's), the smallest depth making it at most a tenth of the batch where it is
    long (a GPU's: 7 ms gaps around 5 ms steps), never more than 20 ms of steps."""
    cases = [
        (0.012, 0.001, 1),  # a CPU's step, a short gap
        (0.005, 0.007, 4),  # ceil(7 / 0.5) = 14, but 4 x 5 ms fill the 20 ms budget
        (0.0035, 0.002, 5),  # ceil(2 / 0.35) = 6, but 5 x 3.5 ms fill 20 ms
        (0.0005, 0.01, 8),  # at most MAX_AUTO
        (0.03, 0.05, 1),  # one step is already past the budget
    ]
    clock = [0.0]  # the last batch's end

    def batch(d: BatchDepth, step: float, gap: float | None) -> None:
        """A batch of one ``step``-second step, ``gap`` after the last one's end (None:
        after an idle wait)."""
        called = clock[0] + (1.0 if gap is None else gap)
        clock[0] = called + step
        d.observe(called, called, clock[0], 1, gap is not None)

    for step, gap, want in cases:
        d = BatchDepth(0)
        batch(d, step, gap)
        assert d.steps() == want, (step, gap)
    d = BatchDepth(0)
    batch(d, 0.005, None)  # after an idle wait: no gap measured
    assert d.steps() == 1 and d.secs["plan_seconds"] == 0
    for _ in range(60):  # the averages follow a change
        batch(d, 0.005, 0.007)
    assert d.steps() == 4
    assert d.secs["step_seconds"] == pytest.approx(61 * 0.005)
    assert BatchDepth(3).steps() == 3  # fixed


async def test_auto_answers_as_the_default(ir: ModelIR) -> None:
    """Auto (``--scheduler-steps 0``) answers as the default, one step a batch (an H100's
    HTTP load ran no faster with more: bench/RESULTS.md "Multi-step batches")."""
    one = build_engine(ir, EngineOptions(speculative=False, max_concurrent=16))
    assert one.opt.scheduler_steps == 1
    auto = build_engine(ir, EngineOptions(speculative=False, max_concurrent=16, scheduler_steps=0))
    want, _ = await serve(one, requests(one))
    got, _ = await serve(auto, requests(auto))
    assert got == want


async def test_a_constrained_request_keeps_its_batches_to_one_step(ir: ModelIR) -> None:
    """A request whose steps need the scheduler between them (here a regex) would get one
    step a batch beside the others' several: while it runs, batches are one step; the
    outputs are those of one step a batch."""
    from modelc.engine.api import Constraint, ConstraintKind

    got = []
    for steps in (1, 4):
        eng = build_engine(ir, EngineOptions(speculative=False, scheduler_steps=steps))
        c = Constraint(ConstraintKind.REGEX, r"[0-9]{3}-[0-9]{4}")
        reqs = [
            GenerationRequest("re", ids(eng, "My phone number is"), params(eng, 30), constraint=c),
            GenerationRequest("plain", ids(eng, PROMPTS[1]), params(eng, 4)),
        ]
        res, st = await serve(eng, reqs)
        got.append(res)
        # the plain request is done within the constrained one's steps
        assert st["scheduled_batches"] == st["steps"]
    assert got[0] == got[1] and got[1]["re"][2] is FinishReason.STOP


def test_a_failed_later_step_ends_only_the_sequences_it_held(
    ir: ModelIR, lm: LanguageModel
) -> None:
    """The model failing in a batch's second step: the sequences that went on end with
    the error (its cause kept), the others keep the first step's token."""
    runner, policy = runner_and_policy(lm, max_context=64, speculative=False)
    eng = build_engine(ir, EngineOptions(speculative=False))
    for rid, max_new in [("done", 1), ("more", 10)]:
        add_greedy(runner, policy, rid, ids(eng, PROMPTS[0]), max_new)
    real, calls = lm.forward, [0]

    def failing(batch: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("boom")
        return real(batch)

    lm.forward = failing  # type: ignore[method-assign]
    try:
        plan = policy.schedule()
        out = dict(
            zip((s.request_id for s in plan.seqs), runner.execute(plan, 2, steps=4), strict=True)
        )
    finally:
        lm.forward = real  # type: ignore[method-assign]
    assert isinstance(out["done"], list) and len(out["done"]) == 1
    err = out["more"]
    assert isinstance(err, ModelcError) and str(err) == "RuntimeError: boom"
    assert isinstance(err.__cause__, RuntimeError)
    assert calls[0] == 2 and runner.last_steps == 1


async def test_a_full_engine_runs_several_steps_with_requests_queued(ir: ModelIR) -> None:
    """Requests queued behind a full engine (every place taken) cannot start before one
    ends, which is delivered at a batch's end either way: batches keep their steps; the
    answers are those of one step a batch."""
    got, stats = [], []
    for steps in (1, 4):
        eng = build_engine(
            ir, EngineOptions(speculative=False, max_concurrent=2, scheduler_steps=steps)
        )
        res, st = await serve(eng, requests(eng)[:6])
        got.append(res)
        stats.append(st)
    assert got[0] == got[1]
    assert stats[1]["scheduled_batches"] < stats[1]["steps"] * 0.6
