"""Mistral 3 / Pixtral vision against transformers and llama.cpp (``tests/golden/pixtral.json``,
``scripts/make_tiny_pixtral.py``) on the tiny model of ``tests/gen_pixtral.py``: pixel
values equal ``PixtralImageProcessor``'s, image embeddings (2-D RoPE tower, patch merger,
projector) within 1e-4 of transformers', the model and mmproj GGUFs the converter's tensor
for tensor, the release-shaped template's image placed as ``PixtralProcessor`` places it
(rows of ``[IMG]``, ``[IMG_BREAK]`` between, ``[IMG_END]``), and in ``exact`` mode the
first answer token's log-probabilities and the greedy answer equal transformers'; the
prompt token count and greedy answer equal llama.cpp's mtmd server's, and the ``openai``
client's ``image_url`` gets the same answer from ``modelc run``."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelc.engine import EngineOptions, build_engine
from modelc.errors import UsageError
from modelc.runtime.model import ImageSpan, LanguageModel
from modelc.vision import VisionModel
from tests import net
from tests.gen_pixtral import IMG, IMG_BREAK, ensure_model, make_weights
from tests.gguf_support import manifest, unnamed
from tests.runtime_support import (
    assert_greedy_as_golden,
    engine_in_turn,
    exact_lm,
    golden,
    vision_engine,
)
from tests.vision_support import chat_format, place_chat

GOLD: dict[str, Any] = golden("pixtral.json")
FIX = Path(__file__).parent / "fixtures"
CASES = [pytest.param(c, id=c["image"].split("/")[-1]) for c in GOLD["cases"]]
BREAK = "v.token_embd.img_break"  # llama.cpp needs it; this converter leaves it out


@pytest.fixture(scope="module")
def vision() -> VisionModel:
    return VisionModel(ensure_model()[2])


@pytest.fixture(scope="module")
def lm() -> LanguageModel:
    return exact_lm(ensure_model()[1])


def _bytes(case: dict[str, Any]) -> bytes:
    return (FIX / case["image"]).read_bytes()


@pytest.mark.parametrize("case", CASES)
def test_pixels_equal_the_processor(vision: VisionModel, case: dict[str, Any]) -> None:
    got = vision.pixels(_bytes(case))
    assert [1, *got.shape] == case["pixel_shape"] and list(got.shape[1:]) == case["image_size"]
    flat = got.reshape(-1).astype(np.float64)
    want = np.asarray(case["pixel_sample"])
    np.testing.assert_allclose(flat[:: GOLD["pixel_stride"]], want, atol=1e-6, rtol=0)
    assert abs(flat.sum() - case["pixel_sum"]) < 1e-3
    assert abs(np.abs(flat).sum() - case["pixel_abs_sum"]) < 1e-3


@pytest.mark.parametrize("case", CASES)
def test_embeddings_equal_transformers(vision: VisionModel, case: dict[str, Any]) -> None:
    want = np.asarray(case["embeddings"], np.float32)
    got = vision.embed(_bytes(case))
    h, w = case["image_size"]
    assert got.shape == (h // 28, w // 28, 64)
    np.testing.assert_allclose(got.reshape(-1, 64), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["model", "mmproj"])
def test_ggufs_are_the_converters(kind: str) -> None:
    """Ours equal the converter's, key for key and tensor for tensor, but the mmproj's
    ``[IMG_BREAK]`` row, which llama.cpp's ``clip.cpp`` requires and this converter drops
    for an HF directory: it is the text model's embedding of ``[IMG_BREAK]``."""
    _, gg, mm = ensure_model()
    ours, theirs = manifest(gg if kind == "model" else mm), GOLD["converter"][kind]
    assert unnamed(ours["metadata"]) == unnamed(theirs["metadata"])
    assert [t for t in ours["tensors"] if t["name"] != BREAK] == theirs["tensors"]
    if kind == "mmproj":
        from modelc.formats.gguf import read_gguf

        row = read_gguf(mm)[1][BREAK].data()
        want = make_weights()["language_model.model.embed_tokens.weight"][IMG_BREAK]
        np.testing.assert_array_equal(row, want)


def _placed(vision: VisionModel, data: bytes) -> tuple[list[int], tuple[ImageSpan, ...]]:
    """The release-shaped template through modelc's template path, the image placed."""
    fmt = chat_format(ensure_model()[1])
    placed = place_chat(vision, fmt, data, GOLD["question"])
    return placed.ids, placed.images


