"""A BERT GGUF served by modelc and by llama.cpp's own server, both held to transformers;
a nomic-bert GGUF (nomic-embed-text's graph, tiny and random) held to llama.cpp.

all-MiniLM-L6-v2 converted as llama.cpp's converter writes a BERT (``tests/gen_bert_gguf.py``:
phantom-space WordPiece vocabulary, mean pooling, F32 / F16 / Q8_0 matrices), then served by
``modelc run`` and by llama.cpp's server (xllamacpp, ``--embedding``) on loopback; both
are asked through the official ``openai`` client.  Held: the prompt tokens (each server's
``/tokenize``) equal each other and transformers' ids; the embeddings equal llama.cpp's
(cosine), and modelc's are at least as close to transformers' as llama.cpp's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from modelc.bench.llamacpp import LlamaCppServer
from modelc.formats import load_model
from modelc.runtime.arch import Bert, build
from tests import net
from tests.assets import minilm_dir
from tests.gen_bert_gguf import write, write_nomic
from tests.runtime_support import make_backend
from tests.server_fixtures import Server, start
from tests.test_runtime_bert import RECORDS, REF

# texts that spell special tokens: both servers (and transformers' tokenizer) take them as
# the tokens ("[SEP]" -> 102), as a query / passage pair does
SPECIAL_TEXTS = ["[CLS] literal special [SEP] tokens", "query: what is x? [SEP] passage: x is y"]
SENTENCES = [str(r["sentence"]) for r in RECORDS]
# cosine to llama.cpp's embeddings, at least: F32 / F16 matrices measured 0.999999 (llama.cpp's
# own f16 steps: max difference 2.6e-4), Q8_0 0.99973 (each quantizes activations its own way)
MIN_COS = {"f32": 0.99999, "f16": 0.99999, "q8_0": 0.999}


@pytest.fixture(scope="module", params=sorted(MIN_COS))
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Server, LlamaCppServer]]:
    ftype = str(request.param)
    tmp = tmp_path_factory.mktemp(f"bert-{ftype}")
    gguf = write(minilm_dir(), tmp / f"minilm-{ftype}.gguf", ftype)
    log = tmp / "llamacpp.log"
    srv = Server(str(gguf))  # loads while llama.cpp's server does
    try:
        with LlamaCppServer(
            gguf, threads=1, n_parallel=2, n_ctx=2048, log=log, embedding=True
        ) as peer:
            srv.wait_ready()
            yield ftype, srv, peer
    finally:
        srv.stop()


def embeddings(url: str, texts: list[str]) -> np.ndarray:
    client = openai.OpenAI(
        http_client=net.openai_http(), base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120
    )
    model = client.models.list().data[0].id
    out = client.embeddings.create(model=model, input=texts)
    return np.asarray([d.embedding for d in sorted(out.data, key=lambda d: d.index)])


def tokens(url: str, text: str) -> list[int]:
    r = net.post(f"{url}/tokenize", json={"content": text, "add_special": True}, timeout=60)
    r.raise_for_status()
    return [int(t) for t in r.json()["tokens"]]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_tokens_equal_llamacpp_and_transformers(pair: tuple[str, Server, LlamaCppServer]) -> None:
    _, srv, peer = pair
    for r in RECORDS:
        ours, theirs = tokens(srv.url, str(r["sentence"])), tokens(peer.url, str(r["sentence"]))
        assert ours == theirs == list(r["input_ids"]), r["sentence"]
    for text in SPECIAL_TEXTS:
        ours = tokens(srv.url, text)
        assert ours == tokens(peer.url, text), text
        assert ours.count(102) == 1 + text.count("[SEP]"), ours


def test_embeddings_match_llamacpp_and_transformers(
    pair: tuple[str, Server, LlamaCppServer],
) -> None:
    ftype, srv, peer = pair
    texts = SENTENCES + SPECIAL_TEXTS
    ours, theirs = embeddings(srv.url, texts), embeddings(peer.url, texts)
    cos = cosines(ours, theirs)
    assert cos.min() >= MIN_COS[ftype], f"{ftype}: cosines to llama.cpp {np.round(cos, 6)}"
    n = len(SENTENCES)
    ours_err, theirs_err = 1 - cosines(ours[:n], REF), 1 - cosines(theirs[:n], REF)
    # at least as close to transformers' as llama.cpp's (Q8_0: measured 4.73e-4 / 4.69e-4)
    assert ours_err.mean() <= max(1.1 * theirs_err.mean(), 1e-7), (ours_err, theirs_err)
    if ftype == "f32":  # the same weights as the HF directory: transformers' values
        assert np.abs(ours[:n] - REF).max() <= 1e-6


def test_quantized_tables_load_dequantized(tmp_path: Path) -> None:
    """A GGUF whose position and token-type tables are quantized (as tools other than the
    converter may write them) loads with them dequantized."""
    gguf = write(minilm_dir(), tmp_path / "minilm-q8-tables.gguf", "q8_0", tables=True)
    ir = load_model(gguf)
    assert ir.tensors["position_embd.weight"].dtype.name == "Q8_0"
    m = build(ir, make_backend("cpu"))
    assert isinstance(m, Bert)
    emb = m.embed([list(r["input_ids"]) for r in RECORDS])
    assert cosines(emb, REF).min() >= 0.999


@pytest.mark.parametrize("norm", [-1, 0, 1, 2, 3])
def test_llamacpp_embedding_route(pair: tuple[str, Server, LlamaCppServer], norm: int) -> None:
    """llama.cpp's own ``/embedding``: the same JSON shape, and the vectors scaled as its
    ``embd_normalize`` says (-1 none, 0 max-abs to the int16 range, 1 taxicab, 2 euclidean,
    3 a p-norm)."""
    ftype, srv, peer = pair
    req = {"content": SENTENCES[:3] + SPECIAL_TEXTS[:1], "embd_normalize": norm}
    got = [net.post(f"{u}/embedding", json=req, timeout=60) for u in (srv.url, peer.url)]
    ours, theirs = (r.raise_for_status().json() for r in got)
    assert [sorted(e) for e in ours] == [sorted(e) for e in theirs] == [["embedding", "index"]] * 4
    assert [e["index"] for e in ours] == [e["index"] for e in theirs] == [0, 1, 2, 3]
    a, b = (np.asarray([e["embedding"] for e in out]) for out in (ours, theirs))
    assert a.shape == b.shape == (4, 1, 384)
    a, b = a[:, 0], b[:, 0]
    assert cosines(a, b).min() >= MIN_COS[ftype]

    def size(v: np.ndarray) -> np.ndarray:  # the length embd_normalize scales to 1
        if norm == 0:
            return np.abs(v).max(axis=1) / 32760.0
        return (
            np.sum(np.abs(v) ** max(norm, 2), axis=1) ** (1 / max(norm, 2))
            if norm != 1
            else np.abs(v).sum(axis=1)
        )

    if norm < 0:  # the raw pooled vectors: their lengths agree
        np.testing.assert_allclose(size(a) / size(b), 1.0, atol=1e-3 if ftype != "q8_0" else 1e-2)
    else:
        np.testing.assert_allclose(size(a), 1.0, rtol=1e-5)
        np.testing.assert_allclose(size(b), 1.0, rtol=1e-5)


def test_embedding_route_errors(pair: tuple[str, Server, LlamaCppServer]) -> None:
    _, srv, _ = pair
    r = net.post(f"{srv.url}/embedding", json={"embd_normalize": 2}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "content", r.text
    r = net.post(f"{srv.url}/embedding", json={"content": [[10**7]]}, timeout=60)
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"], r.text
    assert net.get(f"{srv.url}/health", timeout=60).status_code == 200  # still serving


def test_ollama_embed_truncates_as_transformers(pair: tuple[str, Server, LlamaCppServer]) -> None:
    """Ollama's ``/api/embed`` truncates an input longer than the context by default (and
    refuses it with ``truncate: false``): the first 511 tokens and the [SEP], the ids
    transformers' tokenizer gives with truncation to 512."""
    from tokenizers import Tokenizer

    _, srv, _ = pair
    text = " ".join(["hello", "world"] * 400)
    hf = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    hf.enable_truncation(512)
    cut = hf.encode(text).ids
    ids = tokens(srv.url, text)
    assert len(ids) == 802 and len(cut) == 512 and cut == [*ids[:511], 102]
    model = (
        openai.OpenAI(http_client=net.openai_http(), base_url=f"{srv.url}/v1", api_key="x")
        .models.list()
        .data[0]
        .id
    )
    r = net.post(f"{srv.url}/api/embed", json={"model": model, "input": text}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] == 512
    ref = np.asarray(
        net.post(f"{srv.url}/v1/embeddings", json={"model": model, "input": [cut]}, timeout=60)
        .raise_for_status()
        .json()["data"][0]["embedding"]
    )
    np.testing.assert_array_equal(np.asarray(r.json()["embeddings"][0]), ref)
    body = {"model": model, "input": text, "truncate": False}
    r = net.post(f"{srv.url}/api/embed", json=body, timeout=60)
    assert r.status_code == 400 and "512" in r.json()["error"], r.text


