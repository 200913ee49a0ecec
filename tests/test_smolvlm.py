"""SmolVLM / Idefics3 against transformers and llama.cpp (``tests/golden/smolvlm.json``,
``scripts/make_tiny_smolvlm.py``) on the tiny model of ``tests/gen_smolvlm.py``: pixel
values equal ``SmolVLMImageProcessorPil``'s (the tiles row by row, the global image
last), image embeddings (SigLIP, pixel shuffle, connector) within 1e-4 of transformers',
the model and mmproj GGUFs the converter's tensor for tensor, each tile's text placed as
``SmolVLMProcessor`` expands ``<image>``, and in ``exact`` mode the first answer token's
log-probabilities and the greedy answer equal transformers'; llama.cpp's server counts
the same prompt and answers alike; the ``openai`` client's ``image_url`` gets
transformers' answer to the prompt llama.cpp's chat route renders."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from modelc.engine import EngineOptions, build_engine
from modelc.engine.api import FinishEvent, GenerationRequest, TokenEvent
from modelc.errors import UsageError
from modelc.runtime.model import ImageSpan, LanguageModel
from modelc.runtime.prompt import PromptFormat
from modelc.runtime.prompt_media import MEDIA_MARKER, encode_around
from modelc.runtime.sampling import SamplingParams
from modelc.vision import VisionModel
from modelc.vision.idefics3 import sizes, tile_texts, tiles
from modelc.vision.pieces import Tiles
from tests import net
from tests.gen_smolvlm import SPECIAL, TOKENS_PER_TILE, ensure_model
from tests.gguf_support import manifest, unnamed
from tests.peers import (
    image_question,
    ollama_and_openai_answers,
    openai_image_greedy,
    serve_exact,
)
from tests.runtime_support import (
    assert_greedy_as_golden,
    exact_lm,
    golden,
    make_backend,
)
from tests.server_fixtures import Server
from tests.vision_support import chat_format, token_encoder

GOLD: dict[str, Any] = golden("smolvlm.json")
FIX = Path(__file__).parent / "fixtures"
CASES = [pytest.param(c, id=c["image"].split("/")[-1]) for c in GOLD["cases"]]
IMAGE = SPECIAL["<image>"]
MARKER = {"LLAMA_MEDIA_MARKER": "<__media__>"}  # the server's own is random


@pytest.fixture(scope="module")
def vision() -> VisionModel:
    return VisionModel(ensure_model()[2])


@pytest.fixture(scope="module")
def lm() -> LanguageModel:
    return exact_lm(ensure_model()[1])


@pytest.fixture(scope="module")
def fmt() -> PromptFormat:
    return chat_format(ensure_model()[1])


def _bytes(case: dict[str, Any]) -> bytes:
    return (FIX / case["image"]).read_bytes()


def _kind(path: Path) -> str:
    return "jpeg" if path.suffix == ".jpg" else "png"


def _question(path: Path) -> list[dict[str, Any]]:
    """The OpenAI content of the image at ``path`` and the goldens' question."""
    return image_question(path.read_bytes(), GOLD["question"], _kind(path))


@pytest.mark.parametrize("case", CASES)
def test_pixels_equal_the_processor(vision: VisionModel, case: dict[str, Any]) -> None:
    got, rows, cols = vision.tiles(_bytes(case))
    assert (rows, cols) == (case["rows"], case["cols"])
    assert list(got.shape) == case["pixel_shape"] == [rows * cols + 1, 3, 32, 32]
    flat = got.reshape(-1).astype(np.float64)
    want = np.asarray(case["pixel_sample"])
    np.testing.assert_allclose(flat[:: GOLD["pixel_stride"]], want, atol=1e-6, rtol=0)
    assert abs(flat.sum() - case["pixel_sum"]) < 1e-3
    assert abs(np.abs(flat).sum() - case["pixel_abs_sum"]) < 1e-3


