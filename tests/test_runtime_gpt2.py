"""A randomly initialised GPT-2 (real 50257-token vocabulary) against transformers' goldens.

The weights are made by tests/gen_gpt2.py with numpy (deterministic, no torch) and
saved as a Hugging Face safetensors directory and as a PyTorch ``pytorch_model.bin``
directory; scripts/make_goldens.py loads the same files into ``GPT2LMHeadModel`` (and
checks ``torch.load`` reads the .bin bit for bit).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelc.formats import load_model
from modelc.runtime.arch import GPT2, build
from modelc.runtime.backend import Weight
from modelc.runtime.model import SeqChunk
from tests.gen_gpt2 import ensure_gpt2_random, ensure_gpt2_random_bin
from tests.runtime_support import (
    LOGPROB_TOL,
    check_record,
    check_records,
    first_divergence,
    golden,
    make_backend,
)

RECORDS: list[dict[str, Any]] = golden("gpt2_random.json")["records"]


def build_gpt2(path: Path, backend: str = "numpy") -> GPT2:
    m = build(load_model(path), make_backend(backend))
    assert isinstance(m, GPT2)
    return m


@pytest.fixture(scope="module")
def model() -> GPT2:
    return build_gpt2(ensure_gpt2_random())


def test_all_prompts_match_transformers(model: GPT2) -> None:
    assert len(RECORDS) >= 20
    for i, r in enumerate(RECORDS):
        err, gen = check_record(model, r)
        assert err <= LOGPROB_TOL, f"prompt {i}: top-10 logprob error {err:.2e}"
        assert gen == r["greedy"], f"prompt {i}: diverges at {first_divergence(gen, r['greedy'])}"


def test_cpu_kernels_match_transformers() -> None:
    m = build_gpt2(ensure_gpt2_random(), "cpu-exact")
    for i, r in enumerate(RECORDS[:8]):
        err, gen = check_record(m, r)
        assert err <= LOGPROB_TOL, f"prompt {i}: top-10 logprob error {err:.2e}"
        assert gen == r["greedy"]


def _layout(m: GPT2) -> list[tuple[str, tuple[int, ...], bool, bool]]:
    """Each weight array's dtype, shape and whether numpy's BLAS can read it in place."""
    arrays = [m.tok_embd.data, m.pos_embd, m.out_w, m.out_b, m.output.data]
    for b in m.blocks:
        values = [getattr(b, f.name) for f in dataclasses.fields(b)]
        arrays += [v.data if isinstance(v, Weight) else v for v in values]
    return [(str(a.dtype), a.shape, a.flags.aligned, a.flags.c_contiguous) for a in arrays]


def test_pytorch_bin_copy_matches_transformers(model: GPT2) -> None:
    m = build_gpt2(ensure_gpt2_random_bin())  # every prompt decoded in one batch
    # the unpadded zip's tensors as the safetensors file's: aligned (no copy per matmul)
    assert _layout(m) == _layout(model) and all(a and c for *_, a, c in _layout(m))
    for i, (r, (err, gen)) in enumerate(zip(RECORDS, check_records(m, RECORDS), strict=True)):
        assert err <= LOGPROB_TOL, f"prompt {i}: top-10 logprob error {err:.2e}"
        assert gen == r["greedy"], f"prompt {i}: diverges at {first_divergence(gen, r['greedy'])}"


def test_batched_equals_one_at_a_time(model: GPT2) -> None:
    """8 sequences, mixed prefill chunks and decode steps; all logits within 1e-4."""
    rng = np.random.default_rng(3)
    seqs = [rng.integers(0, model.n_vocab, n).tolist() for n in (2, 9, 5, 14, 1, 7, 11, 4)]
    ref = [model.forward([SeqChunk(model.new_cache(), s, tuple(range(len(s))))]) for s in seqs]
    caches = [model.new_cache() for _ in seqs]
    done = [0] * 8
    out: list[list[np.ndarray]] = [[] for _ in seqs]
    while any(d < len(s) for d, s in zip(done, seqs, strict=True)):
        batch, who = [], []
        for j, s in enumerate(seqs):
            if done[j] < len(s):
                n = 1 + (j % 3) * (done[j] == 0) * 2  # first chunk 1, 3 or 5 tokens, then decode
                part = s[done[j] : done[j] + n]
                batch.append(SeqChunk(caches[j], part, tuple(range(len(part)))))
                who.append((j, len(part)))
                done[j] += len(part)
        logits = model.forward(batch)
        row = 0
        for j, n in who:
            out[j].append(logits[row : row + n])
            row += n
    for j in range(8):
        np.testing.assert_allclose(np.concatenate(out[j]), ref[j], rtol=0, atol=1e-4)


def test_context_is_bounded_by_learned_positions(model: GPT2) -> None:
    assert model.new_cache(max_tokens=10_000).max_tokens == model.n_ctx == 256


def test_bad_metadata_is_a_format_error() -> None:
    import msgspec

    from modelc.errors import FormatError

    ir = load_model(ensure_gpt2_random())
    ir.hparams = msgspec.structs.replace(ir.hparams, n_head=0)
    with pytest.raises(FormatError, match="attention heads"):
        build(ir, make_backend("numpy"))
    ir = load_model(ensure_gpt2_random())
    del ir.tensors["blk.1.ffn_up.weight"]
    with pytest.raises(FormatError, match=r"blk\.1\.ffn_up\.weight"):
        build(ir, make_backend("numpy"))
