"""What the VL golden scripts (``scripts/make_tiny_{qwen25vl,qwen3vl,pixtral,smolvlm,
lfm2vl}.py``) share: the project venv for the numpy-made model and the manifests,
llama.cpp's converter on the HF directory, transformers' greedy answer and the golden file.

Run by those scripts in the reference venv (torch + transformers 5.23).  The converter
does not know the tiny tokenizer's pre-tokenizer hash; it is told ``qwen2``.
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

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
LLAMA_CPP = Path(os.environ.get("LLAMA_CPP", "/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp"))
PROJECT_PY = os.environ.get("MODELC_PY", str(ROOT / ".venv" / "bin" / "python"))
CONVERT = f"""
import sys
sys.path.insert(0, {str(LLAMA_CPP)!r})
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[1:]]
import runpy
runpy.run_path({str(LLAMA_CPP / "convert_hf_to_gguf.py")!r}, run_name="__main__")
"""


def project(code: str) -> str:
    """Run ``code`` in the project venv (the numpy-made model, manifests); its stdout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [PROJECT_PY, "-c", code], cwd=ROOT, env=env, check=True, text=True, capture_output=True
    )
    return out.stdout


def converter(hf: Path) -> dict[str, object]:
    """llama.cpp's converter on the HF directory: the model's and the mmproj's manifests."""
    out: dict[str, object] = {"converter": f"{LLAMA_CPP}/convert_hf_to_gguf.py --outtype f32"}
    with tempfile.TemporaryDirectory() as tmp:
        for kind, extra in (("model", []), ("mmproj", ["--mmproj"])):
            dest = Path(tmp) / f"{kind}.gguf"
            args = [str(hf), "--outtype", "f32", *extra, "--outfile", str(dest)]
            subprocess.run([sys.executable, "-c", CONVERT, *args], cwd=LLAMA_CPP, check=True)
            code = (
                "import json; from tests.gguf_support import manifest; "
                f"print(json.dumps(manifest({str(dest)!r})))"
            )
            out[kind] = json.loads(project(code))
    return out


def load_tiny(cls: Any, family: str, tied: bool = False) -> tuple[Any, Path]:
    """The HF directory of ``tests/gen_{family}.py`` (made by the project venv) loaded as
    ``cls`` (f32, eager attention, in eval mode) and its path; every weight used and none
    missing (but ``lm_head`` where ``tied`` to the embeddings)."""
    hf = Path(
        project(f"from tests.gen_{family} import ensure_model; print(ensure_model()[0])").strip()
    )
    model, info = cls.from_pretrained(
        hf, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    missing = [k for k in info["missing_keys"] if not (tied and "lm_head" in k)]
    assert not missing and not info["unexpected_keys"], info
    model.eval()
    return model, hf


def pixel_stats(pix: Any, stride: int) -> dict[str, Any]:
    """Pixel values as the goldens keep them: their sum, absolute sum (f64) and every
    ``stride``-th value."""
    flat = pix.flatten().double()
    return {
        "pixel_sum": float(flat.sum()),
        "pixel_abs_sum": float(flat.abs().sum()),
        "pixel_sample": [round(float(x), 7) for x in pix.flatten()[::stride]],
    }


def answer(model: Any, enc: dict[str, Any], n_new: int = 12) -> dict[str, Any]:
    """transformers' greedy answer to ``enc``: the prompt ids, ``n_new`` greedy ids and
    the first answer token's top-10 log-probabilities."""
    with torch.no_grad():
        gen = model.generate(
            **enc,
            max_new_tokens=n_new,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    first = torch.log_softmax(gen.logits[0][0].float(), -1)
    top = torch.topk(first, 10)
    n = enc["input_ids"].shape[1]
    return {
        "prompt_ids": enc["input_ids"][0].tolist(),
        "greedy": gen.sequences[0, n:].tolist(),
        "top_logprobs": [[int(i), float(v)] for v, i in zip(top.values, top.indices, strict=True)],
    }


def write_golden(
    name: str, question: str, fields: dict[str, Any], text: dict[str, Any], hf: Path
) -> None:
    """``tests/golden/{name}.json``: the versions, ``question``, the family's ``fields``
    (strides, cases), the text-only case ``text`` and the converter's manifests of ``hf``."""
    gold = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "question": question,
        **fields,
        "text": text,
        "converter": converter(hf),
    }
    (GOLDEN / f"{name}.json").write_text(json.dumps(gold, indent=1) + "\n")
    print("wrote", GOLDEN / f"{name}.json")