@pytest.mark.parametrize("case", CASES)
def test_embeddings_equal_transformers(vision: VisionModel, case: dict[str, Any]) -> None:
    got = vision.embed(_bytes(case))
    assert isinstance(got, Tiles)
    embeds = np.stack([p.data for p in got.pieces])
    assert embeds.shape == (case["rows"] * case["cols"] + 1, TOKENS_PER_TILE, 64)
    # each tile after its own text, the global image last (the processor's prompt)
    texts = [(p.head, p.tail) for p in got.pieces]
    assert texts == tile_texts(case["rows"], case["cols"])
    want = np.asarray(case["embeddings"], np.float32)
    np.testing.assert_allclose(embeds.reshape(-1, 64), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["model", "mmproj"])
def test_ggufs_are_the_converters(kind: str) -> None:
    _, gg, mm = ensure_model()
    ours, theirs = manifest(gg if kind == "model" else mm), GOLD["converter"][kind]
    assert unnamed(ours["metadata"]) == unnamed(theirs["metadata"])
    assert ours["tensors"] == theirs["tensors"]


def _placed(
    vision: VisionModel, fmt: PromptFormat, text: str, data: bytes
) -> tuple[list[int], tuple[ImageSpan, ...]]:
    """``text`` (a rendered prompt, the image's marker in it) tokenized around the marker,
    the image's tiles placed there."""

    enc = token_encoder(fmt)

    ids, at = encode_around(enc, text, 1)
    placed = vision.place(ids, at, [vision.embed(data)], enc)
    return placed.ids, placed.images


@pytest.mark.parametrize("case", CASES)
def test_tiles_are_placed_as_the_processor_expands_them(
    vision: VisionModel, fmt: PromptFormat, case: dict[str, Any]
) -> None:
    """The release template's prompt, ``<image>`` as the media marker: each tile's
    ``<fake_token_around_image><row_r_col_c>``, ``\\n`` between rows, ``\\n\\n`` and
    ``<global-img>`` before the global image, as ``SmolVLMProcessor`` writes them."""
    text = case["prompt_text"].replace("<image>", MEDIA_MARKER)
    ids, spans = _placed(vision, fmt, text, _bytes(case))
    assert ids == case["prompt_ids"]
    assert len(spans) == case["rows"] * case["cols"] + 1
    assert all(ids[s.start : s.end] == [IMAGE] * TOKENS_PER_TILE for s in spans)


def test_the_chat_route_renders_as_llamacpp(vision: VisionModel, fmt: PromptFormat) -> None:
    """The release's template reads a message's text only from typed parts: modelc hands
    it the text as one (as llama.cpp's server does), so the question shows; llama.cpp's
    ``User: `` (a space transformers' ``User:`` lacks) included."""
    case = GOLD["cases"][-1]
    data = _bytes(case)
    msg = [{"type": "image", "data": data}, {"type": "text", "text": GOLD["question"]}]
    chat = fmt.chat([{"role": "user", "content": msg}])
    assert chat.text == case["chat"]["prompt_text"].replace("<image>", MEDIA_MARKER)

    enc = token_encoder(fmt)

    placed = vision.place(chat.ids, chat.media, [vision.embed(data)], enc)
    assert placed.ids == case["chat"]["prompt_ids"]


def test_only_a_template_blind_to_string_content_gets_typed_parts() -> None:
    """The reshaping touches SmolVLM's template alone among the committed ones (each of
    the others shows a string content as it is)."""
    from modelc.runtime.template_caps import typed_content

    others = sorted((FIX / "templates").glob("*.jinja"))
    assert len(others) > 20 and not any(typed_content(f.read_text()) for f in others)
    assert typed_content((FIX / "smolvlm" / "smolvlm.jinja").read_text())


@pytest.mark.parametrize("case", CASES)
def test_greedy_answer_equals_transformers(
    vision: VisionModel, lm: LanguageModel, fmt: PromptFormat, case: dict[str, Any]
) -> None:
    text = case["prompt_text"].replace("<image>", MEDIA_MARKER)
    ids, spans = _placed(vision, fmt, text, _bytes(case))
    assert_greedy_as_golden(lm, ids, case, spans)


