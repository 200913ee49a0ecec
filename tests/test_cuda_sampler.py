"""The one-launch sampler's algorithm (``cuda_sampler.sample_rows_ref``, the kernel's steps in
numpy) against the batched sampler, token for token, on real SmolLM2 logits; which batches
it takes (``fits``). The kernel itself against both: tests/test_cuda_kernels.py (a GPU)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from modelc.runtime.backends.cuda import cuda_unavailable
from modelc.runtime.backends.cuda_sampler import (
    CAND,
    fits,
    kth_key,
    params,
    sample_rows_ref,
    takes,
)
from modelc.runtime.batch_sampler import BatchParams, apply_edits, sample_batch
from modelc.runtime.sampling import Sampler, SamplingParams
from tests.test_batch_sampler import ir, rows  # noqa: F401  (the real logits)


def ref_tokens(x: np.ndarray[Any, Any], bp: BatchParams) -> np.ndarray[Any, Any]:
    """The kernel's tokens for ``bp``'s rows of ``x``: edits applied first, as ``sample``."""
    sub = apply_edits(np, x[bp.rows], bp)
    return sample_rows_ref(sub, params(bp, np.arange(len(bp.rows))))


def both(ps: list[SamplingParams], logits: np.ndarray[Any, Any], steps: int) -> int:
    """``steps`` tokens a row from the batched sampler and the kernel's algorithm, each
    sampler accepting its tokens; they agree where the kernel decides; rows it handed back."""
    v = logits.shape[1]
    a = [Sampler(p, v, [1, 2, 3]) for p in ps]
    b = [Sampler(p, v, [1, 2, 3]) for p in ps]
    back = 0
    for step in range(steps):
        x = np.ascontiguousarray(logits[(np.arange(len(ps)) * 5 + step) % len(logits)])
        pa, pb = BatchParams.gather(a), BatchParams.gather(b)
        assert fits(pb)
        want = sample_batch(np, x, pa).tokens
        got = ref_tokens(x, pb)
        back += int((got < 0).sum())
        assert ((got == want) | (got < 0)).all(), (
            step,
            [(p, w, g) for p, w, g in zip(ps, want, got, strict=True) if w != g],
        )
        for s, t in zip(a, want, strict=True):
            s.accept(int(t))
        for s, t in zip(b, want, strict=True):
            s.accept(int(t))
    return back


def test_kth_key_is_the_kth_largest() -> None:
    rng = np.random.default_rng(0)
    x = np.round(rng.standard_normal(5000) * 4).astype(np.float32)  # many ties
    x[:7] = -np.inf
    x[7:9] = [-0.0, 0.0]
    srt = np.sort(x)[::-1]
    for k in (1, 2, 40, 777, 4990, 5000):
        key = kth_key(x, k)
        assert key == int(np.float32(srt[k - 1]).view(np.uint32) ^ 0x80000000) or (
            srt[k - 1] < 0 and key == int(~np.float32(srt[k - 1]).view(np.uint32) & 0xFFFFFFFF)
        ), k
        kept = (x >= srt[k - 1]).sum()
        assert kept >= k and (x > srt[k - 1]).sum() < k


def test_mixes_of_settings_as_the_batched_sampler(rows: np.ndarray[Any, Any]) -> None:  # noqa: F811
    """Greedy, temperature, top-k (ties kept), top-p over the top-k, min-p, penalties, bias
    and bans (applied before, as ``sample`` does), over seeds: the same tokens."""
    v = rows.shape[1]
    for seed in range(16):
        rng = np.random.default_rng(seed)

        def pick(*vals: Any, rng: np.random.Generator = rng) -> Any:
            return vals[int(rng.integers(len(vals)))]

        ps = []
        for i in range(10):
            top_p = pick(1.0, 0.95, 0.5, 0.1)
            ps.append(
                SamplingParams(
                    temperature=pick(0.0, 0.3, 0.8, 1.0, 1.7),
                    top_k=pick(1, 5, 40, 1000) if top_p < 1 else pick(0, 1, 40, v),
                    top_p=top_p,
                    min_p=pick(0.0, 0.05, 0.3),
                    repetition_penalty=pick(1.0, 1.0, 1.3),
                    presence_penalty=pick(0.0, 0.5),
                    banned_token_ids=pick([], [int(t) for t in rng.integers(0, v, 5)]),
                    seed=seed * 100 + i,
                )
            )
        assert both(ps, rows, 6) == 0


def test_ties_as_the_batched_sampler(rows: np.ndarray[Any, Any]) -> None:  # noqa: F811
    """Logits rounded to whole numbers: ties at the k-th token and inside the nucleus."""
    tied = np.round(rows[:4] / 2).astype(np.float32)
    ps = [
        SamplingParams(top_k=k, top_p=p, min_p=m, temperature=t, seed=i)
        for i, (k, p, m, t) in enumerate(
            [(3, 0.9, 0.0, 0.7), (40, 0.5, 0.0, 1.3), (1, 0.99, 0.2, 1.0), (7, 0.3, 0.01, 0.9)]
        )
    ]
    assert both(ps, tied, 20) == 0


def test_a_large_vocabulary_as_the_batched_sampler() -> None:
    """262,144-token rows (Gemma's vocabulary), top-k 1000 then top-p: the same tokens."""
    rng = np.random.default_rng(2)
    big = rng.standard_normal((2, 262144)).astype(np.float32) * 3
    for seed in range(3):
        ps = [
            SamplingParams(temperature=0.9, top_k=1000, top_p=0.8, seed=seed + i) for i in range(2)
        ]
        a, b = ([Sampler(p, 262144) for p in ps] for _ in range(2))
        want = sample_batch(np, big, BatchParams.gather(a)).tokens
        assert ref_tokens(big, BatchParams.gather(b)).tolist() == want.tolist()


def test_what_the_kernel_hands_back() -> None:
    """A NaN logit, an infinite largest logit, every token banned, more than CAND tokens
    left for top-p: -1 (the step goes to the batched sampler)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3000)).astype(np.float32)
    x[0, 5] = np.nan
    x[1, 9] = np.inf
    x[2, :] = -np.inf
    x[3, :] = np.float32(0.5)  # 3000 ties: all kept by top-k 40, too many to sort
    prm = np.array([[0.8, 40, 0.9, 0.0, 0.5, r] for r in range(4)])
    assert sample_rows_ref(x, prm).tolist() == [-1, -1, -1, -1]
    prm[:, 2] = 1.0  # no top-p: the tied row is drawn from, uniformly
    assert sample_rows_ref(x, prm)[3] == 1500


def test_fits_takes_the_common_batches() -> None:
    """Which steps the kernel samples (``fits``: every row; ``takes``: and one draws)."""
    v = 32000

    def bp(*ps: SamplingParams, which: Any = None, n: int = 0) -> BatchParams:
        return BatchParams.gather([Sampler(p, v) for p in ps], which, n)

    chat = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    assert fits(bp(chat, SamplingParams(temperature=0.0), SamplingParams(temperature=0.7)))
    assert fits(bp(SamplingParams(temperature=0.0, top_p=0.5)))  # greedy: top-p unused
    assert not fits(bp(SamplingParams(temperature=0.8, top_p=0.9)))  # top-p over the row
    assert not fits(bp(SamplingParams(top_k=CAND + 1, top_p=0.9)))
    assert not fits(bp(SamplingParams(logprobs=2)))
    assert not fits(bp(chat, which=np.array([1]), n=3))  # rows the host samples
    assert not fits(bp(SamplingParams(logprobs=0)))  # the chosen token's log-probability
    # the kernel takes a step with a sampled row; a greedy-only one keeps the argmax
    assert takes(bp(chat, SamplingParams(temperature=0.0)))
    assert not takes(bp(SamplingParams(temperature=0.0), SamplingParams(temperature=0.0)))
    assert not takes(bp(SamplingParams(temperature=0.8, top_p=0.9)))  # nor one it cannot fit


@pytest.mark.skipif(cuda_unavailable() is not None, reason="no CUDA here")
def test_the_kernel_draws_as_the_batched_sampler(rows: np.ndarray[Any, Any]) -> None:  # noqa: F811
    """``sample_rows`` on the GPU: the batched sampler's tokens (numpy, on the host copy) for
    llama-server's and Ollama's defaults, greedy rows, bans, ties and top-k 1000 over a
    262,144-token row; None (the step handed back) where the algorithm hands a row back
    (``sample_rows_ref``: more than CAND tokens tied at top-k 1000 in the rounded logits)
    and for a row with a NaN."""
    from modelc.runtime.backends import cuda_sampler
    from modelc.runtime.backends.cuda import device

    dev = device()
    cp = dev.cp
    v = rows.shape[1]
    chat = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    ollama = SamplingParams(temperature=0.8, top_k=40, top_p=0.9)
    mixes = [
        [chat, ollama, SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=5)],
        [SamplingParams(temperature=1.3, top_k=1000, top_p=0.5, banned_token_ids=[0, 1, 2])] * 3,
    ]
    handed = 0
    for logits in (rows, np.round(rows / 2).astype(np.float32)):
        for ps in mixes:
            a = [Sampler(dataclasses.replace(p, seed=i), v) for i, p in enumerate(ps)]
            b = [Sampler(dataclasses.replace(p, seed=i), v) for i, p in enumerate(ps)]
            out = cp.zeros(len(ps), np.int64)
            for step in range(12):
                x = np.ascontiguousarray(logits[(np.arange(len(ps)) * 3 + step) % len(logits)])
                pa, pb = BatchParams.gather(a), BatchParams.gather(b)
                want = sample_batch(np, x, pa).tokens
                ref = ref_tokens(x, pb)
                got = cuda_sampler.sample(dev, cp.asarray(x), pb, out)
                where = (step, ps, logits is rows, ref.tolist(), want.tolist())
                if (ref < 0).any():  # handed back: the host samples this step
                    assert got is None, (*where, got.tokens.tolist() if got else None)
                    handed += 1
                else:
                    assert got is not None, where
                    assert got.tokens.tolist() == want.tolist() == ref.tolist(), (
                        *where,
                        got.tokens.tolist(),
                    )
                for s, t in zip([*a, *b], [*want, *want], strict=True):
                    s.accept(int(t))
    assert 0 < handed < 24  # the rounded logits' top-k 1000 steps only
    rng = np.random.default_rng(2)
    big = rng.standard_normal((2, 262144)).astype(np.float32) * 3
    ps = [SamplingParams(temperature=0.9, top_k=1000, top_p=0.8, seed=i) for i in range(2)]
    a, b = [Sampler(p, 262144) for p in ps], [Sampler(p, 262144) for p in ps]
    got = cuda_sampler.sample(dev, cp.asarray(big), BatchParams.gather(b), cp.zeros(2, np.int64))
    assert got is not None
    assert got.tokens.tolist() == sample_batch(np, big, BatchParams.gather(a)).tokens.tolist()
    big[1, 7] = np.nan
    bp = BatchParams.gather([Sampler(p, 262144) for p in ps])
    assert cuda_sampler.sample(dev, cp.asarray(big), bp, cp.zeros(2, np.int64)) is None
