"""The adaptive speculation controller and the prompt-lookup index alone: no model, no trio."""

from __future__ import annotations

import numpy as np
import pytest

from modelc.engine.spec_control import SpecConfig, SpecController, StepCost, expected_tokens
from modelc.engine.speculative import PromptLookup


def flat(per_row: float = 0.15) -> StepCost:
    return StepCost(prior_row=per_row)


def run(
    ctl: SpecController,
    accept: float,
    steps: int,
    *,
    match: int = 3,
    batch: int = 1,
    cost: StepCost | None = None,
    seed: int = 0,
) -> list[int]:
    """Drive ``ctl`` for ``steps`` steps; each drafted token is accepted with chance
    ``accept`` (the run stops at the first rejection). The draft lengths it chose."""
    rng = np.random.default_rng(seed)
    c = cost or flat()
    ks = []
    for _ in range(steps):
        k = ctl.draft_len(match, 8, lambda n: c.ratio(batch, n), batch)
        ks.append(k)
        if k:
            took = 0
            while took < k and rng.random() < accept:
                took += 1
            ctl.update(match, k, took, lambda n: c.ratio(batch, n), batch)
    return ks


def test_expected_tokens() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_short_prompts_never_draft() -> None:
    ctl = SpecController(SpecConfig(min_prompt=128), prompt_len=127)
    assert not ctl.enabled
    assert run(ctl, 1.0, 20) == [0] * 20
    assert SpecController(SpecConfig(min_prompt=128), prompt_len=128).enabled


def test_high_acceptance_drafts_the_most_and_stays_on() -> None:
    ctl = SpecController(SpecConfig(n_max=8), prompt_len=500)
    ks = run(ctl, 1.0, 200)
    assert all(k > 0 for k in ks)
    assert ks[-100:] == [8] * 100
    # a few misses in a copied span do not turn it off
    ks = run(ctl, 0.9, 200, seed=1)
    assert sum(k > 0 for k in ks) == 200 and np.median(ks) >= 6


def test_no_copy_turns_off_and_probes_rarely() -> None:
    ctl = SpecController(SpecConfig(), prompt_len=500)
    ks = run(ctl, 0.0, 1000)
    first_off = ks.index(0)
    assert first_off <= 3  # a couple of rejected drafts switch it off
    drafted = sum(ks)
    # only single-token probes after that, at doubling intervals up to 128 steps
    assert all(k <= 1 for k in ks[first_off:])
    assert drafted <= first_off * 8 + 12, drafted
    gaps = np.diff([i for i, k in enumerate(ks) if k and i > first_off])
    assert list(gaps[:4]) == [17, 33, 65, 129]  # the interval doubles (+1: the probe step)
    assert gaps.max() <= 129


def test_a_probe_that_is_accepted_turns_drafting_back_on() -> None:
    ctl = SpecController(SpecConfig(), prompt_len=500)
    run(ctl, 0.0, 50)
    assert ctl.acceptance()[3] < 0.1
    ks = run(ctl, 1.0, 200)
    first_probe = next(i for i, k in enumerate(ks) if k)
    assert first_probe < 129
    assert ks[first_probe + 3 :] and min(ks[first_probe + 3 :]) >= 4  # back on, long drafts


def test_acceptance_is_kept_per_match_length() -> None:
    ctl = SpecController(SpecConfig(), prompt_len=500)
    c = flat()
    cost = lambda n: c.ratio(1, n)  # noqa: E731
    # 1-token matches start below the break-even point: not drafted
    assert ctl.draft_len(1, 8, cost, 1) == 0
    # 3-token matches start drafted; rejecting them does not touch the 2-token estimate
    assert ctl.draft_len(3, 8, cost, 1) > 0
    before = ctl.acceptance().get(2, SpecConfig().priors[2])
    for _ in range(5):
        ctl.update(3, 4, 0, cost, 1)
    assert ctl.acceptance()[3] < 0.1
    assert ctl.acceptance().get(2, SpecConfig().priors[2]) == before


