"""Goldens of one tiny random family of ``tests/gen_<family>.py``, for
``scripts/make_tiny_<family>.py`` (run with the reference venv, from the root).

``tests/golden/family_<family>.json`` holds, as ``make_tiny_families.py`` writes them:
transformers' f32 top-10 log-probs and 16-token greedy continuations of the token-id
prompts, the ids of a text and of a chat prompt (the family's template); and under
``converter`` the manifest (``tests/gguf_manifest.py``) of the GGUF that llama.cpp's own
``convert_hf_to_gguf.py`` (the llama-cpp-python 0.3.36 sdist) writes for the same HF
directory with ``--outtype f32``.  The tiny tokenizer's pre-tokenizer hash is not in the
converter's table, so the converter is told ``qwen2`` (the regex it was trained with).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from scripts.make_tiny_families import GOLDEN, project_python, records, variant
from tests.gguf_manifest import manifest

LCP = Path("/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp")
_CONVERT = (
    "import runpy, sys\n"
    "import conversion.base as base\n"
    "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'qwen2'\n"
    "sys.argv = ['convert_hf_to_gguf.py', *sys.argv[1:]]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def converter_manifest(hf_dir: Path, outtype: str = "f32") -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "model.gguf"
        args = [str(hf_dir), "--outtype", outtype, "--outfile", str(out)]
        env = {**os.environ, "PYTHONPATH": str(LCP / "gguf-py") + os.pathsep + str(LCP)}
        subprocess.run([sys.executable, "-c", _CONVERT, *args], cwd=LCP, env=env, check=True)
        return manifest(out)


def goldens(
    family: str,
    chat: list[dict[str, str]] | None = None,
    variants: list[dict[str, Any]] | None = None,
) -> None:
    """The goldens of ``tests/gen_<family>.py``'s model (its ``ensure_model``, run in the
    project venv); ``variants``: config.json changes recorded under ``scalings``."""
    gen = f"tests.gen_{family}"
    paths = project_python(f"from {gen} import ensure_model; print(*ensure_model())")
    hf_dir = Path(paths.split()[0])
    model = AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    fast = PreTrainedTokenizerFast.from_pretrained(hf_dir)
    text = "The model compiler packs a file."
    chat = chat or [{"role": "user", "content": "What works?"}]
    chat_ids = fast.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    if not isinstance(chat_ids, list):  # a BatchEncoding in transformers 5
        chat_ids = list(chat_ids["input_ids"])
    doc = {
        "model": f"tests/gen_{family}.py",
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, f32",
        "text": text,
        "text_ids": fast(text)["input_ids"],
        "chat": chat,
        "chat_ids": chat_ids,
        "records": records(model),
        "scalings": [variant(hf_dir, p) for p in variants or []],
        "converter": converter_manifest(hf_dir),
    }
    (GOLDEN / f"family_{family}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(family, paths)