def test_text_alone_equals_transformers_from_gguf_and_hf() -> None:
    """The GGUF and the HF directory (its llama text model; the tower left to the mmproj)."""
    t = GOLD["text"]
    hf, gg, _ = ensure_model()
    for src in (gg, hf):
        model = exact_lm(src)
        assert model.architecture == "llama"
        assert_greedy_as_golden(model, t["prompt_ids"], t, (), src)


def test_llamacpp_counts_the_same_prompts_and_answers_alike(tmp_path: Path) -> None:
    """llama.cpp's server (``--mmproj``) on each image: the processor's prompt token count
    (the same tiles) and, up to a near tie, transformers' greedy answer, which modelc
    gives above (llama.cpp's own Lanczos resizes move its pixels a little); its chat
    route counts the prompt modelc's chat route makes (``User: `` with the space)."""
    pytest.importorskip("xllamacpp")

    from modelc.bench.llamacpp import LlamaCppServer

    _, gg, mm = ensure_model()
    base = {
        "n_predict": 12,
        "temperature": 0,
        "samplers": ["top_k"],
        "top_k": 1,
        "ignore_eos": True,
        "cache_prompt": False,
        "return_tokens": True,
        "n_probs": 2,
    }
    with LlamaCppServer(
        gg, threads=1, n_parallel=1, n_ctx=512, log=tmp_path / "lc.log", mmproj=mm, env=MARKER
    ) as s:
        for case in GOLD["cases"]:
            data = base64.b64encode(_bytes(case)).decode()
            text = case["prompt_text"].replace("<image>", "<__media__>")
            body = {"prompt": {"prompt_string": text, "multimodal_data": [data]}, **base}
            r = net.post(f"{s.url}/completion", json=body, timeout=120).json()
            assert r["tokens_evaluated"] == len(case["prompt_ids"]), case["image"]
            got, want = r["tokens"], case["greedy"]
            cut = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), 12)
            if cut < len(want):  # the first difference: a near tie in llama.cpp's logits
                top = r["completion_probabilities"][cut]["top_logprobs"]
                assert abs(top[0]["logprob"] - top[1]["logprob"]) < 0.05, (got, want, top)
        case = GOLD["cases"][-1]
        parts = _question(FIX / case["image"])
        chat = {"messages": [{"role": "user", "content": parts}], "max_tokens": 1}
        r = net.post(f"{s.url}/v1/chat/completions", json=chat, timeout=120).json()
    assert r["usage"]["prompt_tokens"] == len(case["chat"]["prompt_ids"])


async def test_engine_answers_in_chunks_and_from_the_prefix_cache(
    vision: VisionModel, fmt: PromptFormat
) -> None:
    """Through the engine, prompts fed 7 tokens a step (tiles and the text between them
    split across chunks): each image's answer; the same image again is served from the
    prefix cache past its tiles (another image only up to its first tile)."""
    _, gg, mm = ensure_model()
    opt = EngineOptions(prefill_chunk=7, prefix_block_tokens=8)
    opt.mmproj, opt.kv_cache, opt.speculative = str(mm), "f32", False
    eng = build_engine(gg, opt, backend=make_backend("cpu-exact"))
    cases = [GOLD["cases"][0], GOLD["cases"][-1]] * 2
    got = []
    async with trio.open_nursery() as n:
        await n.start(eng.run)
        for i, case in enumerate(cases):
            text = case["prompt_text"].replace("<image>", MEDIA_MARKER)
            ids, spans = _placed(vision, fmt, text, _bytes(case))
            p = SamplingParams(temperature=0, max_tokens=len(case["greedy"]))
            req = GenerationRequest(f"r{i}", ids, p, ignore_eos=True, images=spans)
            toks, cached = [], -1
            async for ev in eng.submit(req):
                if isinstance(ev, TokenEvent):
                    toks.append(ev.token_id)
                elif isinstance(ev, FinishEvent):
                    cached = ev.cached_tokens
            got.append((toks, cached, spans[-1].end))
        n.cancel_scope.cancel()
    for k, ((toks, cached, end), case) in enumerate(zip(got, cases, strict=True)):
        assert toks == case["greedy"], case["image"]
        first = case["prompt_ids"].index(IMAGE)
        assert (cached >= end - 8) if k >= 2 else (cached < first), (k, cached, end)


