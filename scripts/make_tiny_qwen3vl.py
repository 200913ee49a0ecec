"""Goldens for the tiny random Qwen3-VL of ``tests/gen_qwen3vl.py``.

Run with the reference venv (torch + transformers 5.23), from the root:

    MODELC_PY=<the project venv's python> PYTHONPATH=<a directory linking the project venv's PIL> \\
        /root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_qwen3vl [moe]

As ``scripts/make_tiny_qwen25vl.py`` (whose helpers run the project venv, the converter and
transformers' greedy answer): ``tests/golden/qwen3vl.json``, per image
(``tests/fixtures/vision/`` and ``tests/fixtures/qwenvl/scene320.png``, a size both
transformers and llama.cpp keep), ``Qwen2VLImageProcessorPil``'s pixel values (the
release's 65536 .. 16777216 pixels; shape, grid, sums and every 401st value), the tower +
merger's embeddings and the DeepStack mergers' features (``get_image_features``, f32; each
one's shape, sums and every 11th value), and for a one-image chat question the prompt ids
(``<|image_pad|>`` once per embedding, as ``Qwen3VLProcessor`` expands it) with
transformers' 12-token greedy answer and the first answer token's top-10 log-probabilities
(eager attention, f32; interleaved M-RoPE positions from ``get_rope_index``, the DeepStack
features added after the first layers); one text-only prompt too; ``converter``: llama.cpp's
converter's model and ``--mmproj`` GGUF manifests.  With ``moe``: ``tests/golden/qwen3vlmoe.json``
for ``tests/gen_qwen3vlmoe.py``'s model (the same tower), two images' prompts and answers
and the converter's manifests, no pixels or embeddings.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from PIL import Image
from transformers import (
    AutoTokenizer,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeForConditionalGeneration,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from scripts.make_tiny_qwen25vl import QUESTION, TEXT_PROMPT, answer, chat
from scripts.vl_goldens import ROOT, load_tiny, pixel_stats, write_golden

IMAGES = ("vision/square.png", "vision/wide.png", "vision/tall.jpg", "qwenvl/scene320.png")
PIX_STRIDE = 401  # pixel values kept: every 401st
EMB_STRIDE = 11  # embedding values kept: every 11th


def summary(t: Any) -> dict[str, Any]:
    """An array's shape, sums and every EMB_STRIDE-th value."""
    flat = t.flatten().double()
    return {
        "shape": list(t.shape),
        "sum": float(flat.sum()),
        "abs_sum": float(flat.abs().sum()),
        "sample": [float(x) for x in flat[::EMB_STRIDE]],
    }


def main() -> None:
    torch.manual_seed(0)
    moe = sys.argv[1:] == ["moe"]
    name = "qwen3vlmoe" if moe else "qwen3vl"
    cls = Qwen3VLMoeForConditionalGeneration if moe else Qwen3VLForConditionalGeneration
    model, hf = load_tiny(cls, name, tied=True)
    proc = Qwen2VLImageProcessorPil.from_pretrained(hf)
    tok = AutoTokenizer.from_pretrained(hf)
    cases = []
    for image in IMAGES[1::2] if moe else IMAGES:
        img = Image.open(ROOT / "tests" / "fixtures" / image)
        out = proc(images=img, return_tensors="pt")
        pix, grid = out["pixel_values"], out["image_grid_thw"]
        with torch.no_grad():
            feats = model.model.get_image_features(pixel_values=pix, image_grid_thw=grid)
        emb = feats.pooler_output
        emb = torch.cat(list(emb), 0) if isinstance(emb, (list, tuple)) else emb
        deep = torch.stack([torch.cat(list(f), 0) for f in feats.deepstack_features])  # (L, n, d)
        text, enc = chat(tok, pix, grid)
        if moe:
            cases.append({"image": image, "prompt_text": text, **answer(model, enc)})
            continue
        cases.append(
            {
                "image": image,
                "processor": type(proc).__name__,
                "pixel_shape": list(pix.shape),
                "grid_thw": grid[0].tolist(),
                **pixel_stats(pix, PIX_STRIDE),
                "embeddings": summary(emb),
                "deepstack": [summary(f) for f in deep],
                "prompt_text": text,
                **answer(model, enc),
            }
        )
    text_case = answer(model, dict(tok(TEXT_PROMPT, return_tensors="pt")))
    fields = {
        "pixel_stride": PIX_STRIDE,
        "embedding_stride": EMB_STRIDE,
        "cases": cases,
    }
    text = {"prompt": TEXT_PROMPT, **text_case}
    write_golden(name, QUESTION, fields, text, hf)


if __name__ == "__main__":
    main()
