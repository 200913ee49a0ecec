"""Goldens of llama.cpp's ``llama-quantize`` for ``tests/test_kquant_goldens.py`` (issue 36).

Writes the F16 tiny qwen3 of ``tests/kquant_source.py`` and its importance matrix, runs
``llama-quantize`` on it for each mix (and those of ``IMATRIX_MIXES`` with the imatrix), and
records each output's manifest (per tensor: name, type, shape, sha256 of the bytes) as
``tests/golden/kquant_<mix>.json``, the source's as ``tests/golden/kquant_f16.json``; the same
model stored as BF16 (``kquant_bf16.json``) and its Q4_K_M (``kquant_bf16_q4_k_m.json``); the
model with one KV head (``kquant_gqa4_f16.json``) and its ``GQA4_MIXES``.

``llama-quantize`` is built from the llama-cpp-python 0.3.36 sdist's llama.cpp, CPU only::

    cmake -S /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp \\
        -B ~/.cache/llama-quantize-build -G Ninja -DCMAKE_BUILD_TYPE=Release \\
        -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \\
        -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF
    cmake --build ~/.cache/llama-quantize-build --target llama-quantize llama-perplexity -j2

then, from the repository root::

    PYTHONPATH=$PWD /work/main/.venv/bin/python -m scripts.make_kquant_goldens [--bin DIR] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from tests.gguf_manifest import manifest
from tests.kquant_source import GQA4_MIXES, IMATRIX_MIXES, MIXES, write_imatrix, write_source

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden"
BIN = Path.home() / ".cache" / "llama-quantize-build" / "bin"
SDIST = "llama-cpp-python 0.3.36 (vendor/llama.cpp)"


def quantize(binary: Path, src: Path, out: Path, qtype: str, imatrix: Path | None) -> list[str]:
    cmd = [
        str(binary),
        *(["--imatrix", str(imatrix)] if imatrix else []),
        str(src),
        str(out),
        qtype,
        "2",
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    return ["llama-quantize", *(["--imatrix", "kquant_imatrix.gguf"] if imatrix else []),
            src.name, out.name, qtype, "2"]  # fmt: skip


def record(name: str, path: Path, command: list[str]) -> None:
    m = manifest(path)
    doc = {"made_by": SDIST, "command": " ".join(command), "tensors": m["tensors"]}
    (GOLDEN / f"kquant_{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(name, len(m["tensors"]), "tensors")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", type=Path, default=BIN, help="the folder holding llama-quantize")
    ap.add_argument("--keep", type=Path, help="write the GGUFs here (default: a temporary folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = args.keep or Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        src, im = d / "kquant_f16.gguf", d / "kquant_imatrix.gguf"
        write_source(src)
        write_imatrix(src, im)
        record("f16", src, ["python -m scripts.make_kquant_goldens"])
        bf16 = d / "kquant_bf16.gguf"
        write_source(bf16, "BF16")
        record("bf16", bf16, ["python -m scripts.make_kquant_goldens"])
        exe = args.bin / "llama-quantize"
        for mix, qtype in MIXES.items():
            out = d / f"kquant_{mix}.gguf"
            record(mix, out, quantize(exe, src, out, qtype, None))
        for mix in IMATRIX_MIXES:
            out = d / f"kquant_{mix}_imatrix.gguf"
            record(f"{mix}_imatrix", out, quantize(exe, src, out, MIXES[mix], im))
        out = d / "kquant_bf16_q4_k_m.gguf"
        record("bf16_q4_k_m", out, quantize(exe, bf16, out, "Q4_K_M", None))
        gqa4 = d / "kquant_gqa4_f16.gguf"
        write_source(gqa4, kv_heads=1)
        record("gqa4_f16", gqa4, ["python -m scripts.make_kquant_goldens"])
        for mix in GQA4_MIXES:
            out = d / f"kquant_gqa4_{mix}.gguf"
            record(f"gqa4_{mix}", out, quantize(exe, gqa4, out, MIXES[mix], None))


if __name__ == "__main__":
    main()
