"""Goldens for the tiny random Gemma 3 vision-language model of ``tests/gen_gemma3vl.py``.

Run with the reference venv (torch + transformers 5.23), from the root:

    MODELC_PY=<the project venv's python> /root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_gemma3vl

The model is numpy-made by the project venv (``python -m tests.gen_gemma3vl``: HF
directory + model GGUF + mmproj GGUF in the test-asset cache), so this script and the
tests load the very same files.  ``tests/golden/gemma3vl.json``, per committed image of
``tests/fixtures/vision/``: the pixel values of transformers' ``Gemma3ImageProcessor``,
the image embeddings of the vision tower + projector (``get_image_features``, f32), and
for a one-image chat question the processor's prompt ids and transformers' 12-token
greedy answer with the first answer token's top-10 log-probabilities (eager attention,
f32: the image's soft tokens attend to each other both ways, as
``create_masks_for_generate`` has it).  ``converter``: llama.cpp's
``convert_hf_to_gguf.py`` (the llama-cpp-python 0.3.36 sdist's, ``LLAMA_CPP``) run on the
HF directory with ``--mmproj``: the GGUF's manifest (``tests.gguf_support.manifest``:
metadata, per tensor type, shape and sha256).  The text model is not converted here: the
converter does not know this tiny vocabulary's pre-tokenizer; its layout is the gemma3
family's, held by ``tests/test_families.py``.

The reference venv has no Pillow: put the project venv's ``PIL`` on ``PYTHONPATH`` (a
directory holding a link to it; same Python).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from PIL import Image
from transformers import AutoProcessor, Gemma3ForConditionalGeneration

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
IMAGES = ("square.png", "wide.png", "tall.jpg", "gray.png")
QUESTION = "What is in the picture?"
LLAMA_CPP = Path(os.environ.get("LLAMA_CPP", "/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp"))
PROJECT_PY = os.environ.get("MODELC_PY", str(ROOT / ".venv" / "bin" / "python"))


def project(code: str) -> str:
    """Run ``code`` in the project venv (the numpy-made model, manifests); its stdout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [PROJECT_PY, "-c", code], cwd=ROOT, env=env, check=True, text=True, capture_output=True
    )
    return out.stdout


def converter(hf: Path) -> dict[str, object]:
    """llama.cpp's converter on the HF directory: the mmproj GGUF's manifest."""
    out: dict[str, object] = {"converter": f"{LLAMA_CPP}/convert_hf_to_gguf.py"}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, extra in (("mmproj", ["--mmproj"]),):
            dest = Path(tmp) / f"{kind}.gguf"
            cmd = [sys.executable, "convert_hf_to_gguf.py", "--outtype", "f32", *extra]
            subprocess.run([*cmd, "--outfile", str(dest), str(hf)], cwd=LLAMA_CPP, check=True)
            code = (
                "import json; from tests.gguf_support import manifest; "
                f"print(json.dumps(manifest({str(dest)!r})))"
            )
            out[kind] = json.loads(project(code))
    return out


def main() -> None:
    torch.manual_seed(0)
    hf = Path(
        project("from tests.gen_gemma3vl import ensure_model; print(ensure_model()[0])").strip()
    )
    model, info = Gemma3ForConditionalGeneration.from_pretrained(
        hf, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    missing = [k for k in info["missing_keys"] if "lm_head" not in k]
    assert not missing and not info["unexpected_keys"], info
    model.eval()
    proc = AutoProcessor.from_pretrained(hf)
    cases = []
    for name in IMAGES:
        img = Image.open(ROOT / "tests" / "fixtures" / "vision" / name)
        pix = proc.image_processor(images=img, return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            emb = model.model.get_image_features(pixel_values=pix).pooler_output
        msgs = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}
        ]
        text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        enc = proc(text=text, images=[img], return_tensors="pt")
        with torch.no_grad():
            gen = model.generate(
                **enc,
                max_new_tokens=12,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
        first = torch.log_softmax(gen.logits[0][0].float(), -1)
        top = torch.topk(first, 10)
        ids = enc["input_ids"][0].tolist()
        cases.append(
            {
                "image": name,
                "processor": type(proc.image_processor).__name__,
                "pixel_values": [round(float(x), 7) for x in pix[0].flatten()],
                "pixel_shape": list(pix.shape[1:]),
                "embeddings": [[float(x) for x in row] for row in emb[0]],
                "prompt_text": text,
                "prompt_ids": ids,
                "greedy": gen.sequences[0, len(ids) :].tolist(),
                "top_logprobs": [
                    [int(i), float(v)] for v, i in zip(top.values, top.indices, strict=True)
                ],
            }
        )
    gold = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "question": QUESTION,
        "cases": cases,
        "converter": converter(hf),
    }
    (GOLDEN / "gemma3vl.json").write_text(json.dumps(gold, indent=1) + "\n")
    print("wrote", GOLDEN / "gemma3vl.json")


if __name__ == "__main__":
    main()
