"""Goldens for the tiny random Qwen2.5-VL of ``tests/gen_qwen25vl.py``.

Run with the reference venv (torch + transformers 5.23), from the root:

    MODELC_PY=<the project venv's python> PYTHONPATH=<a directory linking the project venv's PIL> \\
        /root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_qwen25vl

The model is numpy-made by the project venv (``python -m tests.gen_qwen25vl``), so this
script and the tests load the very same files.  ``tests/golden/qwen25vl.json``, per image
(``tests/fixtures/vision/`` and ``tests/fixtures/qwenvl/scene.png``, big enough for the
tower's windows): ``Qwen2VLImageProcessorPil``'s pixel values (their shape, grid, sums and
every 53rd value), the tower + merger's embeddings (``get_image_features``, f32), and for
a one-image chat question the prompt ids (the release's template, ``<|image_pad|>`` once
per embedding, as ``Qwen2_5_VLProcessor`` expands it) with transformers' 12-token greedy
answer and the first answer token's top-10 log-probabilities (eager attention, f32; the
language model's M-RoPE positions from ``get_rope_index``); one text-only prompt too.
``converter``: llama.cpp's ``convert_hf_to_gguf.py`` (``LLAMA_CPP``) on the HF directory,
``--outtype f32``, the model and ``--mmproj``: each GGUF's manifest.  The converter does
not know the tiny tokenizer's pre-tokenizer hash; it is told ``qwen2`` (the release's).
"""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from scripts import vl_goldens
from scripts.vl_goldens import ROOT, load_tiny, pixel_stats, write_golden

IMAGES = ("vision/square.png", "vision/wide.png", "vision/tall.jpg", "qwenvl/scene.png")
QUESTION = "What is in the picture?"
TEXT_PROMPT = "Hello, tell me a story"
STRIDE = 53  # pixel values kept: every 53rd


def answer(model: Any, enc: dict[str, Any]) -> dict[str, Any]:
    """:func:`vl_goldens.answer` with no earlier image's M-RoPE offsets."""
    model.model.rope_deltas = None  # kept between calls: no earlier image's offsets
    return vl_goldens.answer(model, enc)


def chat(tok: Any, pix: Any, grid: Any) -> tuple[str, dict[str, Any]]:
    """The release template's one-image question and the model's inputs: ``<|image_pad|>``
    once per merged patch, marked in ``mm_token_type_ids`` as the Qwen VL processors do."""
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    n_tok = int(grid.prod()) // 4
    full = text.replace("<|image_pad|>", "<|image_pad|>" * n_tok)
    enc = dict(tok(full, return_tensors="pt"))
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    mm = (enc["input_ids"] == pad).int()
    enc |= {"pixel_values": pix, "image_grid_thw": grid, "mm_token_type_ids": mm}
    return text, enc


def main() -> None:
    torch.manual_seed(0)
    model, hf = load_tiny(Qwen2_5_VLForConditionalGeneration, "qwen25vl", tied=True)
    proc = Qwen2VLImageProcessorPil.from_pretrained(hf)
    tok = AutoTokenizer.from_pretrained(hf)
    cases = []
    for name in IMAGES:
        img = Image.open(ROOT / "tests" / "fixtures" / name)
        out = proc(images=img, return_tensors="pt")
        pix, grid = out["pixel_values"], out["image_grid_thw"]
        with torch.no_grad():
            emb = model.model.get_image_features(
                pixel_values=pix, image_grid_thw=grid
            ).pooler_output
        emb = torch.cat(list(emb), 0) if isinstance(emb, (list, tuple)) else emb
        text, enc = chat(tok, pix, grid)
        cases.append(
            {
                "image": name,
                "processor": type(proc).__name__,
                "pixel_shape": list(pix.shape),
                "grid_thw": grid[0].tolist(),
                **pixel_stats(pix, STRIDE),
                "embeddings": [[float(x) for x in row] for row in emb],
                "prompt_text": text,
                **answer(model, enc),
            }
        )
    text_case = answer(model, dict(tok(TEXT_PROMPT, return_tensors="pt")))
    fields = {
        "pixel_stride": STRIDE,
        "cases": cases,
    }
    text = {"prompt": TEXT_PROMPT, **text_case}
    write_golden("qwen25vl", QUESTION, fields, text, hf)


if __name__ == "__main__":
    main()
