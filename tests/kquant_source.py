"""The F16 source and the importance matrix that ``tests/golden/kquant_*.json`` were made from.

``scripts/make_kquant_goldens.py`` writes them, runs llama.cpp's ``llama-quantize`` on them
and records each output's manifest; ``tests/test_kquant_goldens.py`` writes the very same
files (the weights are a pure function of the tiny qwen3's seed) and packs them with modelc.

The model is the tiny qwen3 of ``tests/gen_families.py`` made 256 wide, so that its matrices
take K-quant blocks (attn_output's 128-wide rows fall back, as llama-quantize does); its
matrices are stored as F16 (or BF16), its vectors as F32, as ``convert_hf_to_gguf.py
--outtype f16`` writes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from modelc.artifact import mixes
from tests import gen_families
from tests.gguf_support import gguf_file

# 8 layers: every branch of the mixes' layer rules (use_more_bits: 0, 3, 6, 7; Q4_K_S: 0-3)
WIDE = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 8}
# the mixes compared with llama-quantize: modelc's name -> llama-quantize's type argument
MIXES = {mix: mix.upper() for mix in mixes.MIXES}
# the mixes also compared with an importance matrix: each quantizer's weighted search (Q8_0
# has none), and the rules that read it (Q4_0's ffn_down in Q4_1, IQ4's without Q5_K)
IMATRIX_MIXES = ("q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_m", "q4_k_m", "q5_k_s",
                 "q6_k", "iq4_nl", "iq4_xs")  # fmt: skip
# the mixes also compared on the model with one KV head for its 4 query heads (their attn_v
# rule for grouped-query attention of 4 or more)
GQA4_MIXES = ("q2_k", "iq4_xs")
IMATRIX_SEED = 36


@contextmanager
def wide_qwen3(kv_heads: int | None = None) -> Iterator[None]:
    """gen_families' qwen3 config made 256 wide (and given ``kv_heads`` KV heads) while the
    block runs."""
    old = gen_families.CONFIGS["qwen3"]
    kv = {} if kv_heads is None else {"num_key_value_heads": kv_heads}
    gen_families.CONFIGS["qwen3"] = {**old, **WIDE, **kv}
    try:
        yield
    finally:
        gen_families.CONFIGS["qwen3"] = old


def write_source(path: Path, qtype: str = "F16", kv_heads: int | None = None) -> None:
    """The F16 (or ``qtype`` BF16) GGUF of the 256-wide tiny qwen3 (``kv_heads``: with so
    many KV heads for its 4 query heads, not 2)."""
    with wide_qwen3(kv_heads):
        weights = gen_families.make_weights("qwen3")
        gen_families.write_gguf("qwen3", weights, path, gguf.GGMLQuantizationType[qtype])


def write_imatrix(source: Path, path: Path) -> None:
    """An importance matrix in llama-imatrix's GGUF layout (``general.type`` imatrix, the
    ``imatrix.*`` keys, per weight ``NAME.in_sum2`` (1, n_cols) and ``NAME.counts`` (1, 1))
    for every matrix of ``source`` but the token embedding (llama-imatrix sees no matmul of
    it); the sums are random, the counts whole numbers."""
    r = gguf.GGUFReader(str(source))
    rng = np.random.default_rng(IMATRIX_SEED)
    with gguf_file(path, "") as w:
        w.add_type("imatrix")
        w.add_array("imatrix.datasets", ["random"])
        w.add_uint32("imatrix.chunk_count", 8)
        w.add_uint32("imatrix.chunk_size", 512)
        for t in sorted(r.tensors, key=lambda t: t.name):
            if len(t.shape) < 2 or t.name == "token_embd.weight":
                continue
            cols = int(t.shape[0])  # GGML order: ne0 = the row length
            sums: np.ndarray[Any, Any] = rng.random((1, cols)).astype(np.float32) * 4096
            w.add_tensor(f"{t.name}.in_sum2", sums)
            w.add_tensor(f"{t.name}.counts", np.full((1, 1), 4096.0, dtype=np.float32))
