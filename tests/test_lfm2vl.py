"""LFM2-VL against transformers and llama.cpp (``tests/golden/lfm2vl.json``,
``scripts/make_tiny_lfm2vl.py``) on the tiny model of ``tests/gen_lfm2vl.py``: pixel
values equal ``Lfm2VlImageProcessor``'s, image embeddings (SigLIP2 with its position
grid resized to the image's, the pixel unshuffle, the projector's layer norm and MLP)
within 1e-4 of transformers', the model and mmproj GGUFs the converter's tensor for
tensor, and in ``exact`` mode the first answer token's log-probabilities and the greedy
answer equal transformers' (the image's ``<|image_start|>``, one ``<image>`` per
embedding, ``<|image_end|>``); llama.cpp's mtmd server counts the same prompt and gives
the same answer; the ``openai`` client's ``image_url`` gets it from ``modelc run``."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelc.engine import EngineOptions, build_engine
from modelc.engine.api import GenerationRequest
from modelc.errors import UsageError
from modelc.runtime.model import ImageSpan, LanguageModel
from modelc.runtime.sampling import SamplingParams
from modelc.vision import Tiles, VisionModel
from tests import net
from tests.gen_lfm2vl import SPECIAL, ensure_model
from tests.gguf_support import manifest, unnamed
from tests.peers import (
    ollama_and_openai_answers,
    openai_image_greedy,
    serve_exact,
)
from tests.runtime_support import (
    assert_greedy_as_golden,
    engine_in_turn,
    exact_lm,
    first_and_greedy,
    golden,
    vision_engine,
)
from tests.server_fixtures import Server
from tests.vision_support import chat_format, place_chat

GOLD: dict[str, Any] = golden("lfm2vl.json")
FIX = Path(__file__).parent / "fixtures"
CASES = [pytest.param(c, id=c["image"].split("/")[-1]) for c in GOLD["cases"]]
IMAGE = SPECIAL["<image>"]
MARKER = {"LLAMA_MEDIA_MARKER": "<__media__>"}  # the server's own is random
N_EMBD = 64


@pytest.fixture(scope="module")
def vision() -> VisionModel:
    return VisionModel(ensure_model()[2])


@pytest.fixture(scope="module")
def lm() -> LanguageModel:
    return exact_lm(ensure_model()[1])


def _bytes(case: dict[str, Any]) -> bytes:
    return (FIX / case["image"]).read_bytes()


def _pieces(got: np.ndarray[Any, Any] | Tiles) -> list[np.ndarray[Any, Any]]:
    """A whole image's array, or a split image's tiles' and thumbnail's, in order."""
    return [p.data for p in got.pieces] if isinstance(got, Tiles) else [got]


def _equal_pieces(got: list[np.ndarray[Any, Any]], pieces: list[dict[str, Any]]) -> None:
    assert len(got) == len(pieces)
    for px, want in zip(got, pieces, strict=True):
        gh, gw = want["grid"]
        assert px.shape == (gh, gw, want["pixel_shape"][1])
        flat = px.reshape(-1).astype(np.float64)
        sample = np.asarray(want["pixel_sample"])
        np.testing.assert_allclose(flat[:: want["pixel_stride"]], sample, atol=1e-6, rtol=0)
        # torch folds 1/255 into the normalisation: each value within ~1e-7; the levels
        # behind the values (mean and std 0.5), every one
        lv = np.rint((flat * 0.5 + 0.5) * 255).astype(np.int64)
        assert [int(lv.sum()), int((lv * (np.arange(lv.size) % 251)).sum())] == want["levels"]
        assert abs(flat.sum() - want["pixel_sum"]) < 1e-7 * len(flat)


@pytest.mark.parametrize("case", CASES)
def test_pixels_equal_the_processor(vision: VisionModel, case: dict[str, Any]) -> None:
    """Each piece's (a whole image, or each tile and the thumbnail) patches."""
    _equal_pieces(_pieces(vision.pixels(_bytes(case))), case["pieces"])


