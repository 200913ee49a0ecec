"""llama.cpp's tokenizer test vectors through ``modelc tokenize`` on the vocab GGUF: every
vector of a vocabulary in one process (``modelc tokenize MODEL TEXT...`` loads the model
once and prints one JSON list a line), each TEXT its own argv entry.

The vectors were made with add_special=false; ``modelc tokenize`` adds special tokens
only as the model's own settings say, so the expected ids get exactly those around them
(BOS for llama-spm / llama-bpe / gemma-4, [CLS] ... [SEP] for bert-bge, <s> ... </s> for
nomic-bert-moe, nothing for gpt-2). nomic-bert-moe's vectors are this repository's
(tests/fixtures/vocab, made with the sdist's llama.cpp); the others are the sdist's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelc.formats import load_model
from tests import assets

ROOT = Path(__file__).resolve().parent.parent
VOCABS = ["gpt-2", "llama-spm", "llama-bpe", "bert-bge", "gemma-4", "nomic-bert-moe"]
OWN_VECTORS = Path(__file__).parent / "fixtures" / "vocab"


def _vectors(vocab: Path) -> list[tuple[str, list[int]]]:
    base = OWN_VECTORS / vocab.name
    if not Path(f"{base}.inp").exists():
        base = vocab
    inp = Path(f"{base}.inp").read_text(encoding="utf-8")
    out = Path(f"{base}.out").read_text(encoding="utf-8")
    texts = inp.split("\n__ggml_vocab_test__\n")
    if texts[-1] == "":  # as llama.cpp's read_tests: a last separator is optional
        texts.pop()
    ids = [[int(x) for x in line.split()] for line in out.split("\n")[: len(texts)]]
    assert len(texts) == len(ids) > 40
    return list(zip(texts, ids, strict=True))


def _specials(vocab: Path) -> tuple[list[int], list[int]]:
    spec = load_model(vocab).tokenizer
    assert spec is not None
    if spec.model == "bert":
        assert spec.cls_id is not None and spec.sep_id is not None
        return [spec.cls_id], [spec.sep_id]
    head = [spec.bos_id] if spec.add_bos and spec.bos_id is not None else []
    tail = [spec.eos_id] if spec.add_eos and spec.eos_id is not None else []
    return head, tail


@pytest.mark.slow
@pytest.mark.parametrize("name", VOCABS)
def test_every_vector_through_the_cli(name: str, tmp_path: Path) -> None:
    vocab = assets.vocab_dir() / f"ggml-vocab-{name}.gguf"
    head, tail = _specials(vocab)
    vectors = _vectors(vocab)
    r = subprocess.run(
        [sys.executable, "-m", "modelc.cli", "tokenize", str(vocab), *[t for t, _ in vectors]],
        cwd=ROOT,
        env={**os.environ, "MODELC_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        encoding="utf-8",
        check=False,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines.pop() == "" and len(lines) == len(vectors), r.stdout[-500:]
    failures = [
        text
        for (text, want), line in zip(vectors, lines, strict=True)
        if json.loads(line) != head + want + tail
    ]
    assert not failures, f"{len(failures)}/{len(vectors)} vectors differ, e.g. {failures[0]!r}"
