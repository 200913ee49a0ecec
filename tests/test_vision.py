"""The vision part against transformers and llama.cpp's converter (``tests/golden/gemma3vl.json``,
``scripts/make_tiny_gemma3vl.py``) on the tiny Gemma 3 VLM of ``tests/gen_gemma3vl.py``:
pixel values equal the processor's, image embeddings within 1e-4 of the vision tower +
projector, the mmproj GGUF the converter's byte for byte, and in ``exact`` mode the first
answer token's log-probabilities and the greedy answer equal transformers' (the image's
positions attending to each other both ways; causal attention there moves the
log-probabilities by ~1e-3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from modelc.engine import EngineOptions, build_engine
from modelc.engine.api import FinishEvent, GenerationRequest, TokenEvent
from modelc.errors import FormatError
from modelc.runtime.model import ImageSpan, LanguageModel, SeqChunk
from modelc.runtime.sampling import SamplingParams
from modelc.vision import VisionModel
from tests.gen_gemma3vl import SPECIAL, ensure_model
from tests.gguf_support import manifest
from tests.runtime_support import exact_lm, golden, make_backend

GOLD: dict[str, Any] = golden("gemma3vl.json")
IMAGES = Path(__file__).parent / "fixtures" / "vision"
CASES = [pytest.param(c, id=c["image"]) for c in GOLD["cases"]]


@pytest.fixture(scope="module")
def vision() -> VisionModel:
    return VisionModel(ensure_model()[2])


@pytest.fixture(scope="module")
def lm() -> LanguageModel:
    return exact_lm(ensure_model()[1])


def _bytes(case: dict[str, Any]) -> bytes:
    return (IMAGES / case["image"]).read_bytes()


@pytest.mark.parametrize("case", CASES)
def test_pixels_equal_the_processor(vision: VisionModel, case: dict[str, Any]) -> None:
    want = np.asarray(case["pixel_values"], np.float32).reshape(case["pixel_shape"])
    np.testing.assert_allclose(vision.pixels(_bytes(case)), want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("case", CASES)
def test_embeddings_equal_transformers(vision: VisionModel, case: dict[str, Any]) -> None:
    want = np.asarray(case["embeddings"], np.float32)
    got = vision.embed(_bytes(case))
    assert got.shape == want.shape == (vision.tokens_per_image, 64)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_mmproj_is_the_converters() -> None:
    ours, theirs = manifest(ensure_model()[2]), GOLD["converter"]["mmproj"]
    naming = ("general.name", "general.size_label")  # from the directory's name
    drop = {k: v for k, v in theirs["metadata"].items() if k not in naming}
    assert {k: v for k, v in ours["metadata"].items() if k not in naming} == drop
    assert ours["tensors"] == theirs["tensors"]


def _span(vision: VisionModel, case: dict[str, Any], *, bidirectional: bool = True) -> ImageSpan:
    ids = case["prompt_ids"]
    start = ids.index(SPECIAL["<image_soft_token>"])
    return ImageSpan(start, vision.embed(_bytes(case)), bidirectional)


@pytest.mark.parametrize("case", CASES)
def test_greedy_answer_equals_transformers(
    vision: VisionModel, lm: LanguageModel, case: dict[str, Any]
) -> None:
    span, ids = _span(vision, case), case["prompt_ids"]
    cache = lm.new_cache(max_tokens=128)
    logits = lm.forward([SeqChunk(cache, ids, None, (span,))])
    x = logits[-1].astype(np.float64)
    lp = x - x.max() - np.log(np.exp(x - x.max()).sum())
    for tok, want in case["top_logprobs"]:
        assert abs(lp[tok] - want) < 1e-4, (tok, lp[tok], want)
    out = []
    for _ in case["greedy"]:
        out.append(int(np.argmax(logits[-1])))
        logits = lm.forward([SeqChunk(cache, [out[-1]], None, (span,))])
    assert out == case["greedy"]


def test_causal_image_attention_would_differ(vision: VisionModel, lm: LanguageModel) -> None:
    """The check above can fail: the same image attended causally moves the log-probs."""
    case = GOLD["cases"][0]
    lps = []
    for bidi in (True, False):
        cache = lm.new_cache(max_tokens=128)
        span = _span(vision, case, bidirectional=bidi)
        x = lm.forward([SeqChunk(cache, case["prompt_ids"], None, (span,))])[-1]
        lps.append(x.astype(np.float64))
    assert np.abs(lps[0] - lps[1]).max() > 1e-3


async def _answers(
    vision: VisionModel, opt: EngineOptions, reqs: list[tuple[list[int], dict[str, Any]]]
) -> list[tuple[list[int], int, list[float]]]:
    """Greedy answers (cached prompt tokens, each token's log-probability) of prompts with one case's image each,
    one after another through one engine."""
    _, gg, mm = ensure_model()
    opt.mmproj, opt.kv_cache, opt.speculative = str(mm), "f32", False
    eng = build_engine(gg, opt, backend=make_backend("cpu-exact"))
    out = []
    async with trio.open_nursery() as n:
        await n.start(eng.run)
        for i, (ids, case) in enumerate(reqs):
            p = SamplingParams(temperature=0, max_tokens=len(case["greedy"]), logprobs=0)
            span = _span(vision, case)
            req = GenerationRequest(f"r{i}", ids, p, ignore_eos=True, images=(span,))
            toks, lps, cached = [], [], -1
            async for ev in eng.submit(req):
                if isinstance(ev, TokenEvent):
                    toks.append(ev.token_id)
                    lps.append(ev.logprob or 0.0)
                elif isinstance(ev, FinishEvent):
                    cached = ev.cached_tokens
            out.append((toks, cached, lps))
        n.cancel_scope.cancel()
    return out


async def test_engine_answers_each_image_in_chunks(vision: VisionModel) -> None:
    """Through the engine, prompts fed 5 tokens a step (the image's 4 positions taken
    whole by one chunk): the same prompt ids with each image give that image's answer,
    and the prefix cache (blocks keyed by the image's hash) serves a repeated image's
    prompt and no other image's."""
    cases = GOLD["cases"]
    opt = EngineOptions(prefill_chunk=5)
    got = await _answers(vision, opt, [(c["prompt_ids"], c) for c in cases * 2])
    for k, ((toks, cached, _), case) in enumerate(zip(got, cases * 2, strict=True)):
        assert toks == case["greedy"], case["image"]
        assert cached == (0 if k < len(cases) else 32), (k, cached)  # 32: one block


async def test_a_prefix_cached_into_an_image_is_completed(vision: VisionModel) -> None:
    """Blocks of 5 tokens: a second prompt with the same image but another question
    reuses the cache up to position 10, inside the image (9..12); its other positions are
    computed attending to the whole image (both ways), as without the cache."""
    case = GOLD["cases"][0]
    ids = case["prompt_ids"]
    other = [*ids[:14], *reversed(ids[14:29]), *ids[29:]]  # blank and question reversed
    reqs = [(ids, case), (other, case)]
    cached = await _answers(vision, EngineOptions(prefix_block_tokens=5), reqs)
    fresh = await _answers(vision, EngineOptions(prefix_cache_bytes=0), reqs[1:])
    assert cached[1][1] == 10
    assert cached[1][0] == fresh[0][0]
    np.testing.assert_allclose(cached[1][2], fresh[0][2], atol=1e-5)


def test_a_model_file_is_no_projector() -> None:
    """--mmproj given the model's own GGUF: one line at start."""
    _, gg, _ = ensure_model()
    with pytest.raises(FormatError, match="no vision projector"):
        build_engine(gg, EngineOptions(mmproj=str(gg)))


def test_inspect_says_how_each_projector_sizes_an_image(tmp_path: Path) -> None:
    """``modelc inspect``'s vision line: Gemma 3's fixed tokens an image, SmolVLM's per
    tile, a Qwen image's a token per merged patch square (its count set by the image)."""
    import shutil

    from modelc.cli.store import _vision
    from modelc.store import mmproj_beside_path
    from tests import gen_qwen25vl, gen_smolvlm

    art = tmp_path / "1.modelc"
    want = {
        gen_smolvlm: "images up to 64px in 32px tiles and the whole, 16 tokens each",
        gen_qwen25vl: "a token per 28x28 pixels of the resized image",
    }
    for gen, text in want.items():
        shutil.copy(gen.ensure_model()[2], mmproj_beside_path(art))
        got = _vision(art)
        assert got is not None and got["images"] == text, got
