"""SmolLM2-135M (the real Q4_1 GGUF) against transformers' f32 goldens; batching; KV modes; shift.

Goldens: tests/golden/smollm2.json from scripts/make_goldens.py (transformers running
the same dequantized weights in f32).  Checks: the golden top-10 next-token
log-probabilities within 2e-3, and identical 32-token greedy continuations.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from modelc.engine import EngineOptions, LLMEngine, build_engine
from modelc.engine.api import FinishEvent, FinishReason, GenerationRequest
from modelc.errors import UsageError
from modelc.families.contract import rope_inv_freq
from modelc.formats import load_model
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import Decoder, build
from modelc.runtime.kv_cache import KVMode
from modelc.runtime.model import SeqChunk
from modelc.runtime.sampling import SamplingParams
from modelc.runtime.tokenizer import Tokenizer
from tests.assets import smollm2_gguf
from tests.runtime_support import (
    LOGPROB_TOL,
    check_record,
    check_records,
    first_divergence,
    golden,
    make_backend,
)

RECORDS: list[dict[str, Any]] = golden("smollm2.json")["records"]
FAST = [0, 8, 22]  # a plain prompt, code, a chat-templated prompt


@pytest.fixture(scope="module")
def ir() -> ModelIR:
    return load_model(smollm2_gguf())


def build_llama(ir: ModelIR, backend: str) -> Decoder:
    m = build(ir, make_backend(backend))
    assert isinstance(m, Decoder)
    return m


@pytest.fixture(scope="module")
def model(ir: ModelIR) -> Decoder:
    """The compiled kernels in f32-activation mode (fast); the numpy twins run in the slow tests."""
    return build_llama(ir, "cpu-exact")


def test_goldens_cover_the_issue() -> None:
    assert len(RECORDS) >= 20
    assert sum("chat" in r for r in RECORDS) >= 3
    assert all(len(r["greedy"]) == 32 and len(r["top_ids"]) == 10 for r in RECORDS)


@pytest.mark.parametrize("i", FAST)
def test_smollm2_matches_transformers(model: Decoder, i: int) -> None:
    err, gen = check_record(model, RECORDS[i])
    assert err <= LOGPROB_TOL, f"prompt {i}: top-10 logprob error {err:.2e}"
    assert gen == RECORDS[i]["greedy"], (
        f"prompt {i}: diverges at {first_divergence(gen, RECORDS[i]['greedy'])}"
    )


@pytest.mark.slow
def test_smollm2_all_prompts_numpy(ir: ModelIR) -> None:
    """The numpy twins: every prompt's top-10 logprobs and greedy continuation, the
    prompts decoded in one batch (check_records)."""
    results = check_records(build_llama(ir, "numpy"), RECORDS)
    errs = [err for err, _ in results]
    diverged = [
        (i, first_divergence(gen, r["greedy"]))
        for i, ((_, gen), r) in enumerate(zip(results, RECORDS, strict=True))
        if gen != r["greedy"]
    ]
    assert max(errs) <= LOGPROB_TOL, f"max top-10 logprob error {max(errs):.2e}"
    assert not diverged, f"greedy continuations diverge (prompt, token): {diverged}"


@pytest.mark.slow
def test_smollm2_all_prompts_cpu_exact_kernels(model: Decoder) -> None:
    # every prompt decoded in one batch (check_records; each row as alone)
    for i, (r, (err, gen)) in enumerate(zip(RECORDS, check_records(model, RECORDS), strict=True)):
        assert err <= LOGPROB_TOL, f"prompt {i}: top-10 logprob error {err:.2e}"
        assert gen == r["greedy"], f"prompt {i}: diverges at {first_divergence(gen, r['greedy'])}"


def test_batched_forward_equals_one_at_a_time(model: Decoder) -> None:
    """8 sequences of different lengths, prefill chunks and decode steps mixed in one batch.

    Tolerance: every logit within 1e-5 absolute (logits span about -5..20), and the same
    argmax everywhere.  Measured: 0.0 with the compiled kernels (each output row is
    computed the same way whatever the batch); the numpy twins differ by up to 9e-4
    because BLAS sums a (1, d) and an (n, d) product in different orders over 30 layers.
    """
    rng = np.random.default_rng(0)
    lengths = [3, 10, 6, 1, 12, 5, 8, 14]
    seqs = [rng.integers(0, model.n_vocab, n).tolist() for n in lengths]
    ref = []
    for s in seqs:
        c = model.new_cache()
        ref.append(model.forward([SeqChunk(c, s, tuple(range(len(s))))]))  # (len, vocab)
    # each sequence: a first chunk of a different size, then 1-token decode steps
    first = [3, 6, 2, 1, 8, 5, 1, 9]
    caches = [model.new_cache() for _ in seqs]
    done = [0] * len(seqs)
    got: list[list[np.ndarray]] = [[] for _ in seqs]
    steps = 0
    while any(d < len(s) for d, s in zip(done, seqs, strict=True)):
        batch, who = [], []
        for j, s in enumerate(seqs):
            if done[j] >= len(s):
                continue
            n = first[j] if done[j] == 0 else 1
            part = s[done[j] : done[j] + n]
            batch.append(SeqChunk(caches[j], part, tuple(range(len(part)))))
            who.append((j, len(part)))
            done[j] += len(part)
        logits = model.forward(batch)
        assert logits.shape == (sum(n for _, n in who), model.n_vocab)
        row = 0
        for j, n in who:
            got[j].append(logits[row : row + n])
            row += n
        steps += 1
    assert steps == max(len(s) - f + 1 for s, f in zip(seqs, first, strict=True))
    for j in range(len(seqs)):
        batched = np.concatenate(got[j])
        np.testing.assert_allclose(batched, ref[j], rtol=0, atol=1e-5)
        assert np.array_equal(batched.argmax(-1), ref[j].argmax(-1))
        assert caches[j].n == lengths[j]


def test_logit_rows_selection(model: Decoder) -> None:
    toks = [1, 504, 3458, 282]
    all_rows = model.forward([SeqChunk(model.new_cache(), toks, (0, 1, 2, 3))])
    last = model.forward([SeqChunk(model.new_cache(), toks)])
    none = model.forward([SeqChunk(model.new_cache(), toks, ())])
    np.testing.assert_allclose(last[0], all_rows[3], atol=1e-4)
    assert none.shape == (0, model.n_vocab)


# Measured on the 26 golden prompts (cpu-exact kernels, hot window 16 for mixed):
#   int8:  max top-10 logprob error 0.198, greedy identical 17/26
#   mixed: max top-10 logprob error 0.061, greedy identical 24/26
# SmolLM2 is very sensitive to key noise: rounding keys to f16 alone moves the top-10
# logprobs by 0.006, 0.1% relative noise by 0.027; int8 keys (step = max/127 per 32
# elements) move them by ~0.2 whatever the group size (8..64 tried).  The bounds below
# are those measurements with some room.
KV_BOUNDS = {KVMode.INT8: (0.3, 14), KVMode.MIXED: (0.1, 22)}


@pytest.mark.parametrize("mode", [KVMode.INT8, KVMode.MIXED])
def test_quantized_kv_cache_on_a_prompt(model: Decoder, mode: KVMode) -> None:
    r = RECORDS[5]  # "Water boils at a temperature of" (6 tokens; int8 error 0.06)
    err, gen = check_record(model, r, mode)
    assert err <= KV_BOUNDS[mode][0], f"{mode}: top-10 logprob error {err:.3f}"
    if mode is KVMode.MIXED:
        # the hot window (16) covers prompt + 10 tokens exactly: identical that far
        assert gen[:10] == r["greedy"][:10]
    else:
        assert gen[:8] == r["greedy"][:8]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [KVMode.INT8, KVMode.MIXED])
def test_quantized_kv_cache_all_prompts(model: Decoder, mode: KVMode) -> None:
    results = check_records(model, RECORDS, mode)
    errs = [err for err, _ in results]
    matches = sum(gen == r["greedy"] for (_, gen), r in zip(results, RECORDS, strict=True))
    print(
        f"{mode}: max top-10 logprob error {max(errs):.4f}, greedy identical {matches}/{len(RECORDS)}"
    )
    max_err, min_matches = KV_BOUNDS[mode]
    assert max(errs) <= max_err
    assert matches >= min_matches


# f16 KV cache (the engine's default), measured on all 26 golden prompts (cpu-exact
# kernels): max top-10 logprob error vs the f32 goldens 0.0084 (median 0.0020; f32
# caches: 2.5e-5), greedy continuations identical 26/26; along prompt + greedy text the
# logits of f16 and f32 caches differ by at most 0.033 (median over prompts 0.015).
# f16 keeps 11 significant bits, so each key/value moves by <= 2^-11 relative; the
# bounds below are those measurements with 2-3x room.
F16_LOGPROB_BOUND = 0.02
F16_LOGIT_BOUND = 0.1


def test_f16_kv_cache_close_to_f32(model: Decoder) -> None:
    for i in FAST:
        r = RECORDS[i]
        err, gen = check_record(model, r, KVMode.F16)
        assert err <= F16_LOGPROB_BOUND, f"prompt {i}: top-10 logprob error {err:.4f}"
        assert gen == r["greedy"], f"prompt {i}: diverges at {first_divergence(gen, r['greedy'])}"
        toks = r["prompt_ids"] + r["greedy"][:-1]
        rows = tuple(range(len(r["prompt_ids"]) - 1, len(toks)))
        logits = {
            mode: model.forward([SeqChunk(model.new_cache(mode), toks, rows)])
            for mode in (KVMode.F32, KVMode.F16)
        }
        diff = float(np.abs(logits[KVMode.F32] - logits[KVMode.F16]).max())
        assert 0 < diff <= F16_LOGIT_BOUND, f"prompt {i}: logits differ by {diff:.4f}"


@pytest.mark.slow
def test_f16_kv_cache_all_prompts(model: Decoder) -> None:
    results = check_records(model, RECORDS, KVMode.F16)
    errs = [err for err, _ in results]
    matches = sum(gen == r["greedy"] for (_, gen), r in zip(results, RECORDS, strict=True))
    print(
        f"f16: max top-10 logprob error {max(errs):.4f}, greedy identical {matches}/{len(RECORDS)}"
    )
    assert max(errs) <= F16_LOGPROB_BOUND
    assert matches >= len(RECORDS) - 2


def test_batched_forward_equals_one_at_a_time_f16(model: Decoder) -> None:
    """With f16 caches, batching changes nothing either: bit-identical logits."""
    rng = np.random.default_rng(2)
    seqs = [rng.integers(0, model.n_vocab, n).tolist() for n in (5, 12, 1, 9)]
    ref = [
        model.forward([SeqChunk(model.new_cache(KVMode.F16), s, tuple(range(len(s))))])
        for s in seqs
    ]
    caches = [model.new_cache(KVMode.F16) for _ in seqs]
    first = [2, 7, 1, 4]
    got = [
        [x]
        for x in np.split(
            model.forward(
                [
                    SeqChunk(c, s[:f], tuple(range(f)))
                    for c, s, f in zip(caches, seqs, first, strict=True)
                ]
            ),
            np.cumsum(first)[:-1],
        )
    ]
    for step in range(1, max(len(s) - f for s, f in zip(seqs, first, strict=True)) + 1):
        who = [j for j, (s, f) in enumerate(zip(seqs, first, strict=True)) if f + step <= len(s)]
        tok = [seqs[j][first[j] + step - 1] for j in who]
        out = model.forward([SeqChunk(caches[j], [t], (0,)) for j, t in zip(who, tok, strict=True)])
        for row, j in enumerate(who):
            got[j].append(out[row : row + 1])
    for j in range(len(seqs)):
        np.testing.assert_array_equal(np.concatenate(got[j]), ref[j])


def test_context_shift_with_f16_cache(model: Decoder) -> None:
    """An f16 cache's keys are re-rotated in f32 and rounded to f16 again: layer-0 keys
    match a fresh computation within f16 rounding (2^-11 relative, twice), values exactly."""
    toks = np.random.default_rng(1).integers(0, model.n_vocab, 40).tolist()
    c = model.new_cache(KVMode.F16)
    model.forward([SeqChunk(c, toks)])
    model.shift_context(c, n_keep=4, n_discard=15)
    fresh = model.new_cache(KVMode.F16)
    model.forward([SeqChunk(fresh, toks[:4] + toks[19:])])
    assert c.n == fresh.n == 25
    k_shift, v_shift = c.read(0, 25)
    k_fresh, v_fresh = fresh.read(0, 25)
    assert k_shift.dtype == np.float16
    np.testing.assert_allclose(
        k_shift.astype(np.float32), k_fresh, atol=float(np.abs(k_fresh).max()) * 2.0**-9
    )
    np.testing.assert_array_equal(v_shift, v_fresh)


def test_context_shift_rerotates_keys_exactly(model: Decoder) -> None:
    """Layer-0 keys depend only on token and position, so after a shift they must equal
    a fresh computation of the kept tokens at their new positions."""
    toks = np.random.default_rng(1).integers(0, model.n_vocab, 40).tolist()
    c = model.new_cache()
    model.forward([SeqChunk(c, toks)])
    model.shift_context(c, n_keep=4, n_discard=15)
    kept = toks[:4] + toks[19:]
    fresh = model.new_cache()
    model.forward([SeqChunk(fresh, kept)])
    assert c.n == fresh.n == 25
    k_shift, v_shift = c.read(0, 25)
    k_fresh, v_fresh = fresh.read(0, 25)
    np.testing.assert_allclose(k_shift, k_fresh, atol=2e-5)
    np.testing.assert_array_equal(v_shift, v_fresh)


@pytest.fixture(scope="module")
def tokenizer(ir: ModelIR) -> Tokenizer:
    assert ir.tokenizer is not None
    return Tokenizer(ir.tokenizer)


def exact_engine(ir: ModelIR, **kw: Any) -> LLMEngine:
    """The engine on the compiled kernels in f32-activation mode, f32 KV, as the goldens."""
    opts = EngineOptions(kv_cache="f32", speculative=False, **kw)
    return build_engine(ir, opts, backend=make_backend("cpu-exact"))


async def engine_run(
    eng: LLMEngine, prompt: list[int], p: SamplingParams, ignore_eos: bool = False
) -> tuple[list[int], str, FinishEvent]:
    """One request through the engine: (token ids, text, finish event)."""
    toks, text, fin = [], "", None
    async with trio.open_nursery() as n:
        await n.start(eng.run)
        async for ev in eng.submit(GenerationRequest("r", prompt, p, ignore_eos=ignore_eos)):
            text += ev.text
            if isinstance(ev, FinishEvent):
                fin = ev
            else:
                toks.append(ev.token_id)
        n.cancel_scope.cancel()
    assert fin is not None
    return toks, text, fin


# ignore_eos bans the end-of-generation ids (as llama.cpp): hold it to a golden
# continuation that has none (the goldens' greedy runs do not stop at EOS)
NO_EOG = next(r for r in RECORDS if not {0, 1, 2} & set(r["greedy"]))


async def test_engine_streams_the_greedy_text(ir: ModelIR) -> None:
    r = NO_EOG
    eng = exact_engine(ir)
    p = SamplingParams(temperature=0, max_tokens=32)
    toks, text, fin = await engine_run(eng, r["prompt_ids"], p, ignore_eos=True)
    assert toks == r["greedy"]
    assert text == r["greedy_text"]  # transformers' decode
    assert fin.reason is FinishReason.LENGTH
    assert fin.completion_tokens == 32 and fin.prompt_tokens == len(r["prompt_ids"])


async def test_engine_stop_string_and_stop_token(ir: ModelIR) -> None:
    r = RECORDS[0]
    text = r["greedy_text"]
    stop = text[12:16]
    eng = exact_engine(ir)
    p = SamplingParams(temperature=0, max_tokens=32, stop=[stop])
    _, out, fin = await engine_run(eng, r["prompt_ids"], p)
    assert out == text[: text.find(stop)] and fin.reason is FinishReason.STOP
    # the 5th greedy token declared a stop token: generation ends there, without its text
    p = SamplingParams(temperature=0, max_tokens=32, stop_token_ids=[r["greedy"][4]])
    toks, out, fin = await engine_run(eng, r["prompt_ids"], p)
    assert toks == r["greedy"][:4] and fin.reason is FinishReason.STOP
    assert fin.completion_tokens == 5  # the stop token counts, as OpenAI's usage does
    assert eng.tok is not None and out == eng.tok.decode(r["greedy"][:4])


async def test_engine_sampling_is_seeded(ir: ModelIR) -> None:
    ids = RECORDS[1]["prompt_ids"]
    eng = exact_engine(ir)

    async def run(seed: int) -> list[int]:
        p = SamplingParams(temperature=1.0, top_p=0.95, seed=seed, max_tokens=8, logprobs=3)
        return (await engine_run(eng, ids, p, ignore_eos=True))[0]

    a = await run(11)
    assert a == await run(11)
    assert a != await run(12) or a != await run(13)


async def test_generation_continues_past_the_context_when_shifting(ir: ModelIR) -> None:
    r = NO_EOG
    eng = exact_engine(ir, max_context=24, context_shift=True, anchor_tokens=4)
    p = SamplingParams(temperature=0, max_tokens=40)
    toks, _, fin = await engine_run(eng, r["prompt_ids"], p, ignore_eos=True)
    assert len(toks) == 40 and fin.reason is FinishReason.LENGTH
    # before the first shift the tokens are the plain greedy continuation
    n_before = 24 - len(r["prompt_ids"]) + 1
    assert toks[:n_before] == r["greedy"][:n_before]


def test_cli_generate_prints_exactly_the_greedy_text() -> None:
    r = RECORDS[3]
    assert 0 not in r["greedy"] and 2 not in r["greedy"]  # no EOS: runs all 32 tokens
    cmd = [sys.executable, "-m", "modelc.cli", "generate", str(smollm2_gguf()), r["prompt"]]
    env = {**os.environ, "MODELC_MATMUL": "exact"}  # f32 activations, as the golden
    res = subprocess.run(
        [*cmd, "--max-tokens", "32", "--temperature", "0", "--kv-cache", "f32"],
        capture_output=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stderr.decode()
    # stdout is the generated text only, exactly as transformers decodes the greedy tokens
    assert res.stdout.decode("utf-8") == r["greedy_text"]
    assert b"tok/s" in res.stderr


def test_cli_generate_chat_stops_at_end_of_turn(tokenizer: Tokenizer) -> None:
    r = RECORDS[22]  # "What is the capital of Germany?": greedy reply then <|im_end|> (id 2)
    n = r["greedy"].index(2)
    cmd = [
        sys.executable,
        "-m",
        "modelc.cli",
        "generate",
        str(smollm2_gguf()),
        r["chat"][0]["content"],
    ]
    env = {**os.environ, "MODELC_MATMUL": "exact"}
    res = subprocess.run(
        [*cmd, "--chat", "--max-tokens", "32", "--temperature", "0", "--kv-cache", "f32"],
        capture_output=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stderr.decode()
    assert res.stdout.decode("utf-8") == tokenizer.decode(r["greedy"][:n])
    assert b"finish: stop" in res.stderr


def test_cli_generate_rejects_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 4)
    res = subprocess.run(
        [sys.executable, "-m", "modelc.cli", "generate", str(bad), "hi"],
        capture_output=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert res.stderr.startswith(b"modelc: error:") and b"Traceback" not in res.stderr
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "modelc.cli",
            "generate",
            str(smollm2_gguf()),
            "hi",
            "--max-tokens",
            "-1",
        ],
        capture_output=True,
        timeout=120,
    )
    assert res.returncode == 2 and b"--max-tokens" in res.stderr


def test_rope_scaling_inverse_frequencies() -> None:
    from modelc.formats.ir import RopeScaling

    base = rope_inv_freq(64, 10000.0, RopeScaling())
    assert base[0] == 1.0 and base.shape == (32,)
    np.testing.assert_allclose(
        rope_inv_freq(64, 10000.0, RopeScaling(type="linear", factor=4.0)), base / 4
    )
    l3 = rope_inv_freq(
        64,
        500000.0,
        RopeScaling(
            type="llama3",
            factor=8.0,
            original_max_position=8192,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
        ),
    )
    plain = rope_inv_freq(64, 500000.0, RopeScaling())
    wavelen = 2 * np.pi / plain
    np.testing.assert_allclose(l3[wavelen < 8192 / 4], plain[wavelen < 8192 / 4])  # high freq kept
    np.testing.assert_allclose(
        l3[wavelen > 8192], plain[wavelen > 8192] / 8, rtol=1e-6
    )  # low freq scaled
    mid = (wavelen >= 8192 / 4) & (wavelen <= 8192)
    assert np.all((l3[mid] <= plain[mid]) & (l3[mid] >= plain[mid] / 8))


def test_wrong_head_count_is_a_format_error(ir: ModelIR) -> None:
    import copy

    import msgspec

    from modelc.errors import FormatError

    bad = copy.copy(ir)
    bad.hparams = msgspec.structs.replace(ir.hparams, n_head_kv=1)  # attn_k has 3 heads' rows
    with pytest.raises(FormatError, match=r"attn_k\.weight has 192 rows"):
        build(bad, make_backend("numpy"))
    m = build_llama(ir, "numpy")
    with pytest.raises(UsageError, match="out of range"):
        m.forward([SeqChunk(m.new_cache(), [ir.hparams.n_vocab])])
