"""Qwen2.5-VL against transformers and llama.cpp (``tests/golden/qwen25vl.json``,
``scripts/make_tiny_qwen25vl.py``) on the tiny model of ``tests/gen_qwen25vl.py``: pixel
values equal ``Qwen2VLImageProcessor``'s, image embeddings (windowed and full attention,
2-D RoPE, the 2x2 merger) within 1e-4 of transformers', the model and mmproj GGUFs the
converter's tensor for tensor, and in ``exact`` mode the first answer token's
log-probabilities and the greedy answer equal transformers' (M-RoPE positions over each
image's grid; the same image with plain positions would answer otherwise)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from modelc.artifact import open_artifact
from modelc.engine import EngineOptions, build_engine
from modelc.engine.api import GenerationRequest, TokenEvent
from modelc.errors import ModelcError, UsageError
from modelc.formats import load_model
from modelc.runtime.model import ImageSpan, LanguageModel
from modelc.runtime.sampling import SamplingParams
from modelc.vision import ImageError, VisionModel
from tests import net
from tests.cli_support import Cli
from tests.gen_qwen25vl import SPECIAL, ensure_model
from tests.gguf_support import manifest, unnamed
from tests.peers import llamacpp_image_answer
from tests.runtime_support import (
    assert_greedy_as_golden,
    engine_in_turn,
    exact_lm,
    first_and_greedy,
    golden,
    make_backend,
    vision_engine,
)
from tests.vision_support import chat_format, place_chat

GOLD: dict[str, Any] = golden("qwen25vl.json")
FIX = Path(__file__).parent / "fixtures"
CASES = [pytest.param(c, id=c["image"].split("/")[-1]) for c in GOLD["cases"]]
PAD = SPECIAL["<|image_pad|>"]


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
    t, gh, gw = case["grid_thw"]
    assert got.shape == (gh // 2, gw // 2, 4, case["pixel_shape"][1]) and t == 1
    flat = got.reshape(-1).astype(np.float64)
    want = np.asarray(case["pixel_sample"])
    np.testing.assert_allclose(flat[:: GOLD["pixel_stride"]], want, atol=1e-6, rtol=0)
    assert abs(flat.sum() - case["pixel_sum"]) < 1e-3
    assert abs(np.abs(flat).sum() - case["pixel_abs_sum"]) < 1e-3


@pytest.mark.parametrize("case", CASES)
def test_embeddings_equal_transformers(vision: VisionModel, case: dict[str, Any]) -> None:
    want = np.asarray(case["embeddings"], np.float32)
    got = vision.embed(_bytes(case))
    _, gh, gw = case["grid_thw"]
    assert got.shape == (gh // 2, gw // 2, 64)
    np.testing.assert_allclose(got.reshape(-1, 64), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["model", "mmproj"])
def test_ggufs_are_the_converters(kind: str) -> None:
    _, gg, mm = ensure_model()
    ours, theirs = manifest(gg if kind == "model" else mm), GOLD["converter"][kind]
    assert unnamed(ours["metadata"]) == unnamed(theirs["metadata"])
    assert ours["tensors"] == theirs["tensors"]


def _span(vision: VisionModel, case: dict[str, Any], *, mrope: bool = True) -> ImageSpan:
    ids = case["prompt_ids"]
    emb = vision.embed(_bytes(case))
    grid = emb.shape[:2] if mrope else (0, 0)
    return ImageSpan(ids.index(PAD), emb.reshape(-1, emb.shape[-1]), False, (grid[0], grid[1]))


@pytest.mark.parametrize("case", CASES)
def test_greedy_answer_equals_transformers(
    vision: VisionModel, lm: LanguageModel, case: dict[str, Any]
) -> None:
    span = _span(vision, case)
    assert span.end - span.start == case["prompt_ids"].count(PAD)
    assert_greedy_as_golden(lm, case["prompt_ids"], case, (span,))


def test_text_alone_equals_transformers_from_gguf_and_hf() -> None:
    t = GOLD["text"]
    hf, gg, _ = ensure_model()
    for src in (gg, hf):
        model = exact_lm(src)
        assert_greedy_as_golden(model, t["prompt_ids"], t, (), src)


def test_plain_positions_would_differ(vision: VisionModel, lm: LanguageModel) -> None:
    """The check above can fail: the wide image's rows and columns as plain positions move
    the log-probabilities."""
    case = next(c for c in GOLD["cases"] if c["grid_thw"][1] != c["grid_thw"][2])
    lps = [
        first_and_greedy(lm, case["prompt_ids"], 0, (_span(vision, case, mrope=m),))[0]
        for m in (True, False)
    ]
    assert np.abs(lps[0] - lps[1]).max() > 1e-3


@pytest.mark.parametrize("case", CASES)
def test_the_template_places_the_image_as_the_processor(
    vision: VisionModel, case: dict[str, Any]
) -> None:
    """The release's chat template through modelc's template path, the image's marker
    replaced by ``<|vision_start|>``, one ``<|image_pad|>`` per embedding and
    ``<|vision_end|>``: the processor's prompt ids."""
    fmt = chat_format(ensure_model()[1])
    data = _bytes(case)
    placed = place_chat(vision, fmt, data, GOLD["question"])
    assert placed.ids == case["prompt_ids"]
    (span,) = placed.images
    _, gh, gw = case["grid_thw"]
    assert span.grid == (gh // 2, gw // 2) and span.start == case["prompt_ids"].index(PAD)


def test_cuda_refuses_mrope_and_compile_runs_the_decoder() -> None:
    from modelc.compile.spec import forward_note, model_spec
    from modelc.runtime.backends.cuda_family import cuda_host

    ir = load_model(str(ensure_model()[1]))
    with pytest.raises(ModelcError) as e:
        cuda_host(ir)
    msg = str(e.value)
    assert "\n" not in msg and "M-RoPE" in msg and "--device cuda" in msg, msg
    assert "M-RoPE" in forward_note(model_spec(ir, "t"))


async def test_engine_answers_in_chunks_and_from_the_prefix_cache(vision: VisionModel) -> None:
    """Through the engine, prompts fed 7 tokens a step (an image split between chunks,
    its rows' M-RoPE positions from each chunk's place): each image's answer; a repeated
    image's prompt served from the prefix cache past the image gives the same answer (the
    other image's, only up to it)."""
    _, gg, mm = ensure_model()
    eng = vision_engine(gg, mm, 7, 8)
    cases = GOLD["cases"][:2] * 2
    reqs = [
        GenerationRequest(
            f"r{i}",
            case["prompt_ids"],
            SamplingParams(temperature=0, max_tokens=len(case["greedy"])),
            ignore_eos=True,
            images=(_span(vision, case),),
        )
        for i, case in enumerate(cases)
    ]
    got = await engine_in_turn(eng, reqs)
    for k, ((toks, cached), case) in enumerate(zip(got, cases, strict=True)):
        assert toks == case["greedy"], case["image"]
        assert (cached > case["prompt_ids"].index(PAD)) == (k >= 2), (k, cached)


def test_llamacpp_counts_the_same_prompt_and_answers_alike(tmp_path: Path) -> None:
    """llama.cpp's server (``--mmproj``) on the image already of a size both keep (its
    sides multiples of 28: no resize, where llama.cpp's own bicubic would give other
    pixels): the same prompt token count and transformers' greedy answer, which modelc
    gives above."""
    pytest.importorskip("xllamacpp")
    case = next(c for c in GOLD["cases"] if c["image"].endswith("scene.png"))
    _, gg, mm = ensure_model()
    text = case["prompt_text"].replace("<|vision_start|><|image_pad|><|vision_end|>", "<__media__>")
    n, toks = llamacpp_image_answer(
        gg, mm, text, _bytes(case), len(case["greedy"]), tmp_path / "lc.log"
    )
    assert n == len(case["prompt_ids"]) and toks == case["greedy"], (n, toks)


def test_pack_and_inspect(tmp_path: Path) -> None:
    """``modelc pack`` makes the same tensors and M-RoPE sections of the HF directory and
    of the GGUF; ``modelc inspect`` shows them."""
    hf, gg, _ = ensure_model()
    cli = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    for k, src in (("hf", hf), ("gguf", gg)):
        cli("pack", str(src), "-o", str(tmp_path / f"{k}.modelc"))
    arts = [open_artifact(tmp_path / f"{k}.modelc") for k in ("hf", "gguf")]
    try:
        irs = [a.to_ir() for a in arts]
        assert irs[0].architecture == irs[1].architecture == "qwen2vl"
        assert irs[0].hparams.rope_sections == irs[1].hparams.rope_sections == [2, 3, 3]
        assert sorted(irs[0].tensors) == sorted(irs[1].tensors)
        for name, t in irs[0].tensors.items():
            np.testing.assert_array_equal(t.data(), irs[1].tensors[name].data(), err_msg=name)
    finally:
        for a in arts:
            a.close()
    out = cli("inspect", str(tmp_path / "gguf.modelc")).stdout
    assert "architecture   qwen2vl" in out and "M-RoPE sections t/h/w 2/3/3" in out, out


@pytest.mark.parametrize("speculative", [False, True])
async def test_engine_batched_equals_alone(vision: VisionModel, speculative: bool) -> None:
    """The four image prompts at once through one engine (batched steps, each image's
    M-RoPE positions its own; with speculation, drafts checked and rolled back): each
    gets transformers' answer, as alone."""
    _, gg, mm = ensure_model()
    opt = EngineOptions(
        prefill_chunk=16,
        prefix_cache_bytes=0,
        speculative=speculative,
        spec_adaptive=False,
        spec_min_prompt=0,
        spec_gamma=4,
    )
    opt.mmproj, opt.kv_cache = str(mm), "f32"
    eng = build_engine(gg, opt, backend=make_backend("cpu-exact"))
    cases = GOLD["cases"]
    got: dict[int, list[int]] = {}

    async def one(i: int, case: dict[str, Any]) -> None:
        p = SamplingParams(temperature=0, max_tokens=len(case["greedy"]))
        span = _span(vision, case)
        req = GenerationRequest(f"b{i}", case["prompt_ids"], p, ignore_eos=True, images=(span,))
        got[i] = [ev.token_id async for ev in eng.submit(req) if isinstance(ev, TokenEvent)]

    async with trio.open_nursery() as n:
        await n.start(eng.run)
        async with trio.open_nursery() as reqs:
            for i, case in enumerate(cases):
                reqs.start_soon(one, i, case)
        st = eng.stats()
        n.cancel_scope.cancel()
    assert [got[i] for i in range(len(cases))] == [c["greedy"] for c in cases]
    assert (st.spec_drafted > st.spec_accepted) == speculative, st  # drafts rolled back


def test_a_projector_of_another_family_is_refused_at_start() -> None:
    """Qwen2.5-VL's projector with Gemma 3's model, and Gemma 3's with Qwen2.5-VL's: one
    line at start (the images' positions would be wrong)."""
    from tests import gen_gemma3vl

    _, gemma, gemma_mm = gen_gemma3vl.ensure_model()
    _, qwen, qwen_mm = ensure_model()
    for model, mm in ((gemma, qwen_mm), (qwen, gemma_mm)):
        with pytest.raises(UsageError, match="does not go with"):
            build_engine(model, EngineOptions(mmproj=str(mm)))


@pytest.mark.parametrize(
    ("size", "grid"), [((250, 1), None), ((150, 1), (1, 25)), ((1, 1), (2, 2))]
)
def test_extreme_sizes(
    vision: VisionModel, size: tuple[int, int], grid: tuple[int, int] | None
) -> None:
    """A 250:1 image is one ImageError (a 400, as the processor refuses a ratio over 200);
    150:1 and a single pixel are resized within the processor's limits."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, (200, 10, 10)).save(buf, format="PNG")
    if grid is None:
        with pytest.raises(ImageError, match="ratio") as e:
            vision.embed(buf.getvalue(), "messages[0].content[0]")
        assert e.value.param == "messages[0].content[0]"
        return
    assert vision.embed(buf.getvalue()).shape[:2] == grid


def test_llamacpp_runs_the_text_the_same(lm: LanguageModel, tmp_path: Path) -> None:
    """llama.cpp's server on our model GGUF, no image: the same prompt ids and greedy
    tokens (up to a near tie)."""
    pytest.importorskip("xllamacpp")

    from modelc.bench.llamacpp import LlamaCppServer
    from tests.peers import greedy_to_near_tie, llamacpp_greedy

    t = GOLD["text"]
    gg = ensure_model()[1]
    with LlamaCppServer(gg, threads=1, n_parallel=1, n_ctx=256, log=tmp_path / "lc.log") as s:
        ids = net.post(f"{s.url}/tokenize", json={"content": t["prompt"]}, timeout=30).json()
        got = llamacpp_greedy(s.url, t["prompt_ids"], len(t["greedy"]))
    assert ids["tokens"] == t["prompt_ids"]
    ours, cut = greedy_to_near_tie(lm, t["prompt_ids"], len(t["greedy"]))
    assert ours == t["greedy"] and cut >= 8 and got[:cut] == ours[:cut], (got, ours, cut)
