"""Goldens for the tiny random Mistral 3 (Pixtral vision) of ``tests/gen_pixtral.py``.

Run with the reference venv (torch + transformers 5.23), from the root:

    MODELC_PY=<the project venv's python> PYTHONPATH=<a directory linking the project venv's PIL> \\
        /root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_pixtral

As ``scripts/make_tiny_qwen25vl.py`` (whose helpers it uses): ``tests/golden/pixtral.json``
holds, per image, ``PixtralImageProcessorPil``'s pixel values (called with
``PixtralProcessor``'s patch size, 14 x the merge of 2: their shape, image size, sums and
every 53rd value), the tower + projector's embeddings (``get_image_features``, f32), and
for a one-image chat question the prompt ids (the template's ``[IMG]`` expanded as
``PixtralProcessor.replace_image_token`` does: each row's ``[IMG]``, ``[IMG_BREAK]`` after
every row, the last one ``[IMG_END]``) with transformers' 12-token greedy answer and the
first answer token's top-10 log-probabilities (eager attention, f32); one text-only
prompt too; ``converter``: llama.cpp's converter's model and ``--mmproj`` manifests.
"""

from __future__ import annotations

import torch
from PIL import Image
from transformers import AutoTokenizer, Mistral3ForConditionalGeneration
from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

from scripts.make_tiny_qwen25vl import answer
from scripts.vl_goldens import ROOT, load_tiny, pixel_stats, write_golden

IMAGES = ("vision/square.png", "vision/wide.png", "vision/tall.jpg", "qwenvl/scene.png")
QUESTION = "What is in the picture?"
TEXT_PROMPT = "Hello, tell me a story"
STRIDE = 53
MERGE = 2


def expand(text: str, rows: int, cols: int) -> str:
    """``PixtralProcessor.replace_image_token`` for one image."""
    toks = (["[IMG]"] * cols + ["[IMG_BREAK]"]) * rows
    toks[-1] = "[IMG_END]"
    return text.replace("[IMG]", "".join(toks), 1)


def main() -> None:
    torch.manual_seed(0)
    model, hf = load_tiny(Mistral3ForConditionalGeneration, "pixtral")
    proc = PixtralImageProcessorPil.from_pretrained(hf)
    tok = AutoTokenizer.from_pretrained(hf)
    patch = model.config.vision_config.patch_size * MERGE
    cases = []
    for name in IMAGES:
        img = Image.open(ROOT / "tests" / "fixtures" / name)
        out = proc(images=img, patch_size=patch, return_tensors="pt")
        pix, sizes = out["pixel_values"], out["image_sizes"]
        with torch.no_grad():
            emb = model.model.get_image_features(
                pixel_values=pix, image_sizes=sizes, vision_feature_layer=-1
            ).pooler_output
        emb = torch.cat(list(emb), 0) if isinstance(emb, (list, tuple)) else emb
        msgs = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}
        ]
        text = tok.apply_chat_template(msgs, tokenize=False)
        h, w = (int(x) for x in sizes[0])
        enc = dict(tok(expand(text, h // patch, w // patch), return_tensors="pt"))
        enc |= {"pixel_values": pix, "image_sizes": sizes}
        cases.append(
            {
                "image": name,
                "processor": type(proc).__name__,
                "pixel_shape": list(pix.shape),
                "image_size": [h, w],
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
    write_golden("pixtral", QUESTION, fields, text, hf)


if __name__ == "__main__":
    main()