def test_a_projector_of_another_family_is_refused_at_start() -> None:
    """SmolVLM's projector with Gemma 3's or Qwen2.5-VL's model, and Qwen2.5-VL's with
    SmolVLM's: one line at start."""
    from tests import gen_gemma3vl, gen_qwen25vl

    _, smol, smol_mm = ensure_model()
    _, gemma, _ = gen_gemma3vl.ensure_model()
    _, qwen, qwen_mm = gen_qwen25vl.ensure_model()
    for model, mm in ((gemma, smol_mm), (qwen, smol_mm), (smol, qwen_mm)):
        with pytest.raises(UsageError, match="does not go with") as e:
            build_engine(model, EngineOptions(mmproj=str(mm)))
        assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("size", "grid"), [((1, 1), (2, 2)), ((250, 1), (1, 2)), ((1, 250), (2, 1)), ((64, 64), (2, 2))]
)
def test_extreme_sizes(vision: VisionModel, size: tuple[int, int], grid: tuple[int, int]) -> None:
    """A single pixel and 250:1 strips are resized up to the longest side and tiled (the
    short side at least one tile), as the processor computes their sizes."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, (200, 10, 10)).save(buf, format="PNG")
    _, rows, cols = vision.tiles(buf.getvalue())
    emb = vision.embed(buf.getvalue())
    assert (rows, cols) == grid
    assert isinstance(emb, Tiles) and len(emb.pieces) == grid[0] * grid[1] + 1


def test_one_tile_is_the_global_image_alone() -> None:
    """A processor whose longest side is the tile: transformers' single image, no rows
    and no columns, between ``<fake_token_around_image><global-img>`` and
    ``<fake_token_around_image>`` (llama.cpp would add one 1 x 1 tile before it)."""
    from PIL import Image

    img = Image.new("RGB", (20, 40), (10, 200, 10))
    assert sizes(40, 20, 32, 32) == ((32, 16), (32, 32))
    pix, rows, cols = tiles(img, 32, 32, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    assert pix.shape == (1, 3, 32, 32) and (rows, cols) == (0, 0)
    assert tile_texts(0, 0) == [
        ("<fake_token_around_image><global-img>", "<fake_token_around_image>")
    ]


@pytest.fixture(scope="module")
def vlm() -> Iterator[Server]:
    _, gg, mm = ensure_model()
    yield from serve_exact(gg, mm)


def test_openai_image_url_answers_as_transformers(vlm: Server) -> None:
    """A real ``modelc run --mmproj``: the ``openai`` client's data URL gets the prompt
    token count of llama.cpp's chat rendering and transformers' greedy answer to it."""
    case = GOLD["cases"][-1]
    path, n_new = FIX / case["image"], len(case["chat"]["greedy"])
    n, ids = openai_image_greedy(
        vlm, "smolvlm", path.read_bytes(), GOLD["question"], n_new, _kind(path)
    )
    assert n == len(case["chat"]["prompt_ids"]) and ids == case["chat"]["greedy"]


def test_ollama_images_answer_as_openai(vlm: Server) -> None:
    """The ``ollama`` client's ``images``: the same prompt count and answer."""
    case = GOLD["cases"][0]
    path = FIX / case["image"]
    got, want, n = ollama_and_openai_answers(vlm, "smolvlm", path, GOLD["question"], 4, _kind(path))
    assert n == len(case["chat"]["prompt_ids"])
    assert got == want
