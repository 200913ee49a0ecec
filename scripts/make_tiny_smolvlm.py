"""Goldens for the tiny random SmolVLM of ``tests/gen_smolvlm.py``.

Run with the reference venv (torch + transformers 5.23), from the root:

    MODELC_PY=<the project venv's python> PYTHONPATH=<a directory linking the project venv's PIL> \\
        /root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_smolvlm

The model is numpy-made by the project venv (``python -m tests.gen_smolvlm``), so this
script and the tests load the very same files.  ``tests/golden/smolvlm.json``, per image
(``tests/fixtures/vision/`` and ``tests/fixtures/smolvlm/band.png``, 64 x 32: already the
size both resizes keep): ``SmolVLMImageProcessorPil``'s pixel values (their shape, the
tile rows and columns, sums and every 97th value), the tower + connector's embeddings
(``get_image_features``, f32), and for a one-image chat question the prompt ids
(the release's template, ``<image>`` expanded by ``SmolVLMProcessor``'s
``get_image_prompt_string``) with transformers' 12-token greedy answer and the first
answer token's top-10 log-probabilities (eager attention, f32); ``chat``: the same for
the prompt llama.cpp's chat route renders (the template given the text as a typed part,
the image's marker in it: ``User: <image>...``); one text-only prompt too.
``converter``: llama.cpp's ``convert_hf_to_gguf.py`` on the HF directory, as
``scripts/make_tiny_qwen25vl.py`` runs it.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from PIL import Image
from transformers import AutoTokenizer, SmolVLMForConditionalGeneration
from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil
from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

from scripts.vl_goldens import ROOT, answer, load_tiny, pixel_stats, write_golden

IMAGES = ("vision/square.png", "vision/wide.png", "vision/tall.jpg", "smolvlm/band.png")
QUESTION = "What is in the picture?"
TEXT_PROMPT = "Hello, tell me a story"
STRIDE = 97  # pixel values kept: every 97th


def main() -> None:
    torch.manual_seed(0)
    model, hf = load_tiny(SmolVLMForConditionalGeneration, "smolvlm")
    model.generation_config.eos_token_id = None  # 12 tokens, as the tests' ignore_eos
    proc = SmolVLMImageProcessorPil.from_pretrained(hf)
    tok = AutoTokenizer.from_pretrained(hf)
    n_tok = json.loads((hf / "processor_config.json").read_text())["image_seq_len"]
    user = [{"type": "image"}, {"type": "text", "text": QUESTION}]
    typed = [{"type": "text", "text": "<image>" + QUESTION}]  # llama.cpp's chat route
    cases = []
    for name in IMAGES:
        img = Image.open(ROOT / "tests" / "fixtures" / name)
        out = proc(images=[[img]], return_tensors="pt", return_row_col_info=True)
        pix, mask = out["pixel_values"], out["pixel_attention_mask"]
        rows, cols = int(out["rows"][0][0]), int(out["cols"][0][0])
        with torch.no_grad():
            emb = model.model.get_image_features(
                pixel_values=pix, pixel_attention_mask=mask
            ).pooler_output
        emb = torch.cat(list(emb), 0) if isinstance(emb, (list, tuple)) else emb
        expand = get_image_prompt_string(
            rows, cols, n_tok, "<fake_token_around_image>", "<image>", "<global-img>"
        )
        case: dict[str, Any] = {
            "image": name,
            "processor": type(proc).__name__,
            "pixel_shape": list(pix.shape[1:]),
            "rows": rows,
            "cols": cols,
            **pixel_stats(pix, STRIDE),
            "embeddings": [[float(x) for x in row] for row in emb.reshape(-1, emb.shape[-1])],
        }
        for key, content in (("", user), ("chat", typed)):
            msgs = [{"role": "user", "content": content}]
            text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            enc = dict(tok(text.replace("<image>", expand), return_tensors="pt"))
            enc |= {"pixel_values": pix, "pixel_attention_mask": mask}
            got = {"prompt_text": text, **answer(model, enc)}
            if key:
                case[key] = got
            else:
                case |= got
        cases.append(case)
    text_case = answer(model, dict(tok(TEXT_PROMPT, return_tensors="pt")))
    fields = {
        "pixel_stride": STRIDE,
        "cases": cases,
    }
    text = {"prompt": TEXT_PROMPT, **text_case}
    write_golden("smolvlm", QUESTION, fields, text, hf)


if __name__ == "__main__":
    main()
