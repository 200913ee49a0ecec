"""Qwen2.5-VL images on a real ``modelc run --mmproj`` (the tiny model of
``tests/gen_qwen25vl.py``, ``exact`` mode, f32 KV cache): the ``openai`` client's
``image_url`` data URL gets transformers' greedy answer (``tests/golden/qwen25vl.json``)
with the processor's prompt token count, and the ``ollama`` client's ``images`` the same
answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gen_qwen25vl import ensure_model
from tests.peers import (
    ollama_and_openai_answers,
    openai_image_greedy,
    serve_exact,
)
from tests.runtime_support import golden
from tests.server_fixtures import Server

GOLD: dict[str, Any] = golden("qwen25vl.json")
FIX = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def vlm() -> Iterator[Server]:
    _, gg, mm = ensure_model()
    yield from serve_exact(gg, mm)


@pytest.mark.parametrize("case", GOLD["cases"], ids=lambda c: c["image"].split("/")[-1])
def test_openai_image_url_answers_as_transformers(vlm: Server, case: dict[str, Any]) -> None:
    data = (FIX / case["image"]).read_bytes()
    kind = "jpeg" if case["image"].endswith("jpg") else "png"
    n, ids = openai_image_greedy(vlm, "qwen25vl", data, GOLD["question"], len(case["greedy"]), kind)
    assert n == len(case["prompt_ids"]) and ids == case["greedy"]


def test_ollama_images_answer_as_openai(vlm: Server) -> None:
    case = GOLD["cases"][-1]
    path = FIX / case["image"]
    got, want, n = ollama_and_openai_answers(vlm, "qwen25vl", path, GOLD["question"], 4)
    assert got == want
    assert n == len(case["prompt_ids"])
