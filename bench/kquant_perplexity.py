"""Perplexity of modelc's packs (q4_k_m, or ``--mixes``) against llama.cpp's of the same F16 source.

    PYTHONPATH=$PWD .venv/bin/python -m bench.kquant_perplexity [--text README.md]
        [--ctx 128] [--chunks 16] [--bin ~/.cache/llama-quantize-build/bin] [--source F16.gguf]
        [--all-mixes] [--mixes q4_k_m,q2_k,...]

The source is the F16 tiny qwen3 of ``tests/kquant_source.py`` (random weights: the figure
is near the vocabulary size; what matters is that both sides give the same one), or
``--source``: an F16 GGUF such as ``bench.big_models``' ``smollm2-135m-f16.gguf`` (SmolLM2's
trained weights).
``llama-quantize`` writes each mix (Q4_K_M, ...), ``llama-perplexity`` scores it on the text
(``-c CTX -b CTX --chunks N``: each chunk of CTX tokens evaluated from an empty cache, the
tokens of its second half scored), and writes the token ids it read
(``--kl-divergence-base``). modelc packs the F16 file with ``--quantize MIX`` and scores
the very same ids the same way, with its exact (f32 activations) and its default (int8
activations, as llama.cpp's K-quant dot products quantize them to Q8_K) matmuls. The two
packs' tensor bytes are compared too (``tests/test_kquant_goldens.py`` holds them equal).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from modelc.artifact import PackOptions, load_artifact, open_artifact, write_artifact
from modelc.artifact.mixes import MIXES
from modelc.formats import load_model
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import build
from modelc.runtime.backends.cpu import CpuBackend
from modelc.runtime.model import LanguageModel, SeqChunk
from modelc.runtime.tokenizer import Tokenizer
from tests.gguf_manifest import manifest
from tests.kquant_source import IMATRIX_MIXES, write_imatrix, write_source

Array = np.ndarray[Any, Any]
BIN = Path.home() / ".cache" / "llama-quantize-build" / "bin"


def llama_perplexity(
    exe: Path, gguf: Path, text: Path, ctx: int, chunks: int, base: Path | None = None
) -> float:
    """llama-perplexity's final estimate (with ``base``: the ids it scored are written there;
    that run prints no final estimate)."""
    cmd = [str(exe), "-m", str(gguf), "-f", str(text), "-c", str(ctx), "-b", str(ctx),
           "--chunks", str(chunks), "-t", "2"]  # fmt: skip
    out = subprocess.run(
        cmd + (["--kl-divergence-base", str(base)] if base else []),
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    return float(m.group(1)) if m else float("nan")


def scored_ids(base: Path) -> tuple[int, Array]:
    """(n_ctx, ids (n_chunk, n_ctx)) from a ``--kl-divergence-base`` file's header."""
    raw = base.read_bytes()
    assert raw[:8] == b"_logits_"
    n_ctx, _n_vocab, n_chunk = np.frombuffer(raw, np.int32, 3, 8)
    ids = np.frombuffer(raw, np.int32, int(n_ctx * n_chunk), 20).reshape(n_chunk, n_ctx)
    return int(n_ctx), ids


def perplexity(model: LanguageModel, ids: Array, bos: int | None) -> float:
    """llama-perplexity's figure: per chunk (its first id made ``bos`` when the model adds
    one), the tokens after its first half."""
    n_ctx = ids.shape[1]
    first = n_ctx // 2
    nll, count = 0.0, 0
    for chunk in ids:  # (n_ctx,)
        cache = model.new_cache("f32")
        rows = tuple(range(first, n_ctx - 1))
        inp = [int(t) for t in chunk]
        inp[0] = inp[0] if bos is None else bos
        logits = model.forward([SeqChunk(cache, inp, rows)])  # (rows, vocab)
        z = logits.astype(np.float64)
        z -= z.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        nll -= float(logp[np.arange(len(rows)), chunk[first + 1 :]].sum())
        count += len(rows)
    return float(np.exp(nll / count))


def tensor_digests(path: Path) -> dict[str, tuple[str, str]]:
    art = open_artifact(path)
    try:
        return {
            e.name: (e.dtype.upper(), hashlib.sha256(np.array(art.load(e)).tobytes()).hexdigest())
            for e in art.manifest.tensors
        }
    finally:
        art.close()


