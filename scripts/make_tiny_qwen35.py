"""Goldens for the tiny random Qwen3.5 models of ``tests/gen_qwen35.py`` (qwen35, qwen35moe).

Run with the reference venv (torch + transformers 5.23 + the sdist's gguf-py), from the root:

    /root/.cache/modelc-ref-venv/bin/python scripts/make_tiny_qwen35.py [qwen35] [qwen35moe]

The model itself is numpy-made by the project venv (``python -m tests.gen_qwen35``), so
this script and the tests load the very same files.  Writes, per family,

* ``tests/golden/family_<family>.json``: transformers' f32 top-10 next-token log-probs and
  16-token greedy continuations of the prompts of ``make_tiny_families.py``, the ids of a
  text and of a chat prompt (the records of that script's ``goldens``);
* ``tests/golden/<family>_converter.json``: the converter manifest, what llama.cpp's own
  ``convert_hf_to_gguf.py`` (``--outtype f32 --no-mtp``) writes for the same HF
  directory: every metadata key/value (token lists as their sha256) and per tensor its
  name, type, shape and the sha256 of its bytes (for qwen35 also ``--outtype q8_0``,
  ``tests/golden/qwen35_q8_0_converter.json``).  The converter does not know the tiny
  384-token tokenizer's pre-tokenizer hash; it is told the name the real release's
  tokenizer hash maps to (``qwen35``, ``qwen2`` for Qwen3-Next; everything else it
  computes itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]

from make_tiny_families import GOLDEN, goldens  # noqa: E402

from tests.gguf_support import manifest  # noqa: E402

LCP = Path("/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp")
CONVERT = f"""
import sys
sys.path.insert(0, {str(LCP)!r})
import conversion.base as base
pre = sys.argv.pop()
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[1:]]
import runpy
runpy.run_path({str(LCP / "convert_hf_to_gguf.py")!r}, run_name="__main__")
"""


def converter_manifest(hf_dir: Path, pre: str, outtype: str = "f32") -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "conv.gguf"
        args = [str(hf_dir), "--outtype", outtype, "--no-mtp", "--outfile", str(out), pre]
        subprocess.run([sys.executable, "-c", CONVERT, *args], check=True, capture_output=True)
        doc = manifest(out)
    doc["converter"] = (
        f"{LCP.parent.parent.name} convert_hf_to_gguf.py --outtype {outtype} --no-mtp"
    )
    return doc


def project_python(code: str) -> str:
    """Run ``code`` in the project's python (``MODELC_PYTHON``, else ``.venv``), its stdout."""
    py = os.environ.get("MODELC_PYTHON") or str(ROOT / ".venv" / "bin" / "python")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([py, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(out.stderr)
    return out.stdout.strip()


def main(families: list[str]) -> None:
    for fam in families or ["qwen35", "qwen35moe", "qwen3next"]:
        code = f"from tests.gen_qwen35 import ensure_qwen35; print(*ensure_qwen35({fam!r}))"
        paths = project_python(code)
        hf = Path(paths.split()[0])
        goldens(fam, hf)
        path = GOLDEN / f"family_{fam}.json"
        doc = json.loads(path.read_text())
        path.write_text(json.dumps({**doc, "model": f"tests/gen_qwen35.py {fam}"}, indent=1) + "\n")
        code = f"from tests.gen_qwen35 import TOKENIZER_PRE; print(TOKENIZER_PRE[{fam!r}])"
        doc = converter_manifest(hf, project_python(code))
        (GOLDEN / f"{fam}_converter.json").write_text(json.dumps(doc, indent=1) + "\n")
        if fam == "qwen35":  # and the quantized file a user downloads
            doc = converter_manifest(hf, "qwen35", "q8_0")
            (GOLDEN / "qwen35_q8_0_converter.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(paths)


if __name__ == "__main__":
    main(sys.argv[1:])