@pytest.mark.parametrize("noise", GOLD["noise"], ids=lambda n: "x".join(map(str, n["size"])))
def test_noise_pixels_equal_the_processor(vision: VisionModel, noise: dict[str, Any]) -> None:
    """Seeded random pixels, grown and shrunk (and tiled): PyTorch's uint8 resize, whose
    rounding Pillow's bilinear misses by a level on some pixels, to the last bit."""
    from PIL import Image

    h, w = noise["size"]
    rgb = np.random.default_rng(noise["seed"]).integers(0, 256, (h, w, 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    _equal_pieces(_pieces(vision.pixels(buf.getvalue())), noise["pieces"])


@pytest.mark.parametrize("case", CASES)
def test_embeddings_equal_transformers(vision: VisionModel, case: dict[str, Any]) -> None:
    want = np.asarray(case["embeddings"], np.float32)
    got = _pieces(vision.embed(_bytes(case)))
    for emb, piece in zip(got, case["pieces"], strict=True):
        gh, gw = piece["grid"]
        assert emb.shape == (gh // 2, gw // 2, N_EMBD)
    flat = np.concatenate([e.reshape(-1, N_EMBD) for e in got])
    assert len(flat) == case["n_embeddings"]
    # f32 through the whole tower in another order than PyTorch's: within 1e-4 on AVX-512
    # machines; an EPYC with AVX2 alone (other kernels, other sums) was 1.4e-4 off at ~0.9
    np.testing.assert_allclose(flat[:: case["emb_stride"]], want, atol=1e-4, rtol=2e-4)


@pytest.mark.parametrize("kind", ["model", "mmproj"])
def test_ggufs_are_the_converters(kind: str) -> None:
    _, gg, mm = ensure_model()
    ours, theirs = manifest(gg if kind == "model" else mm), GOLD["converter"][kind]
    assert unnamed(ours["metadata"]) == unnamed(theirs["metadata"])
    assert ours["tensors"] == theirs["tensors"]


def _spans(
    vision: VisionModel, case: dict[str, Any], image: bytes | None = None
) -> tuple[ImageSpan, ...]:
    """Each piece's embeddings at the next run of ``<image>`` in the processor's ids."""
    ids = np.asarray(case["prompt_ids"])
    edge = np.diff(np.concatenate([[0], ids == IMAGE, [0]]).astype(int))
    runs = zip(np.flatnonzero(edge == 1), np.flatnonzero(edge == -1), strict=True)
    got = _pieces(vision.embed(image if image is not None else _bytes(case)))
    spans = tuple(
        ImageSpan(int(a), e.reshape(-1, N_EMBD)) for (a, _), e in zip(runs, got, strict=True)
    )
    assert sum(s.end - s.start for s in spans) == int((ids == IMAGE).sum())
    return spans


@pytest.mark.parametrize("case", CASES)
def test_greedy_answer_equals_transformers(
    vision: VisionModel, lm: LanguageModel, case: dict[str, Any]
) -> None:
    spans = _spans(vision, case)
    assert_greedy_as_golden(lm, case["prompt_ids"], case, spans)


def test_another_image_would_differ(vision: VisionModel, lm: LanguageModel) -> None:
    """The check above can fail: the square image's prompt with the gray image's
    embeddings (as many) moves the first answer token's log-probabilities."""
    case, other = (
        next(c for c in GOLD["cases"] if c["image"].endswith(n)) for n in ("square.png", "gray.png")
    )
    lps = [
        first_and_greedy(lm, case["prompt_ids"], 0, _spans(vision, case, _bytes(c)))[0]
        for c in (case, other)
    ]
    assert np.abs(lps[0] - lps[1]).max() > 1e-3


def test_text_alone_equals_transformers_from_gguf_and_hf() -> None:
    t = GOLD["text"]
    hf, gg, _ = ensure_model()
    for src in (gg, hf):
        model = exact_lm(src)
        assert_greedy_as_golden(model, t["prompt_ids"], t, (), src)


@pytest.mark.parametrize("case", CASES[-2:])
def test_the_template_places_the_image_as_the_processor(
    vision: VisionModel, case: dict[str, Any]
) -> None:
    """The chat template through modelc's template path, the image's marker replaced by
    ``<|image_start|>``, one ``<image>`` per embedding (a split image's tiles each after
    its ``<|img_row_R_col_C|>``, then ``<|img_thumbnail|>`` and the thumbnail's) and
    ``<|image_end|>``: the processor's prompt ids."""
    fmt = chat_format(ensure_model()[1])
    data = _bytes(case)
    placed = place_chat(vision, fmt, data, GOLD["question"])
    assert placed.ids == case["prompt_ids"]
    assert [(s.start, s.end) for s in placed.images] == [
        (s.start, s.end) for s in _spans(vision, case)
    ]
    assert not any(s.bidirectional for s in placed.images)


async def test_engine_answers_in_chunks_and_from_the_prefix_cache(vision: VisionModel) -> None:
    """Through the engine, prompts fed 7 tokens a step (an image, or a tile, split between
    chunks, the convolution layers' state carried across): each image's answer; a
    repeated image's prompt served from the prefix cache past its images (the
    convolution state kept at the block's end) gives the same answer."""
    _, gg, mm = ensure_model()
    eng = vision_engine(gg, mm, 7, 8)
    cases = [GOLD["cases"][0], GOLD["cases"][-1]] * 2
    reqs = [
        GenerationRequest(
            f"r{i}",
            case["prompt_ids"],
            SamplingParams(temperature=0, max_tokens=len(case["greedy"])),
            ignore_eos=True,
            images=_spans(vision, case),
        )
        for i, case in enumerate(cases)
    ]
    got = await engine_in_turn(eng, reqs)
    for k, ((toks, cached), case) in enumerate(zip(got, cases, strict=True)):
        assert toks == case["greedy"], case["image"]
        last = len(case["prompt_ids"]) - case["prompt_ids"][::-1].index(IMAGE)
        assert (cached >= last) == (k >= 2), (k, cached, last)


@pytest.mark.parametrize("case", CASES[-2:])
def test_llamacpp_counts_the_same_prompt_and_answers_alike(
    tmp_path: Path, case: dict[str, Any]
) -> None:
    """llama.cpp's server (``--mmproj``) on the 320 x 224 image (a size both keep: no
    resize, where llama.cpp's own bilinear would give other pixels) and the 1536 x 512
    one (three tiles as they are, and a thumbnail): the same prompt token count and
    transformers' greedy answer, which modelc gives above."""
    pytest.importorskip("xllamacpp")

    from modelc.bench.llamacpp import LlamaCppServer

    _, gg, mm = ensure_model()
    text = case["prompt_text"].replace("<image>", "<__media__>")
    b64 = base64.b64encode(_bytes(case)).decode()
    body = {
        "prompt": {"prompt_string": text, "multimodal_data": [b64]},
        "n_predict": len(case["greedy"]),
        "temperature": 0,
        "samplers": ["top_k"],
        "top_k": 1,
        "ignore_eos": True,
        "cache_prompt": False,
        "return_tokens": True,
    }
    with LlamaCppServer(
        gg, threads=1, n_parallel=1, n_ctx=2048, log=tmp_path / "lc.log", mmproj=mm, env=MARKER
    ) as s:
        r = net.post(f"{s.url}/completion", json=body, timeout=120).json()
    assert r["tokens_evaluated"] == len(case["prompt_ids"]), r.get("tokens_evaluated")
    assert r["tokens"] == case["greedy"]


def test_a_projector_of_another_family_is_refused_at_start() -> None:
    """LFM2-VL's projector with Gemma 3's model, and Gemma 3's with LFM2's: one line at
    start."""
    from tests import gen_gemma3vl

    _, gemma, gemma_mm = gen_gemma3vl.ensure_model()
    _, lfm2, lfm2_mm = ensure_model()
    for model, mm in ((gemma, lfm2_mm), (lfm2, gemma_mm)):
        with pytest.raises(UsageError) as e:
            build_engine(model, EngineOptions(mmproj=str(mm)))
        assert "\n" not in str(e.value) and "mmproj file made with this model" in str(e.value)


@pytest.mark.parametrize(
    ("size", "grids"),
    [
        ((1, 1), [(8, 8)]),  # up to 64 tokens: 256 x 256
        ((700, 700), [(16, 16)]),  # 704 x 704 rounded: within twice 256 tokens' pixels
        ((724, 724), [(16, 16)] * 5),  # 736 x 736: 2 x 2 tiles and a thumbnail
        ((1024, 768), [(16, 16)] * 6 + [(13, 18)]),  # 3 x 2 tiles, a 576 x 416 thumbnail
        ((3000, 700), [(16, 16)] * 4 + [(7, 33)]),  # 4 x 1 tiles
        ((9000, 40), [(1, 240)]),  # 8992 x 32 rounded: whole
    ],  # each as Lfm2VlImageProcessor gives them (transformers 5.23)
)
def test_sizes_and_tiles(
    vision: VisionModel, size: tuple[int, int], grids: list[tuple[int, int]]
) -> None:
    """Token grids as the processor's rules give them: a small image up to 64 tokens, one
    under twice 256 tokens' pixels whole, a larger one in tiles (the grid's aspect ratio
    the nearest) and a thumbnail."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, (200, 10, 10)).save(buf, format="PNG")
    pieces = _pieces(vision.pixels(buf.getvalue()))  # (rows, columns) of patches
    assert [(p.shape[0] // 2, p.shape[1] // 2) for p in pieces] == grids


@pytest.fixture(scope="module")
def vlm() -> Iterator[Server]:
    _, gg, mm = ensure_model()
    yield from serve_exact(gg, mm)


def test_openai_image_url_answers_as_transformers(vlm: Server) -> None:
    case = GOLD["cases"][-1]
    n, ids = openai_image_greedy(vlm, "lfm2vl", _bytes(case), GOLD["question"], len(case["greedy"]))
    assert n == len(case["prompt_ids"]) and ids == case["greedy"]


def test_ollama_images_answer_as_openai(vlm: Server) -> None:
    """The ``ollama`` client's ``images`` (the 320 x 224 image): the processor's prompt
    token count and the ``openai`` client's answer."""
    case = next(c for c in GOLD["cases"] if c["image"].endswith("lfm2vl/scene.png"))
    n_new = len(case["greedy"])  # the answers to the other images part within these
    path = FIX / case["image"]
    got, want, n = ollama_and_openai_answers(vlm, "lfm2vl", path, GOLD["question"], n_new)
    assert got and got == want
    assert n == len(case["prompt_ids"])