@pytest.mark.parametrize("case", CASES)
def test_placed_and_answered_as_transformers(
    vision: VisionModel, lm: LanguageModel, case: dict[str, Any]
) -> None:
    """The prompt ids are the processor's (a span a row of ``[IMG]``, ``[IMG_BREAK]``
    tokens between, ``[IMG_END]``); the first token's log-probabilities and the greedy
    answer transformers'."""
    ids, spans = _placed(vision, _bytes(case))
    assert ids == case["prompt_ids"]
    h, w = case["image_size"]
    assert len(spans) == h // 28 and all(s.end - s.start == w // 28 for s in spans)
    assert all(ids[s.start : s.end] == [IMG] * (w // 28) for s in spans)
    assert_greedy_as_golden(lm, ids, case, spans)


async def test_engine_answers_in_chunks_and_from_the_prefix_cache(vision: VisionModel) -> None:
    """Through the engine, prompts fed 3 tokens a step (an image's rows split between
    chunks): each image's answer; a repeated image's prompt served from the prefix cache
    past its first row gives the same answer (the other image's, only up to it)."""
    from modelc.engine.api import GenerationRequest
    from modelc.runtime.sampling import SamplingParams

    _, gg, mm = ensure_model()
    eng = vision_engine(gg, mm, 3, 4)
    cases = GOLD["cases"][:2] * 2
    placed = [_placed(vision, _bytes(case)) for case in cases]
    reqs = [
        GenerationRequest(
            f"r{i}",
            ids,
            SamplingParams(temperature=0, max_tokens=len(case["greedy"])),
            ignore_eos=True,
            images=spans,
        )
        for i, ((ids, spans), case) in enumerate(zip(placed, cases, strict=True))
    ]
    got = await engine_in_turn(eng, reqs)
    for k, ((toks, cached), (_, spans), case) in enumerate(zip(got, placed, cases, strict=True)):
        assert toks == case["greedy"], case["image"]
        assert (cached > spans[0].end) == (k >= 2), (k, cached)


def test_text_alone_equals_transformers_from_gguf_and_hf(lm: LanguageModel) -> None:
    """The text GGUF, and the HF directory (``language_model.`` weights, ``text_config``;
    its vision tower left out)."""
    t = GOLD["text"]
    hf = exact_lm(ensure_model()[0])
    for model in (lm, hf):
        assert_greedy_as_golden(model, t["prompt_ids"], t)


def test_a_projector_of_another_family_is_refused_at_start() -> None:
    """Mistral 3's projector with Gemma 3's or Qwen2.5-VL's model, and Qwen's with Mistral
    3's: one line at start."""
    from tests import gen_gemma3vl, gen_qwen25vl

    _, gg, mm = ensure_model()
    gemma = gen_gemma3vl.ensure_model()[1]
    _, qwen, qwen_mm = gen_qwen25vl.ensure_model()
    for model, proj in ((gemma, mm), (qwen, mm), (gg, qwen_mm)):
        with pytest.raises(UsageError, match="does not go with") as e:
            build_engine(model, EngineOptions(mmproj=str(proj)))
        assert "\n" not in str(e.value)


def test_llamacpp_counts_the_same_prompt_and_answers_alike(tmp_path: Path) -> None:
    """llama.cpp's server (``--mmproj``) on the image already of a size both keep (its
    sides multiples of 28 and within mtmd's 8..1024 tokens: no resize, where llama.cpp's
    own bicubic would give other pixels): the same prompt token count and transformers'
    greedy answer, which modelc gives above."""
    pytest.importorskip("xllamacpp")

    from modelc.bench.llamacpp import LlamaCppServer

    case = next(c for c in GOLD["cases"] if c["image"].endswith("scene.png"))
    _, gg, mm = ensure_model()
    body = {
        "prompt": {
            "prompt_string": case["prompt_text"].replace("[IMG]", "<__media__>"),
            "multimodal_data": [base64.b64encode(_bytes(case)).decode()],
        },
        "n_predict": len(case["greedy"]),
        "temperature": 0,
        "samplers": ["top_k"],
        "top_k": 1,
        "ignore_eos": True,
        "cache_prompt": False,
        "return_tokens": True,
    }
    marker = {"LLAMA_MEDIA_MARKER": "<__media__>"}  # the server's own is random
    with LlamaCppServer(
        gg, threads=1, n_parallel=1, n_ctx=512, log=tmp_path / "lc.log", mmproj=mm, env=marker
    ) as s:
        r = net.post(f"{s.url}/completion", json=body, timeout=120).json()
    assert r["tokens_evaluated"] == len(case["prompt_ids"]), r.get("tokens_evaluated")
    assert r["tokens"] == case["greedy"]


def test_openai_image_url_answers_as_transformers() -> None:
    """``modelc run --mmproj`` (``exact``, f32 KV cache): the ``openai`` client's
    ``image_url`` data URL gets transformers' greedy answer, with the processor's prompt
    token count; the ``ollama`` client's ``images`` the same."""
    from tests.peers import ollama_and_openai_answers, openai_image_greedy, serve_exact

    case = next(c for c in GOLD["cases"] if c["image"].endswith("scene.png"))
    _, gg, mm = ensure_model()
    server = serve_exact(gg, mm)
    srv = next(server)
    try:
        q = GOLD["question"]
        n, ids = openai_image_greedy(srv, "pixtral", _bytes(case), q, len(case["greedy"]))
        got, want, n_ollama = ollama_and_openai_answers(srv, "pixtral", FIX / case["image"], q, 4)
    finally:
        next(server, None)  # stops it
    assert n == len(case["prompt_ids"]) and ids == case["greedy"]
    assert got == want
    assert n_ollama == len(case["prompt_ids"])