def same_tensors(
    quantize: Path, ir: ModelIR, src: Path, d: Path, mix: str, imatrix: Path | None = None
) -> tuple[Path, Path, str]:
    """llama-quantize's and modelc's packs of ``src`` with ``mix``, and how many of their
    tensors are equal (type and bytes)."""
    tag = mix + ("_imatrix" if imatrix else "")
    theirs, ours = d / f"{tag}.gguf", d / f"{tag}.modelc"
    im = ["--imatrix", str(imatrix)] if imatrix else []
    subprocess.run([str(quantize), *im, str(src), str(theirs), mix.upper(), "2"],
                   check=True, capture_output=True)  # fmt: skip
    write_artifact(ir, ours, PackOptions(quantize=mix, imatrix=str(imatrix) if imatrix else None))
    llama = {t["name"]: (t["type"], t["sha256"]) for t in manifest(theirs)["tensors"]}
    got = tensor_digests(ours)
    differ = sorted(n for n in llama if got.get(n) != llama[n])
    return theirs, ours, f"{len(llama) - len(differ)} of {len(llama)} ({', '.join(differ[:5])})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--text", type=Path, default=Path(__file__).parents[1] / "README.md")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--bin", type=Path, default=BIN)
    ap.add_argument("--source", type=Path, help="an F16 GGUF (default: the tiny qwen3)")
    ap.add_argument(
        "--all-mixes", action="store_true", help="first compare every mix's tensors too"
    )
    ap.add_argument(
        "--mixes", default="q4_k_m", help="the mixes whose perplexity is measured, comma-separated"
    )
    args = ap.parse_args()
    scored = args.mixes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        src = args.source or d / "f16.gguf"
        if args.source is None:
            write_source(src)
        ir = load_model(src)
        quantize = args.bin / "llama-quantize"
        if args.all_mixes:
            write_imatrix(src, d / "imatrix.gguf")
            im = d / "imatrix.gguf"
            for mix, imx in [*((m, None) for m in MIXES), *((m, im) for m in IMATRIX_MIXES)]:
                _, _, same = same_tensors(quantize, ir, src, d, mix, imx)
                print(
                    f"{mix}{' + imatrix' if imx else ''}: tensors equal to llama-quantize's: {same}"
                )
        exe, text = args.bin / "llama-perplexity", args.text
        llama_perplexity(exe, src, text, args.ctx, args.chunks, d / "base")
        n_ctx, ids = scored_ids(d / "base")
        assert ir.tokenizer is not None
        tok = Tokenizer(ir.tokenizer)
        bos = tok.bos_id if tok.adds_bos else None
        ours_ids = tok.encode(args.text.read_text())
        same_ids = ours_ids[: ids.size] == [int(t) for t in ids.reshape(-1)]
        print(f"source {src.name}, text {args.text.name}: {ids.shape[0]} chunks of {n_ctx} "
              f"tokens, {ids.shape[0] * (n_ctx - 1 - n_ctx // 2)} scored; modelc's tokens equal "
              f"llama.cpp's: {same_ids}")  # fmt: skip
        f16 = llama_perplexity(exe, src, text, args.ctx, args.chunks)
        print(f"f16      llama.cpp PPL {f16:10.4f}   modelc exact "
              f"{perplexity(build(ir, CpuBackend(threads=2, matmul='exact')), ids, bos):10.4f}")  # fmt: skip
        for mix in scored:
            theirs, ours, same_bytes = same_tensors(quantize, ir, src, d, mix)
            ref = llama_perplexity(exe, theirs, text, args.ctx, args.chunks)
            got = {
                mode: perplexity(build(load_artifact(ours), CpuBackend(threads=2, matmul=mode)),
                                 ids, bos)
                for mode in ("fast", "exact")
            }  # fmt: skip
            print(f"{mix:<8} llama.cpp PPL {ref:10.4f}   modelc default {got['fast']:10.4f} "
                  f"({100 * (got['fast'] / ref - 1):+.3f}%)   exact {got['exact']:10.4f} "
                  f"({100 * (got['exact'] / ref - 1):+.3f}%)   tensors equal: {same_bytes}",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
