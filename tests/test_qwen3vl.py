"""Qwen3-VL against transformers and llama.cpp (``tests/golden/qwen3vl.json``,
``scripts/make_tiny_qwen3vl.py``) on the tiny model of ``tests/gen_qwen3vl.py``: pixel
values equal ``Qwen2VLImageProcessor``'s, image embeddings and DeepStack features (learned
positions resampled, 2-D RoPE, the mergers) within 1e-4 of transformers', the model and
mmproj GGUFs the converter's tensor for tensor, the release's template places each image as
the processor, and in ``exact`` mode the first answer token's log-probabilities and the
greedy answer equal transformers' (interleaved M-RoPE, DeepStack features added after the
first layers: without them the answer moves); llama.cpp's server counts the same prompt
and answers alike; the ``openai`` client's ``image_url`` gets the same answer from
``modelc run``.  Qwen3-VL-MoE (``tests/gen_qwen3vlmoe.py``, ``tests/golden/qwen3vlmoe.json``)
the same way, its GGUF the converter's, from GGUF and HF.  About 20 s (the server and
llama.cpp's a few each)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from modelc.artifact import open_artifact
from modelc.engine import EngineOptions, build_engine
from modelc.engine.api import FinishEvent, GenerationRequest, TokenEvent
from modelc.errors import ModelcError, UsageError
from modelc.formats import load_model
from modelc.runtime.model import LanguageModel
from modelc.runtime.sampling import SamplingParams
from modelc.vision import PlacedPrompt, VisionModel
from tests import gen_qwen3vlmoe
from tests.cli_support import Cli
from tests.gen_qwen3vl import SPECIAL, ensure_model
from tests.gguf_support import manifest, unnamed
from tests.peers import (
    llamacpp_image_answer,
    ollama_and_openai_answers,
    openai_image_greedy,
    serve_exact,
)
from tests.runtime_support import (
    assert_greedy_as_golden,
    exact_lm,
    first_and_greedy,
    golden,
    make_backend,
)
from tests.server_fixtures import Server
from tests.vision_support import chat_format, place_chat

GOLD: dict[str, Any] = golden("qwen3vl.json")
MOE: dict[str, Any] = golden("qwen3vlmoe.json")
FIX = Path(__file__).parent / "fixtures"
CASES = [pytest.param(c, id=c["image"].split("/")[-1]) for c in GOLD["cases"]]
D = 64  # the text width


@pytest.fixture(scope="module")
def vision() -> VisionModel:
    return VisionModel(ensure_model()[2])


@pytest.fixture(scope="module")
def lm() -> LanguageModel:
    return exact_lm(ensure_model()[1])


def _bytes(case: dict[str, Any]) -> bytes:
    return (FIX / case["image"]).read_bytes()


def _close(got: np.ndarray[Any, Any], want: dict[str, Any]) -> None:
    """``got`` against a golden summary: shape, every n-th value within 1e-4, sums."""
    flat = got.reshape(-1).astype(np.float64)
    assert list(got.shape) == want["shape"]
    sample = np.asarray(want["sample"])
    np.testing.assert_allclose(flat[:: GOLD["embedding_stride"]], sample, atol=1e-4, rtol=0)
    assert abs(flat.sum() - want["sum"]) < 1e-2 and abs(np.abs(flat).sum() - want["abs_sum"]) < 1e-2


@pytest.mark.parametrize("case", CASES)
def test_pixels_and_embeddings_equal_transformers(
    vision: VisionModel, case: dict[str, Any]
) -> None:
    pix = vision.pixels(_bytes(case))
    t, gh, gw = case["grid_thw"]
    assert pix.shape == (gh // 2, gw // 2, 4, case["pixel_shape"][1]) and t == 1
    flat = pix.reshape(-1).astype(np.float64)
    want = np.asarray(case["pixel_sample"])
    np.testing.assert_allclose(flat[:: GOLD["pixel_stride"]], want, atol=1e-6, rtol=0)
    assert abs(flat.sum() - case["pixel_sum"]) < 1e-3
    emb = vision.embed(_bytes(case)).reshape(-1, D * 3)  # the merger's, then 2 DeepStack
    _close(emb[:, :D], case["embeddings"])
    for k, deep in enumerate(case["deepstack"]):
        _close(np.ascontiguousarray(emb[:, D * (k + 1) : D * (k + 2)]), deep)


@pytest.mark.parametrize("moe", [False, True], ids=["qwen3vl", "qwen3vlmoe"])
@pytest.mark.parametrize("kind", ["model", "mmproj"])
def test_ggufs_are_the_converters(kind: str, moe: bool) -> None:
    """Both models' GGUFs; the mixture's projector is Qwen3-VL's (the same tower)."""
    _, gg, mm = (gen_qwen3vlmoe.ensure_model if moe else ensure_model)()
    gold = MOE if moe else GOLD
    ours, theirs = manifest(gg if kind == "model" else mm), gold["converter"][kind]
    assert unnamed(ours["metadata"]) == unnamed(theirs["metadata"])
    assert ours["tensors"] == theirs["tensors"]