@pytest.fixture(scope="module", params=sorted(MIN_COS))
def nomic_pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Server, LlamaCppServer]]:
    ftype = str(request.param)
    tmp = tmp_path_factory.mktemp(f"nomic-{ftype}")
    gguf = write_nomic(minilm_dir(), tmp / f"tiny-nomic-bert-{ftype}.gguf", ftype=ftype)
    log = tmp / "llamacpp.log"
    srv = Server(str(gguf))  # loads while llama.cpp's server does
    try:
        with LlamaCppServer(
            gguf, threads=1, n_parallel=2, n_ctx=4096, log=log, embedding=True
        ) as peer:
            srv.wait_ready()
            yield ftype, srv, peer
    finally:
        srv.stop()


def test_nomic_bert_matches_llamacpp(nomic_pair: tuple[str, Server, LlamaCppServer]) -> None:
    """nomic-bert (rotary positions in NeoX halves, one Q/K/V matrix, SwiGLU, no biases):
    the same tokens and embeddings as llama.cpp's graph (measured cosine 0.99999997, max
    difference 9e-5; the positions rotated as adjacent pairs instead measured 0.995, the
    MLP's gate and up swapped 0.82)."""
    ftype, srv, peer = nomic_pair
    texts = SENTENCES + SPECIAL_TEXTS
    for t in texts:
        assert tokens(srv.url, t) == tokens(peer.url, t), t
    ours, theirs = embeddings(srv.url, texts), embeddings(peer.url, texts)
    cos = cosines(ours, theirs)
    assert cos.min() >= MIN_COS[ftype], f"{ftype}: {np.round(cos, 6)}"
    if ftype != "q8_0":
        assert np.abs(ours - theirs).max() <= 1e-3
    info = net.get(f"{srv.url}/info", timeout=60).json()
    assert "nomic-bert" in str(info)


