"""The batched sampler (numpy standing in for CuPy) against the host sampler, token for
token, on real SmolLM2 logits; and the engine sampling on the model's side
(``--device-sampling on``: the numpy decoder's ``forward_sample``) against the host path."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from modelc.engine import EngineOptions, build_engine
from modelc.engine.api import Constraint, ConstraintKind, GenerationRequest, TokenEvent
from modelc.errors import UsageError
from modelc.formats import load_model
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import build
from modelc.runtime.batch_sampler import BatchParams, batchable, sample_batch
from modelc.runtime.model import LanguageModel, SeqChunk
from modelc.runtime.prompt import PromptFormat
from modelc.runtime.sampling import Sample, Sampler, SamplingParams
from tests.assets import smollm2_gguf
from tests.runtime_support import engine_events

TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n    return",
    "Once upon a time, in a small village by the sea,",
]


@pytest.fixture(scope="module")
def ir() -> ModelIR:
    return load_model(smollm2_gguf())


@pytest.fixture(scope="module")
def rows(request: pytest.FixtureRequest) -> np.ndarray[Any, Any]:
    """Every position's next-token logits of a few prompts, (rows, n_vocab) f32; read from
    ``MODELC_TEST_LOGITS`` (an .npy this fixture's rows were saved to, ``python -m
    tests.test_batch_sampler FILE``) where set: a GPU machine has no model files."""
    if saved := os.environ.get("MODELC_TEST_LOGITS"):
        return np.load(saved)  # type: ignore[no-any-return]
    return logits_of(request.getfixturevalue("ir"))


def logits_of(ir: ModelIR) -> np.ndarray[Any, Any]:
    lm = build(ir)
    assert isinstance(lm, LanguageModel) and ir.tokenizer is not None
    tok = PromptFormat.build(ir.tokenizer).tokenizer
    out = []
    for text in TEXTS:
        ids = tok.encode(text)
        out.append(lm.forward([SeqChunk(lm.new_cache(), ids, tuple(range(len(ids))))]))
    return np.concatenate(out)


def random_params(rng: np.random.Generator, n_vocab: int, seed: int) -> SamplingParams:
    """A mix of every setting the batched sampler has, each often at its neutral value."""

    def pick(*values: Any) -> Any:
        return values[int(rng.integers(len(values)))]

    bias = {int(t): float(rng.uniform(-100, 100)) for t in rng.integers(0, n_vocab, 3)}
    return SamplingParams(
        temperature=pick(0.0, 0.3, 0.8, 1.0, 1.0, 1.7),
        top_k=pick(0, 0, 1, 5, 40, n_vocab),
        top_p=pick(1.0, 1.0, 0.95, 0.5, 0.1),
        min_p=pick(0.0, 0.0, 0.05, 0.3),
        repetition_penalty=pick(1.0, 1.0, 1.1, 1.5, 0.8),
        repeat_last_n=pick(64, 64, 4, 0),
        presence_penalty=pick(0.0, 0.5, -0.7),
        frequency_penalty=pick(0.0, 0.4, -0.2),
        logit_bias=pick({}, {}, bias),
        banned_token_ids=pick([], [], [int(t) for t in rng.integers(0, n_vocab, 5)]),
        logprobs=pick(None, None, 0, 3, 20),
        seed=seed,
    )


def same(host: Sample, dev: Sample) -> bool:
    lp_same = host.logprob == dev.logprob or (np.isnan(host.logprob) and np.isnan(dev.logprob))
    return host.token == dev.token and lp_same and host.top == dev.top


def run_both(
    params: Sequence[SamplingParams], logits: np.ndarray[Any, Any], steps: int, prompt: list[int]
) -> int:
    """Sample ``steps`` tokens for each row both ways (the host sampler row by row, the
    batch at once), each accepting its own tokens; assert they agree; the sampled count."""
    n_vocab = logits.shape[1]
    host = [Sampler(p, n_vocab, prompt) for p in params]
    dev = [Sampler(p, n_vocab, prompt) for p in params]
    for step in range(steps):
        x = np.ascontiguousarray(logits[(np.arange(len(params)) * 7 + step) % len(logits)])
        want = [s.sample(row) for s, row in zip(host, x, strict=True)]
        bp = BatchParams.gather(dev)
        got = sample_batch(np, x, bp).samples(bp)
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            assert same(w, g), (step, params[i], w, g)
            host[i].accept(w.token)
            dev[i].accept(g.token)
    return sum(p.temperature > 0 for p in params) * steps


def test_batch_equals_host_sampler_over_seeds_and_mixes(rows: np.ndarray[Any, Any]) -> None:
    n_vocab = rows.shape[1]
    prompt = [int(t) for t in np.argmax(rows, axis=1)]  # tokens the penalties then meet
    sampled = 0
    for seed in range(24):
        rng = np.random.default_rng(seed)
        params = [random_params(rng, n_vocab, seed * 100 + i) for i in range(10)]
        sampled += run_both(params, rows, 6, prompt)
    assert sampled > 600  # most rows drew from the generator, not argmax


def test_each_setting_alone_equals_the_host(rows: np.ndarray[Any, Any]) -> None:
    alone = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, logprobs=5, repetition_penalty=1.3),
        SamplingParams(),
        SamplingParams(temperature=0.7, top_k=40),
        SamplingParams(temperature=0.9, top_p=0.9),
        SamplingParams(temperature=1.2, min_p=0.1),
        SamplingParams(presence_penalty=1.5, frequency_penalty=1.0),
        SamplingParams(top_k=3, top_p=0.8, min_p=0.05, temperature=0.6, logprobs=20),
    ]
    for seed in range(6):
        params = [dataclasses.replace(p, seed=seed) for p in alone]
        run_both(params, rows, 10, [1, 2, 3])


def test_rows_with_infinite_logits_as_the_host(rows: np.ndarray[Any, Any]) -> None:
    """+inf from a tiny repetition penalty on a positive logit (those tokens only), every
    token banned (-inf everywhere: all alike), next to an ordinary row."""
    n_vocab = rows.shape[1]
    prompt = [int(t) for t in np.argsort(-rows[0])[:3]]
    params = [
        SamplingParams(repetition_penalty=1e-38, seed=1),
        SamplingParams(banned_token_ids=list(range(n_vocab)), seed=2),
        SamplingParams(top_k=10, seed=3),
    ]
    run_both(params, rows[:1].repeat(3, axis=0), 8, prompt)


def test_greedy_rows_with_bans_as_the_host(rows: np.ndarray[Any, Any]) -> None:
    """A greedy step whose only edits are bans (``ignore_eos``) takes the raw argmax and
    edits only the rows whose pick is banned: rows banning their best token, their best
    two, one tied with their best (whole-number logits), a token they never pick, nothing,
    and every token; log-probabilities asked by some, as the host samples them."""
    tied = np.round(rows[:6] / 4).astype(np.float32)
    best = np.argsort(-tied, axis=1, kind="stable")
    ties = [int(np.flatnonzero(r == r.max())[0]) for r in tied]
    n_vocab = rows.shape[1]
    bans = [
        [int(best[0, 0])],
        [int(best[1, 0]), int(best[1, 1]), 3],
        [ties[2]],
        [int(best[3, -1])],
        [],
        list(range(n_vocab)),
    ]
    params = [
        SamplingParams(temperature=0.0, banned_token_ids=b, logprobs=None if i % 2 else 3)
        for i, b in enumerate(bans)
    ]
    host = [Sampler(p, n_vocab) for p in params]
    want = [s.sample(x) for s, x in zip(host, tied, strict=True)]
    bp = BatchParams.gather([Sampler(p, n_vocab) for p in params])
    got = sample_batch(np, tied, bp).samples(bp)
    assert all(same(w, g) for w, g in zip(want, got, strict=True)), (want, got)
    assert got[0].token != best[0, 0] and got[1].token not in (best[1, 0], best[1, 1])
    assert got[3].token == best[3, 0] and got[4].token == best[4, 0]


def test_ties_as_the_host(rows: np.ndarray[Any, Any]) -> None:
    """Logits rounded to whole numbers: ties at the k-th token (top-k keeps them all, so
    top-p sorts the whole row) and inside the nucleus (kept in id order)."""
    tied = np.round(rows[:4] / 2).astype(np.float32)
    params = [
        SamplingParams(top_k=k, top_p=p, min_p=m, temperature=t, seed=i, logprobs=4)
        for i, (k, p, m, t) in enumerate(
            [(3, 0.9, 0.0, 0.7), (40, 0.5, 0.0, 1.3), (1, 0.99, 0.2, 1.0), (7, 0.3, 0.01, 0.9)]
        )
    ]
    run_both(params, tied, 20, [1, 2, 3])


def test_rows_sampled_beside_rows_returned(rows: np.ndarray[Any, Any]) -> None:
    """A step's rows 1 and 3 sampled, the others' logits back as they were."""
    n_vocab = rows.shape[1]
    params = [SamplingParams(top_k=20, seed=5, logprobs=2), SamplingParams(temperature=0.0)]
    step = np.ascontiguousarray(rows[:5])
    alone = [Sampler(p, n_vocab) for p in params]
    want = [s.sample(x) for s, x in zip(alone, step[[1, 3]], strict=True)]
    bp = BatchParams.gather([Sampler(p, n_vocab) for p in params], np.array([1, 3]), 5)
    drawn = sample_batch(np, step, bp)
    assert all(same(w, g) for w, g in zip(want, drawn.samples(bp), strict=True))
    assert np.array_equal(drawn.logits, step[[0, 2, 4]])


def test_batchable_leaves_the_host_samplers_on_the_host() -> None:
    on_host = [
        SamplingParams(mirostat=2),
        SamplingParams(typical_p=0.9),
        SamplingParams(top_n_sigma=1.0),
        SamplingParams(xtc_probability=0.5),
        SamplingParams(dry_multiplier=0.8),
    ]
    for p in on_host:
        assert not batchable(Sampler(p, 100)), p
    assert batchable(Sampler(SamplingParams(xtc_probability=0.5, xtc_threshold=0.6), 100))
    assert batchable(Sampler(SamplingParams(top_k=5, top_p=0.5, min_p=0.1, seed=4), 100))


# -- the engine: the model's forward_sample against the host path -------------------------


async def generate(
    ir: ModelIR, mode: str, requests: list[GenerationRequest]
) -> tuple[list[list[TokenEvent]], int, int]:
    """The requests at once through a fresh engine with ``--device-sampling mode`` (fixed
    drafting: a repetitive prompt's drafts are verified in the same steps): each one's
    token events, the steps sampled on the model's side and the draft tokens verified."""
    opt = EngineOptions(
        device_sampling=mode, spec_adaptive=False, spec_gamma=4, spec_max_running=16
    )
    eng = build_engine(ir, opt)
    events = await engine_events(eng, requests)
    stats = eng.stats()
    return events, int(stats.extra["device_sampled_steps"]), stats.spec_drafted


async def test_engine_device_sampling_equals_the_host_path(ir: ModelIR) -> None:
    """A batch of mixed requests gives the same tokens and log-probabilities sampled
    either way: greedy, seeded top-k / top-p / min-p with penalties and bias, log-probs,
    sampled on the device; beside them in the same steps, sampled on the host, one with
    DRY, one constrained by a regex, one asking for prompt log-probabilities and a
    repetitive one whose drafts are verified."""
    assert ir.tokenizer is not None
    tok = PromptFormat.build(ir.tokenizer).tokenizer
    prompts = [tok.encode(t) for t in TEXTS]
    mixes = [
        SamplingParams(temperature=0.0, max_tokens=12, logprobs=3),
        SamplingParams(temperature=0.8, top_k=40, seed=7, max_tokens=16),
        SamplingParams(top_p=0.9, repetition_penalty=1.2, seed=8, max_tokens=16, logprobs=0),
        SamplingParams(temperature=1.3, min_p=0.05, presence_penalty=0.6, seed=9, max_tokens=16),
        SamplingParams(frequency_penalty=0.5, logit_bias={13: 4.0}, seed=10, max_tokens=10),
    ]
    # only the greedy "draft" request drafts: how often a sampled one would depends on
    # the steps' timing (the batch's size), and its verification draws differently
    requests = [
        GenerationRequest(f"d{i}", prompts[i % len(prompts)], p, speculative=False)
        for i, p in enumerate(mixes)
    ]
    host_only = [
        GenerationRequest(
            "dry", prompts[0], SamplingParams(dry_multiplier=0.8, seed=11), speculative=False
        ),
        GenerationRequest(
            "regex",
            tok.encode("My phone number is"),
            SamplingParams(seed=12, max_tokens=12),
            constraint=Constraint(ConstraintKind.REGEX, r"[0-9]{3}-[0-9]{4}"),
        ),
        GenerationRequest(
            "plp", prompts[1], SamplingParams(seed=13, max_tokens=8), prompt_logprobs=2
        ),
        GenerationRequest(
            "draft",
            tok.encode("1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,"),
            SamplingParams(temperature=0.0, max_tokens=16),
        ),
    ]
    host_only[0].sampling.max_tokens = 10
    host, host_steps, host_drafted = await generate(ir, "off", requests + host_only)
    dev, dev_steps, dev_drafted = await generate(ir, "on", requests + host_only)
    assert host_steps == 0 and dev_steps > 0 and host_drafted > 0 and dev_drafted > 0
    assert dev == host
    assert all(len(ev) > 0 for ev in dev)
    # the CPU decoder's logits are on the host already: auto leaves sampling there
    assert (await generate(ir, "auto", requests[:1]))[1] == 0


def test_device_sampling_option_is_checked() -> None:
    with pytest.raises(UsageError, match="--device-sampling must be auto, on or off"):
        EngineOptions(device_sampling="gpu").validate()


if __name__ == "__main__":  # the rows for a machine without the model: an .npy
    import sys

    np.save(sys.argv[1], logits_of(load_model(smollm2_gguf())))