def test_costlier_steps_and_bigger_batches_draft_less() -> None:
    cfg = SpecConfig()
    a = 0.7
    one = SpecController(cfg, 500).best(a, lambda n: 1 + 0.1 * n, 1, 8)
    dear = SpecController(cfg, 500).best(a, lambda n: 1 + 0.4 * n, 1, 8)
    batch = SpecController(cfg, 500).best(a, lambda n: 1 + 0.1 * n, 4, 8)
    assert one[0] > dear[0] and one[1] > dear[1]
    assert one[1] > batch[1] > 1.0 and batch[0] <= one[0]
    # too dear to pay at all
    assert SpecController(cfg, 500).best(0.3, lambda n: 1 + 0.5 * n, 1, 8) == (0, 1.0)


def test_step_cost_prior_then_fit() -> None:
    c = StepCost(prior_row=0.2)
    for _ in range(50):
        c.observe(1, 0.010)  # one row only: nothing to fit a slope on
    assert c.per_row(1) == pytest.approx(0.2)
    rng = np.random.default_rng(0)
    for _ in range(200):
        rows = int(rng.integers(1, 10))
        c.observe(rows, 0.008 + 0.001 * rows)  # base 8 ms, 1 ms a row
    # (the old one-row steps have faded to ~2% of the weight)
    assert c.per_row(1) == pytest.approx(0.001 / 0.009, rel=2e-2)
    assert c.ratio(4, 2) == pytest.approx(1 + 2 * 0.001 / 0.012, rel=2e-2)
    # a fit that makes no sense falls back to something bounded
    d = StepCost()
    for rows, t in [(1, 0.02), (5, 0.001)] * 20:
        d.observe(rows, t)
    assert 0.0 < d.per_row(1) <= 1.0


def test_frozen_step_cost_keeps_its_prior() -> None:
    """EngineOptions.spec_fixed_cost: the same steps that move a learning model leave a
    frozen one at its prior, so the controller's decisions follow the tokens alone."""
    steps = [(rows, 0.008 + 0.001 * rows) for rows in range(1, 10)] * 20
    learning, frozen = StepCost(prior_row=0.2), StepCost(prior_row=0.2, frozen=True)
    for rows, t in steps:
        learning.observe(rows, t)
        frozen.observe(rows, t)
    assert learning.per_row(1) == pytest.approx(0.001 / 0.009, rel=2e-2)
    assert frozen.per_row(1) == pytest.approx(0.2)
    assert frozen.ratio(4, 2) == pytest.approx(1 + 2 * 0.2 / (1 + 0.2 * 3))


def brute(tokens: list[int], k: int, max_n: int = 3) -> tuple[list[int], int]:
    for n in range(min(max_n, len(tokens) - 1), 0, -1):
        tail = tokens[len(tokens) - n :]
        for s in range(len(tokens) - n - 1, -1, -1):
            if tokens[s : s + n] == tail:
                return tokens[s + n : s + n + k], n
    return [], 0


def test_prompt_lookup_index_matches_a_scan() -> None:
    rng = np.random.default_rng(0)
    for _ in range(100):
        toks = [int(t) for t in rng.integers(0, 5, int(rng.integers(1, 40)))]
        pl = PromptLookup()
        for i in range(1, len(toks) + 1):  # grown one token at a time, as the engine does
            assert pl.lookup(toks[:i], 4) == brute(toks[:i], 4), toks[:i]
    pl = PromptLookup()
    assert pl.lookup([1, 2, 3, 9, 1, 2, 3], 3) == ([9, 1, 2], 3)
    # a shorter or changed sequence rebuilds the index
    assert pl.lookup([5, 6, 5], 2) == ([6, 5], 1)
    assert pl.lookup([5, 6, 7, 6], 2) == ([7, 6], 1)
