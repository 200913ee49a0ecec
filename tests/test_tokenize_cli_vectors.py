"""llama.cpp's tokenizer test vectors through ``modelc tokenize`` on the vocab GGUF (every
one, or an even spread for the vocabularies slow to load; the library test takes all).

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from modelc.formats import load_model
from tests import assets

ROOT = Path(__file__).resolve().parent.parent
VOCABS = ["gpt-2", "llama-spm", "llama-bpe", "bert-bge", "gemma-4", "nomic-bert-moe"]
# vocabularies slow to build per process (~6 s for gemma-4's 262k tokens): the CLI runs
# an even spread of this many of their vectors; tests/test_tokenizer.py runs every one
CLI_SAMPLE = {"gemma-4": 8, "nomic-bert-moe": 12}
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
    env = {**os.environ, "MODELC_HOME": str(tmp_path)}

    def run(text: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "modelc.cli", "tokenize", str(vocab), text],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            encoding="utf-8",
            check=False,
        )

    vectors = _vectors(vocab)
    if name in CLI_SAMPLE:
        vectors = vectors[:: -(-len(vectors) // CLI_SAMPLE[name])]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, [t for t, _ in vectors]))
    failures = []
    for (text, want), r in zip(vectors, results, strict=True):
        assert r.returncode == 0, r.stderr
        if json.loads(r.stdout) != head + want + tail:
            failures.append(text)
    assert not failures, f"{len(failures)}/{len(vectors)} vectors differ, e.g. {failures[0]!r}"
