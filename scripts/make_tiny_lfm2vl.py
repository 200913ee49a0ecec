"""Goldens for the tiny random LFM2-VL of ``tests/gen_lfm2vl.py``.

Run with the reference venv (torch + transformers 5.23), from the root:

    MODELC_PY=<the project venv's python> \\
        PYTHONPATH=<a directory linking the project venv's PIL and torchvision 0.28's files> \\
        /root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_lfm2vl

``Lfm2VlImageProcessor`` has only a torchvision backend: torchvision 0.28 (its CPU
wheel's Python files; the compiled ops it fails to load are not used by resizing) is
imported with its fake-op registrations skipped.  The model is numpy-made by the project
venv (``python -m tests.gen_lfm2vl``), so this script and the tests load the very same
files.  ``tests/golden/lfm2vl.json``, per image (``tests/fixtures/vision/``,
``tests/fixtures/lfm2vl/scene.png``, 320 x 224: a size the processor keeps, and
``panorama.png``, 1536 x 512: three 512-pixel tiles and a thumbnail):
``Lfm2VlImageProcessor``'s pixel values per piece (each tile's or the whole image's patch
grid, sums and every 211th value, a split image's every 997th, the padding left out), the SigLIP2 tower + projector's
embeddings (``get_image_features``, f32; a split image's every 16th row), and for a
one-image chat question the prompt ids as ``Lfm2VlProcessor`` expands ``<image>``
(``<|image_start|>``, each tile's ``<|img_row_R_col_C|>`` and the thumbnail's
``<|img_thumbnail|>`` before its ``<image>`` per embedding, ``<|image_end|>``) with transformers' 12-token greedy answer and the first
answer token's top-10 log-probabilities (eager attention, f32); one text-only prompt too;
``noise``: seeded random images' pixel values (a hard test of the resize's rounding).
``converter``: llama.cpp's ``convert_hf_to_gguf.py`` (``LLAMA_CPP``) on the HF directory,
``--outtype f32``, the model and ``--mmproj``: each GGUF's manifest.  The converter does
not know the tiny tokenizer's pre-tokenizer hash; it is told ``qwen2`` (the families').
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.library
from PIL import Image

from scripts.vl_goldens import ROOT, answer, load_tiny, write_golden

IMAGES = (
    "vision/square.png",
    "vision/wide.png",
    "vision/gray.png",
    "lfm2vl/scene.png",
    "lfm2vl/panorama.png",
)
QUESTION = "What is in the picture?"
TEXT_PROMPT = "Hello, tell me a story"
STRIDE = 211  # pixel values kept: every 211th (a split image's: every 997th)
NOISE = ((37, 91), (777, 1333))  # seeded noise images (h, w): pixel values only
EMB_STRIDE = 16  # a split image's embeddings kept: every 16th row (a whole one's: all)


def _torchvision() -> None:
    real = torch.library.register_fake
    torch.library.register_fake = lambda *a, **k: lambda f: f  # type: ignore[assignment]
    try:
        import torchvision  # noqa: F401
    finally:
        torch.library.register_fake = real


def levels(x: Any) -> list[int]:
    """The pixel levels (0..255) behind normalised values (mean and std 0.5): their sum
    and their sum weighted by position mod 251, exact integers where float sums are not."""
    lv = np.rint((x.astype(np.float64) * 0.5 + 0.5) * 255).astype(np.int64)
    return [int(lv.sum()), int((lv * (np.arange(lv.size) % 251)).sum())]


def piece(pix: Any, shape: list[int], stride: int) -> dict[str, Any]:
    """One tile's (or a whole image's) pixel values, the padding left out."""
    gh, gw = shape
    valid = pix[: gh * gw]  # (gh * gw, 16 * 16 * 3)
    flat = valid.flatten().double()
    return {
        "grid": [gh, gw],
        "pixel_shape": list(valid.shape),
        "pixel_sum": float(flat.sum()),
        "pixel_abs_sum": float(flat.abs().sum()),
        "levels": levels(valid.flatten().numpy()),
        "pixel_stride": stride,
        "pixel_sample": [round(float(x), 7) for x in valid.flatten()[::stride]],
    }


def main() -> None:
    _torchvision()
    from transformers import AutoTokenizer, Lfm2VlForConditionalGeneration, Lfm2VlProcessor
    from transformers.models.lfm2_vl.image_processing_lfm2_vl import Lfm2VlImageProcessor

    torch.manual_seed(0)
    model, hf = load_tiny(Lfm2VlForConditionalGeneration, "lfm2vl", tied=True)
    ip = Lfm2VlImageProcessor.from_pretrained(hf)
    tok = AutoTokenizer.from_pretrained(hf)
    proc = Lfm2VlProcessor(image_processor=ip, tokenizer=tok, chat_template=tok.chat_template)
    cases = []
    for name in IMAGES:
        img = Image.open(ROOT / "tests" / "fixtures" / name).convert("RGB")
        out = ip(images=img, return_tensors="pt")
        pix, mask, shapes = out["pixel_values"], out["pixel_attention_mask"], out["spatial_shapes"]
        with torch.no_grad():
            emb = model.model.get_image_features(
                pixel_values=pix, spatial_shapes=shapes, pixel_attention_mask=mask
            ).pooler_output
        emb = torch.cat(list(emb), 0) if isinstance(emb, (list, tuple)) else emb
        stride = 1 if len(pix) == 1 else EMB_STRIDE
        msgs = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}
        ]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        enc = dict(proc(images=[[img]], text=[text], return_tensors="pt"))
        cases.append(
            {
                "image": name,
                "processor": type(ip).__name__,
                "padded_to": pix.shape[1],
                "pieces": [
                    piece(p, s, STRIDE if len(pix) == 1 else 997)
                    for p, s in zip(pix, shapes.tolist(), strict=True)
                ],
                "n_embeddings": len(emb),
                "emb_stride": stride,
                "embeddings": [[round(float(x), 6) for x in row] for row in emb[::stride]],
                "prompt_text": text,
                **answer(model, enc),
            }
        )
    noise = []
    for k, (h, w) in enumerate(NOISE):
        img = Image.fromarray(np.random.default_rng(k).integers(0, 256, (h, w, 3), np.uint8))
        out = ip(images=img, return_tensors="pt")
        pieces = zip(out["pixel_values"], out["spatial_shapes"].tolist(), strict=True)
        noise.append({"seed": k, "size": [h, w], "pieces": [piece(p, s, 997) for p, s in pieces]})
    text_case = answer(model, dict(tok(TEXT_PROMPT, return_tensors="pt")))
    fields = {
        "cases": cases,
        "noise": noise,
    }
    text = {"prompt": TEXT_PROMPT, **text_case}
    write_golden("lfm2vl", QUESTION, fields, text, hf)


if __name__ == "__main__":
    main()