def test_inspect_shows_an_encoder(tmp_path: Path) -> None:
    """``modelc inspect`` of an embedding GGUF: its pooling, no sampling defaults."""
    gguf = write_nomic(minilm_dir(), tmp_path / "tiny-nomic-bert.gguf")
    out = subprocess.run(
        [sys.executable, "-m", "modelc.cli", "inspect", "--json", str(gguf)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "MODELC_HOME": str(tmp_path / "home")},
    ).stdout
    doc = json.loads(out)
    assert doc["architecture"] == "nomic-bert"
    assert doc["sampling_defaults"] is None
    assert "pooling mean, L2-normalised" in json.dumps(doc)


def test_cls_pooling_from_the_gguf(tmp_path: Path) -> None:
    """A BERT GGUF whose ``bert.pooling_type`` says CLS (bge's): both servers pool the first
    token, and modelc's vectors are the HF directory's CLS-pooled ones."""
    gguf = write(minilm_dir(), tmp_path / "minilm-cls.gguf", "f32", pooling=2)
    with LlamaCppServer(
        gguf, threads=1, n_parallel=2, n_ctx=2048, log=tmp_path / "llamacpp.log", embedding=True
    ) as peer:
        theirs = embeddings(peer.url, SENTENCES)
    srv = start(str(gguf))
    try:
        ours = embeddings(srv.url, SENTENCES)
    finally:
        srv.stop()
    assert cosines(ours, theirs).min() >= 0.99999
    m = build(load_model(minilm_dir()), make_backend("cpu"))
    assert isinstance(m, Bert)
    ref = m.embed([list(r["input_ids"]) for r in RECORDS], pooling="cls", normalize=True)
    assert np.abs(ours - ref).max() <= 1e-6
    assert cosines(ours, REF).max() < 0.999  # not the mean-pooled vectors
