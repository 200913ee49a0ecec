"""Qwen2.5-VL images on a real ``modelc run --mmproj`` (the tiny model of
``tests/gen_qwen25vl.py``, ``exact`` mode, f32 KV cache): the ``openai`` client's
``image_url`` data URL gets transformers' greedy answer (``tests/golden/qwen25vl.json``)
with the processor's prompt token count, and the ``ollama`` client's ``images`` the same
answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import pytest

from tests.gen_qwen25vl import ensure_model
from tests.peers import HTTP_TIMEOUT, image_question, openai_client
from tests.runtime_support import golden
from tests.server_fixtures import Server, start

GOLD: dict[str, Any] = golden("qwen25vl.json")
FIX = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def vlm() -> Iterator[Server]:
    _, gg, mm = ensure_model()
    srv = start(str(gg), "--mmproj", str(mm), "--kv-cache", "f32", env={"MODELC_MATMUL": "exact"})
    yield srv
    srv.stop()


@pytest.mark.parametrize("case", GOLD["cases"], ids=lambda c: c["image"].split("/")[-1])
def test_openai_image_url_answers_as_transformers(vlm: Server, case: dict[str, Any]) -> None:
    data = (FIX / case["image"]).read_bytes()
    kind = "jpeg" if case["image"].endswith("jpg") else "png"
    parts = image_question(data, GOLD["question"], kind)
    r = openai_client(vlm).chat.completions.create(
        model="qwen25vl",
        messages=[{"role": "user", "content": parts}],
        temperature=0,
        max_tokens=len(case["greedy"]),
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    assert r.usage is not None and r.usage.prompt_tokens == len(case["prompt_ids"])
    assert r.choices[0].model_extra is not None
    assert r.choices[0].model_extra["token_ids"] == case["greedy"]


def test_ollama_images_answer_as_openai(vlm: Server) -> None:
    case = GOLD["cases"][-1]
    path = FIX / case["image"]
    oc = ollama.Client(host=vlm.url, timeout=HTTP_TIMEOUT)
    opts = {"temperature": 0, "num_predict": 4}
    msg = {"role": "user", "content": GOLD["question"], "images": [path]}
    chat = oc.chat(model="qwen25vl", messages=[msg], options=opts)
    parts = image_question(path.read_bytes(), GOLD["question"])
    want = openai_client(vlm).chat.completions.create(
        model="qwen25vl", messages=[{"role": "user", "content": parts}], temperature=0, max_tokens=4
    )
    assert chat.message.content == want.choices[0].message.content
    assert chat.prompt_eval_count == len(case["prompt_ids"])
