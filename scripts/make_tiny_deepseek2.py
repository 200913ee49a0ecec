"""Goldens for the tiny DeepSeek models of ``tests/gen_deepseek2.py`` (V2-Lite- and
V3-shaped ``deepseek2``) and the GLM-4.5-shaped one of ``tests/gen_glm4moe.py``.

Run with the reference venv (torch + transformers + the sdist's gguf-py), from the root:

    /root/.cache/modelc-ref-venv/bin/python scripts/make_tiny_deepseek2.py [v2lite] [v3] [glm4moe]

The models are numpy-made by the project venv (``tests.gen_deepseek2.ensure_model``: HF
directory + GGUF in the test-asset cache).  Per model, ``tests/golden/deepseek2_<model>.json``
holds transformers' f32 records (top-10 next-token log-probabilities and a 16-token greedy
continuation per token-id prompt, as ``make_tiny_families.py``), and
``tests/golden/deepseek2_<model>_manifest.json`` the manifest (metadata and per-tensor
type, shape, sha256) of the GGUF that llama.cpp's own ``convert_hf_to_gguf.py`` writes
for the same HF directory with ``--outtype f32``.  The converter does not know the
fixture tokenizer's pre-tokenizer hash (a 384-token BPE with Qwen2's regex), so it is
told ``qwen2``, what the tests' GGUF says, and GLM's vocabulary step (which wants GLM's
``[gMASK]``/``<|user|>`` tokens) is the plain GPT-2 one; nothing else of the converter is
changed.  GLM's files are ``tests/golden/glm4moe.json`` and ``glm4moe_manifest.json``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
LCP = Path("/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp")
PROJECT_PY = "/work/main/.venv/bin/python"
MODELS = ["v2lite", "v3", "glm4moe"]


def _families_script() -> Any:
    """``make_tiny_families.py`` beside this script: its prompts and ``records``."""
    spec = importlib.util.spec_from_file_location(
        "make_tiny_families", ROOT / "scripts" / "make_tiny_families.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONVERT = f"""
import runpy, sys
sys.path.insert(0, {str(LCP)!r})
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[1:]]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
base.TextModel._set_vocab_glm = base.TextModel._set_vocab_gpt2
runpy.run_path({str(LCP / "convert_hf_to_gguf.py")!r}, run_name="__main__")
"""


def project(code: str) -> str:
    """Run ``code`` in the project venv (numpy-made models, the tests' manifest)."""
    env = {"PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [PROJECT_PY, "-c", code], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def converter_manifest(hf_dir: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "conv.gguf"
        args = [str(hf_dir), "--outtype", "f32", "--outfile", str(out)]
        subprocess.run([sys.executable, "-c", CONVERT, *args], check=True, capture_output=True)
        doc = json.loads(
            project(
                "import json; from pathlib import Path; from tests.gen_deepseek2 import manifest;"
                f" print(json.dumps(manifest(Path({str(out)!r}))))"
            )
        )
    doc["converter"] = "llama_cpp_python-0.3.36 convert_hf_to_gguf.py --outtype f32"
    return doc


def main(argv: list[str]) -> None:
    for model in argv or MODELS:
        ensure = (
            "gen_glm4moe import ensure_model"
            if model == "glm4moe"
            else "gen_deepseek2 import ensure_model"
        )
        arg = "" if model == "glm4moe" else repr(model)
        paths = project(f"from tests.{ensure}; print(*ensure_model({arg}))")
        name = "glm4moe" if model == "glm4moe" else f"deepseek2_{model}"
        hf = Path(paths.split()[0])
        lm = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
        doc = {
            "model": f"tests/{ensure.split()[0]}.py {arg.strip(chr(39))}".strip(),
            "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, f32",
            "records": _families_script().records(lm),
        }
        (GOLDEN / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        man = converter_manifest(hf)
        (GOLDEN / f"{name}_manifest.json").write_text(json.dumps(man, indent=1) + "\n")
        print(model, paths)


if __name__ == "__main__":
    main(sys.argv[1:])
