"""Goldens for the tiny random Gemma 4 of ``tests/gen_gemma4.py``.

Run with the reference venv (torch + transformers 5.23), from the root:

    MODELC_PY=<the project venv's python> /root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_gemma4

The model is numpy-made by the project venv (``python -m tests.gen_gemma4``: HF directory +
GGUF in the test-asset cache), so this script and the tests load the very same files.
``tests/golden/family_gemma4.json``: per token-id prompt the top-10 next-token
log-probabilities and a 16-token greedy continuation from transformers in f32 (eager
attention), as ``make_tiny_families.py`` records them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

from scripts.make_tiny_families import GOLDEN, ROOT, records

PROJECT_PY = os.environ.get("MODELC_PY", str(ROOT / ".venv" / "bin" / "python"))


def main() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "from tests.gen_gemma4 import ensure_gemma4; print(*ensure_gemma4())"
    out = subprocess.run(
        [PROJECT_PY, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    hf = Path(out.stdout.split()[0])
    model = AutoModelForCausalLM.from_pretrained(
        hf, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    doc = {
        "model": "tests/gen_gemma4.py",
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, f32",
        "records": records(model),
    }
    (GOLDEN / "family_gemma4.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(hf)


if __name__ == "__main__":
    main()
