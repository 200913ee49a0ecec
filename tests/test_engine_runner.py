"""The model runner on the real SmolLM2 GGUF, with no trio: scheduled batches (planned by
the pure policy) give each sequence the tokens of the plain one-sequence loop."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from modelc.engine.options import EngineOptions
from modelc.engine.policy import Policy, SeqResult, StepResult
from modelc.engine.runner import ModelRunner
from modelc.formats import load_model
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import build
from modelc.runtime.model import LanguageModel
from modelc.runtime.prompt import PromptFormat
from modelc.runtime.sampling import Sampler, SamplingParams
from tests.assets import smollm2_gguf
from tests.runtime_support import decode_alone

# two different prompts, the second repetitive so prompt-lookup drafting finds drafts
TEXTS = ["The capital of France is", "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,"]
MAX_NEW = 10


@pytest.fixture(scope="module")
def ir() -> ModelIR:
    return load_model(smollm2_gguf())


@pytest.fixture(scope="module")
def lm(ir: ModelIR) -> LanguageModel:
    model = build(ir)
    assert isinstance(model, LanguageModel)
    return model


@pytest.fixture(scope="module")
def prompts(ir: ModelIR) -> list[list[int]]:
    assert ir.tokenizer is not None
    tok = PromptFormat.build(ir.tokenizer).tokenizer
    return [tok.encode(t) for t in TEXTS]


def runner_and_policy(
    lm: LanguageModel, max_context: int = 128, **kw: object
) -> tuple[ModelRunner, Policy]:
    opt = EngineOptions(max_context=max_context, **kw)  # type: ignore[arg-type]
    runner = ModelRunner(lm, opt)
    policy = Policy(
        max_context=runner.max_context,
        prefill_chunk=opt.prefill_chunk,
        kv_budget=runner.kv_budget.limit,
        kv_cost=runner.kv_cost,
    )
    return runner, policy


def run(
    runner: ModelRunner, policy: Policy, prompts: Sequence[Sequence[int]]
) -> tuple[list[list[int]], int]:
    """Greedy generation of ``MAX_NEW`` tokens for each prompt, all scheduled together:
    the scheduler's loop without trio (no stop ids, no delivery); the tokens, and how
    many draft tokens were accepted."""
    params = SamplingParams(temperature=0.0)
    out: dict[str, list[int]] = {}
    accepted = 0
    for i, prompt in enumerate(prompts):
        rid = f"s{i}"
        seq = runner.new_seq(list(prompt), Sampler(params, runner.lm.n_vocab, list(prompt)))
        policy.add(rid, len(prompt), MAX_NEW, seq.cached_tokens)
        runner.add(rid, seq)
        out[rid] = []
    while policy.has_work:
        n_dec = sum(1 for st in policy.running.values() if not st.prefilling)
        for rid, st in policy.running.items():
            if not st.prefilling:
                room = min(runner.opt.spec_gamma, MAX_NEW - len(out[rid]) - 1)
                policy.set_draft(rid, runner.draft(rid, room, n_dec))
        plan = policy.schedule()
        results = []
        for s, samples in zip(plan.seqs, runner.execute(plan, max(n_dec, 1)), strict=True):
            assert isinstance(samples, list), samples
            got = out[s.request_id]
            taken = samples[: MAX_NEW - len(got)]
            got += [smp.token for smp in taken]
            runner.trim(s.request_id, len(samples) - len(taken))  # the runner appended them
            done = len(got) == MAX_NEW
            seq = runner.seqs[s.request_id]
            accepted += len(samples) - 1 if s.n_draft else 0
            results.append(SeqResult(s.request_id, seq.n_computed, len(samples), done))
            if done:
                runner.remove(s.request_id, keep=True)
        policy.update(StepResult(tuple(results)))
    assert not runner.seqs and runner.kv_budget.used == 0
    return list(out.values()), accepted


def alone(lm: LanguageModel, runner: ModelRunner, prompt: Sequence[int]) -> list[int]:
    cache = lm.new_cache(runner.mode, max_tokens=runner.max_context)
    return decode_alone(lm, cache, prompt, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))


def test_a_batch_of_two_gives_each_its_tokens_alone(
    lm: LanguageModel, prompts: list[list[int]]
) -> None:
    runner, policy = runner_and_policy(lm, speculative=False, prefill_chunk=8)
    expected = [alone(lm, runner, p) for p in prompts]
    assert run(runner, policy, prompts)[0] == expected
    # and each scheduled alone through the runner
    for p, want in zip(prompts, expected, strict=True):
        runner, policy = runner_and_policy(lm, speculative=False)
        assert run(runner, policy, [p])[0] == [want]


def test_verified_drafts_give_the_same_tokens(lm: LanguageModel, prompts: list[list[int]]) -> None:
    runner, policy = runner_and_policy(lm, spec_adaptive=False, spec_gamma=4)
    expected = [alone(lm, runner, p) for p in prompts]
    got, accepted = run(runner, policy, prompts)
    assert got == expected
    assert accepted > 0  # the repetitive prompt's drafts were verified and kept


def test_prefix_cache_serves_a_repeated_prompt(lm: LanguageModel, prompts: list[list[int]]) -> None:
    runner, policy = runner_and_policy(lm, speculative=False, prefix_block_tokens=4)
    prompt = prompts[1]
    first = run(runner, policy, [prompt])[0]
    seq = runner.new_seq(list(prompt), Sampler(SamplingParams(), lm.n_vocab, prompt))
    cached = seq.cached_tokens
    runner.drop(seq)
    # every whole block of the prompt, but never its last token (its logits are needed)
    assert cached == min(len(prompt) // 4 * 4, len(prompt) - 1) > 0
    assert run(runner, policy, [prompt])[0] == first
