"""modelc's K-quant packs against llama.cpp's own ``llama-quantize`` (issue 36, must-show 2).

``scripts/make_kquant_goldens.py`` ran ``llama-quantize`` on the F16 tiny qwen3 of
``tests/kquant_source.py`` for each mix (and most with an importance matrix) and recorded
every output tensor's type, shape and sha256 in ``tests/golden/kquant_<mix>.json``. Here modelc
packs the same F16 file with the same mix: every tensor has llama-quantize's type and bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelc.artifact import PackOptions, mixes, open_artifact, write_artifact
from modelc.formats import load_model
from tests.gguf_manifest import manifest
from tests.kquant_source import GQA4_MIXES, IMATRIX_MIXES, MIXES, write_imatrix, write_source

GOLDEN = Path(__file__).parent / "golden"
# a golden's prefix -> the source it was made from (none: f16.gguf)
OTHER_SOURCES = {"bf16": "bf16.gguf", "gqa4": "gqa4_f16.gguf"}


def golden(name: str) -> list[dict[str, Any]]:
    tensors: list[dict[str, Any]] = json.loads((GOLDEN / f"kquant_{name}.json").read_text())[
        "tensors"
    ]
    return tensors


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The F16 source; beside it its BF16 twin and the importance matrix."""
    d = tmp_path_factory.mktemp("kquant")
    write_source(d / "f16.gguf")
    write_source(d / "bf16.gguf", "BF16")
    write_source(d / "gqa4_f16.gguf", kv_heads=1)
    write_imatrix(d / "f16.gguf", d / "imatrix.gguf")
    return d / "f16.gguf"


@pytest.mark.parametrize("stored", ["f16", "bf16", "gqa4_f16"])
def test_the_source_is_the_one_llama_quantize_read(stored: str, source: Path) -> None:
    assert manifest(source.with_name(f"{stored}.gguf"))["tensors"] == golden(stored)


def packed(source: Path, out: Path, opts: PackOptions | None) -> list[dict[str, Any]]:
    """The artifact's tensors as a GGUF manifest records them (``opts``: packed here first)."""
    if opts is not None:
        write_artifact(load_model(source), out, opts)
    art = open_artifact(out)
    try:
        rows = [
            {
                "name": e.name,
                "type": e.dtype.upper(),
                "shape": [int(n) for n in e.shape],
                "sha256": hashlib.sha256(np.array(art.load(e)).tobytes()).hexdigest(),
            }
            for e in art.manifest.tensors
        ]
    finally:
        art.close()
    return sorted(rows, key=lambda t: t["name"])


@pytest.mark.parametrize(
    "name",
    [*MIXES, *(f"{m}_imatrix" for m in IMATRIX_MIXES), "bf16_q4_k_m",
     *(f"gqa4_{m}" for m in GQA4_MIXES)],
)  # fmt: skip
def test_pack_equals_llama_quantize(name: str, source: Path, tmp_path: Path) -> None:
    """``<mix>``: of the F16 source; ``<mix>_imatrix``: with the imatrix; ``bf16_<mix>``: of
    the BF16 source; ``gqa4_<mix>``: of the F16 model with one KV head for 4 query heads."""
    other = OTHER_SOURCES.get(name.split("_")[0])
    src = source.with_name(other) if other else source
    mix = name.split("_", 1)[1] if other else name.removesuffix("_imatrix")
    im = str(source.with_name("imatrix.gguf")) if name.endswith("_imatrix") else None
    ours = {
        t["name"]: t
        for t in packed(src, tmp_path / "q.modelc", PackOptions(quantize=mix, imatrix=im))
    }
    theirs = {t["name"]: t for t in golden(name)}
    assert sorted(ours) == sorted(theirs)
    differ = [
        f"{n}: ours {ours[n]}, llama-quantize {theirs[n]}" for n in theirs if ours[n] != theirs[n]
    ]
    assert not differ, "\n".join(differ)
    assert mixes.MIXES[mix].name in {t["type"] for t in theirs.values()}


def test_cli_pack_quantize_q4_k_m_equals_llama_quantize(source: Path, tmp_path: Path) -> None:
    """The must-show's own command: ``modelc pack F16.gguf --quantize q4_k_m``."""
    from tests.cli_support import Cli

    cli = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    cli("pack", str(source), "-o", "q.modelc", "--quantize", "q4_k_m")
    assert packed(source, tmp_path / "q.modelc", None) == golden("q4_k_m")