def _placed(vision: VisionModel, case: dict[str, Any]) -> PlacedPrompt:
    """The release's template through modelc's template path, the image placed."""
    fmt = chat_format(ensure_model()[1])
    data = _bytes(case)
    return place_chat(vision, fmt, data, GOLD["question"])


@pytest.mark.parametrize("case", CASES)
def test_greedy_answer_equals_transformers(
    vision: VisionModel, lm: LanguageModel, case: dict[str, Any]
) -> None:
    placed = _placed(vision, case)
    assert placed.ids == case["prompt_ids"]
    (span,) = placed.images
    _, gh, gw = case["grid_thw"]
    assert span.grid == (gh // 2, gw // 2) and span.deep is not None and len(span.deep) == 2
    assert_greedy_as_golden(lm, placed.ids, case, placed.images)


def test_text_alone_equals_transformers_from_gguf_and_hf() -> None:
    t = GOLD["text"]
    hf, gg, _ = ensure_model()
    for src in (gg, hf):
        model = exact_lm(src)
        assert_greedy_as_golden(model, t["prompt_ids"], t, (), src)


def test_the_mixture_answers_as_transformers_from_gguf_and_hf(vision: VisionModel) -> None:
    """Qwen3-VL-MoE (its HF directory's experts stored as the release stores them): each
    image's answer and the text prompt's, as transformers'."""
    hf, gg, _ = gen_qwen3vlmoe.ensure_model()
    for src in (gg, hf):
        model = exact_lm(src)
        assert model.hparams.n_expert == 4
        for case in [*MOE["cases"], MOE["text"]]:
            placed = _placed(vision, case) if "image" in case else None
            ids = placed.ids if placed else case["prompt_ids"]
            assert ids == case["prompt_ids"]
            spans = placed.images if placed else ()
            assert_greedy_as_golden(model, ids, case, spans, src)


def test_deepstack_and_interleaving_move_the_answer(vision: VisionModel, lm: LanguageModel) -> None:
    """The checks above can fail: without the DeepStack features, or with the sections
    contiguous (Qwen2.5-VL's M-RoPE), the first answer token's log-probabilities move."""
    from modelc.runtime.arch.mrope import MRope

    placed = _placed(vision, GOLD["cases"][1])
    (span,) = placed.images
    base = first_and_greedy(lm, placed.ids, 0, placed.images)[0]
    bare = first_and_greedy(lm, placed.ids, 0, (dataclasses.replace(span, deep=None),))[0]
    assert np.abs(base - bare).max() > 1e-3
    dec: Any = lm
    keep = dec.mrope
    dec.mrope = MRope(lm.hparams.rope_sections, dec.inv_freq, False)
    try:
        flat = first_and_greedy(lm, placed.ids, 0, placed.images)[0]
    finally:
        dec.mrope = keep
    assert np.abs(base - flat).max() > 1e-3


def test_the_fused_cuda_forward_refuses_and_compile_runs_the_decoder() -> None:
    """The device-resident CUDA forward names what it lacks in one line (``--device cuda``
    then goes op by op); a compiled program runs the runtime's decoder, and says why."""
    from modelc.compile.spec import forward_note, model_spec
    from modelc.runtime.backends.cuda_family import cuda_host

    ir = load_model(str(ensure_model()[1]))
    with pytest.raises(ModelcError) as e:
        cuda_host(ir)
    msg = str(e.value)
    assert "\n" not in msg and "DeepStack" in msg and "interleaved M-RoPE" in msg, msg
    assert "--device cuda" in msg, msg
    note = forward_note(model_spec(ir, "t"))
    assert "DeepStack" in note and "interleaved M-RoPE" in note, note


async def test_engine_in_chunks_batched_and_from_the_prefix_cache(vision: VisionModel) -> None:
    """Through the engine, two image prompts at once fed 7 tokens a step (each image split
    between chunks: its DeepStack rows added chunk by chunk), then both again (served from
    the prefix cache past the image): transformers' answers each time."""
    _, gg, mm = ensure_model()
    opt = EngineOptions(prefill_chunk=7, prefix_block_tokens=8, speculative=False)
    opt.mmproj, opt.kv_cache = str(mm), "f32"
    eng = build_engine(gg, opt, backend=make_backend("cpu-exact"))
    cases = GOLD["cases"][2:]
    got: dict[tuple[int, int], tuple[list[int], int]] = {}

    async def one(r: int, i: int, case: dict[str, Any]) -> None:
        p = SamplingParams(temperature=0, max_tokens=len(case["greedy"]))
        placed = _placed(vision, case)
        req = GenerationRequest(f"q{r}{i}", placed.ids, p, ignore_eos=True, images=placed.images)
        toks, cached = [], -1
        async for ev in eng.submit(req):
            if isinstance(ev, TokenEvent):
                toks.append(ev.token_id)
            elif isinstance(ev, FinishEvent):
                cached = ev.cached_tokens
        got[r, i] = toks, cached

    async with trio.open_nursery() as n:
        await n.start(eng.run)
        for r in range(2):
            async with trio.open_nursery() as reqs:
                for i, case in enumerate(cases):
                    reqs.start_soon(one, r, i, case)
        n.cancel_scope.cancel()
    for (r, i), (toks, cached) in sorted(got.items()):
        pad = cases[i]["prompt_ids"].index(SPECIAL["<|image_pad|>"])
        assert toks == cases[i]["greedy"] and (cached > pad) == (r == 1), (r, i, cached)


def test_a_projector_of_another_family_is_refused_at_start() -> None:
    """Qwen2.5-VL's projector with Qwen3-VL's model and the other way round (DeepStack
    layers and M-RoPE interleaving differ): one line at start."""
    from tests import gen_qwen25vl

    _, q25, q25_mm = gen_qwen25vl.ensure_model()
    _, q3, q3_mm = ensure_model()
    for model, mm in ((q3, q25_mm), (q25, q3_mm)):
        with pytest.raises(UsageError, match="does not go with"):
            build_engine(model, EngineOptions(mmproj=str(mm)))


@pytest.mark.parametrize("moe", [False, True], ids=["qwen3vl", "qwen3vlmoe"])
def test_llamacpp_counts_the_same_prompt_and_answers_alike(tmp_path: Path, moe: bool) -> None:
    """llama.cpp's server (``--mmproj``) on the image already of a size both keep (sides
    multiples of 32, within both's limits): the same prompt token count and transformers'
    greedy answer, which modelc gives (above; the mixture's below)."""
    pytest.importorskip("xllamacpp")
    gold = MOE if moe else GOLD
    case = next(c for c in gold["cases"] if c["image"].endswith("scene320.png"))
    _, gg, mm = (gen_qwen3vlmoe.ensure_model if moe else ensure_model)()
    text = case["prompt_text"].replace("<|vision_start|><|image_pad|><|vision_end|>", "<__media__>")
    n, toks = llamacpp_image_answer(
        gg, mm, text, _bytes(case), len(case["greedy"]), tmp_path / "lc.log"
    )
    assert n == len(case["prompt_ids"]) and toks == case["greedy"], (n, toks)


def test_pack_and_inspect(tmp_path: Path) -> None:
    """``modelc pack`` keeps the interleaved sections and the DeepStack layers; ``modelc
    inspect`` shows them."""
    cli = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    out = tmp_path / "q.modelc"
    cli("pack", str(ensure_model()[1]), "-o", str(out))
    art = open_artifact(out)
    try:
        hp = art.to_ir().hparams
        assert (hp.rope_sections, hp.rope_interleaved, hp.n_deepstack) == ([6, 5, 5], True, 2)
    finally:
        art.close()
    shown = cli("inspect", str(out)).stdout
    assert "M-RoPE sections t/h/w 6/5/5 interleaved" in shown, shown
    assert "DeepStack image features into the first 2 layers" in shown, shown


@pytest.fixture(scope="module")
def vlm() -> Iterator[Server]:
    _, gg, mm = ensure_model()
    yield from serve_exact(gg, mm)


def test_openai_image_url_answers_as_transformers(vlm: Server) -> None:
    case = GOLD["cases"][-1]
    n, ids = openai_image_greedy(
        vlm, "qwen3vl", _bytes(case), GOLD["question"], len(case["greedy"])
    )
    assert n == len(case["prompt_ids"]) and ids == case["greedy"]


def test_ollama_images_answer_as_openai(vlm: Server) -> None:
    """The ``ollama`` client's ``images``: the processor's prompt count, the answer the
    OpenAI route gives (transformers' tokens, above)."""
    case = GOLD["cases"][1]
    path = FIX / case["image"]
    got, want, n = ollama_and_openai_answers(vlm, "qwen3vl", path, GOLD["question"], 6)
    assert n == len(case["prompt_ids"])
    assert got and got == want
