"""Decode-step kernels of the CUDA backend beside the GEMVs' arithmetic: the wide GEMV's
capped grid and its norm in the prologue (the same bits) and its warps a row (the sweep's
rule, on the CPU), the argmax of logit rows in parts, decode attention split over runs of
positions (flash-decoding) against one block a row and head, and RoPE in attention."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelc.formats import load_model
from modelc.formats.ir import DType
from modelc.runtime.backends.cuda import cuda_unavailable
from tests.gen_cuda_models import SMALL, Shape, random_blocks, write_random_llama

WHY = cuda_unavailable()
gpu = pytest.mark.skipif(WHY is not None, reason=f"no CUDA here: {WHY}")


@pytest.fixture(scope="module")
def be() -> Any:
    from modelc.runtime.backends.cuda_backend import CudaBackend

    return CudaBackend()


def rel(a: Any, b: Any) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


@gpu
@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q4_K, DType.Q6_K], ids=lambda d: d.name)
def test_the_wide_gemv_on_a_capped_grid_gives_the_same_bits(be: Any, dtype: DType) -> None:
    """``MODELC_CUDA_GEMV_WAVES=1`` (gemvw's grid capped at one resident wave, each block
    taking every grid-th group of rows): the same bits as a block a group (each row's sums in
    the same order), with and without warps splitting rows, ``acc`` on and off, x of 1..8
    rows, a matrix of several waves (28,672 rows) and one under a wave."""
    from modelc.runtime.backend import Weight

    cp, dev, rng = be.cp, be.dev, np.random.default_rng(51)
    try:
        dev.exact, dev.gemv_kind = False, "wide"
        for rows, cols in ((300, 4096), (4096, 14336), (28672, 4096)):
            data, _ = random_blocks(rng, dtype, rows, cols, 0.05)
            w = dev.upload([Weight(dtype, (rows, cols), data)])
            for n, acc, split in ((1, False, True), (3, True, True), (8, False, False)):
                dev.split_k = split
                x = cp.asarray(rng.standard_normal((n, cols)).astype(np.float32))
                base = cp.asarray(rng.standard_normal((n, rows)).astype(np.float32))
                ys = []
                for waves in (0, 1):
                    dev.waves = waves
                    y = base.copy()
                    dev.matmul(w, x, n, y, acc)
                    ys.append(y.get())
                assert ys[0].tobytes() == ys[1].tobytes(), (rows, cols, n, acc, split)
    finally:
        dev.read_env()


@pytest.mark.parametrize(
    ("rows", "cols", "want"),
    [(6144, 4096, 2), (4096, 4096, 1), (28672, 4096, 1), (4096, 14336, 4), (2560, 2048, 1),
     (11264, 2048, 1), (128256, 4096, 1)],
)  # fmt: skip
def test_the_wide_gemvs_warps_a_row_follow_the_sweep(rows: int, cols: int, want: int) -> None:
    """``cuda_gemvw.split`` on an H100 (132 SMs) gives the split the session-31 sweep found
    fastest for each 8B and 1.1B shape in Q4_K and Q6_K: QKV two warps a row (its blocks fill
    1.45 waves at one), the 14,336-wide down projection four (one unrolled pass a warp), the
    rest one; a split always leaves each warp at least one pass, at most 8 warps a row."""
    from modelc.runtime.backends import cuda_gemvw

    for code in (12, 14):
        assert cuda_gemvw.split(code, rows, cols, 1, 132) == want, (code, rows, cols)
    for code in cuda_gemvw.WIDE_TYPES:
        for nr in cuda_gemvw.WIDE_ROWS:
            w = cuda_gemvw.split(code, rows, cols, nr, 132)
            weights, lanes = cuda_gemvw.WIDE_UNITS[code]
            assert w in (1, 2, 4, 8)
            assert cols // weights >= w * (32 // lanes) or w == 1


def test_the_wide_gemv_launch_takes_the_split_rule() -> None:
    """``cuda_gemvw.launch`` (on the CPU, its launches recorded): each launch's warps a row
    are :func:`split`'s for its rows of x (session 31's first wiring passed the device's old
    rule instead, which the 8B survived and the 1.1B lost 18 % to), or the ``wpr`` forced,
    or one without split-K; the grid a block a group of 8 / wpr rows, capped by ``waves``."""
    from types import SimpleNamespace

    from modelc.runtime.backends import cuda_gemvw

    calls: list[tuple[str, tuple[int, ...], tuple[Any, ...]]] = []

    class Rec(dict[str, Any]):
        def __missing__(self, name: str) -> Any:
            return lambda grid, block, args: calls.append((name, grid, args))

    for rows, cols, n in ((4096, 4096, 1), (6144, 4096, 1), (4096, 14336, 3), (2048, 2048, 11)):
        p = SimpleNamespace(code=12, rows=rows, cols=cols, row_bytes=cols // 256 * 144, data=None)
        q8 = (np.zeros(n * cols, np.int8), np.zeros(n * cols // 32 * 2, np.float32))
        y = np.zeros((n, rows), np.float32)
        for wpr, split_k, waves in ((0, True, 0), (4, True, 0), (0, False, 0), (0, True, 1)):
            calls.clear()
            cuda_gemvw.launch(Rec(), p, q8, n, y, rows, False, 132, waves, wpr, split_k)
            assert len(calls) == -(-n // 8)  # launches of at most 8 rows of x
            for name, grid, args in calls:
                nr = int(name.rsplit("_", 1)[1])
                w = wpr or (cuda_gemvw.split(12, rows, cols, nr, 132) if split_k else 1)
                assert int(args[-1]) == w, (rows, cols, n, wpr, split_k)
                groups = -(-rows // (8 // w))
                cap = 132 * cuda_gemvw.WIDE_BLOCKS[nr] * waves if waves else groups
                assert grid == (min(groups, cap),)
    p = SimpleNamespace(code=12, rows=4096, cols=4096, row_bytes=2304, data=None)
    calls.clear()
    q8 = (np.zeros(4096, np.int8), np.zeros(256, np.float32))
    cuda_gemvw.launch(Rec(), p, q8, 1, np.zeros((1, 4096), np.float32), 4096, False, 132)
    assert int(calls[0][2][-1]) == 1  # the 8B's O projection: one warp a row, not the old 4


@gpu
def test_argmax_in_parts_is_numpys(be: Any) -> None:
    """``argmax_parts`` (a block a part of each row, the last block the row's pick): numpy's
    first index of the largest value for vocabularies of 1 to 262,144 logits, rows of ties
    (the first wins across parts), a -inf row, a row whose NaN is skipped, and row counts
    past the scratch's first size (the parts' buffers grown)."""
    cp, dev, rng = be.cp, be.dev, np.random.default_rng(61)
    for d in (1, 100, 2048, 2049, 32000, 128256, 262144):
        for n in (1, 5, 70):
            x = rng.standard_normal((n, d)).astype(np.float32)
            if d > 3000 and n > 1:
                x[0, [17, d - 5, 2600]] = 9.0  # ties in different parts: the first wins
                x[1] = -np.inf
            out = cp.full(n, -1, np.int64)
            dev.argmax(cp.asarray(x), n, out)
            assert out.get().tolist() == np.argmax(x, axis=1).tolist(), (d, n)
    x = rng.standard_normal((2, 5000)).astype(np.float32)
    x[0, 10], x[0, 4000] = np.nan, 7.0
    out = cp.full(2, -1, np.int64)
    dev.argmax(cp.asarray(x), 2, out)
    assert out.get().tolist() == [4000, int(np.argmax(x[1]))]


WIDE_HEADS = Shape(n_vocab=512, d=512, n_layer=2, n_head=4, n_head_kv=1, ff=512, n_ctx=512)


@gpu
@pytest.mark.parametrize("kv", ["f16", "f32"])
@pytest.mark.parametrize("shape", [SMALL, WIDE_HEADS], ids=["hd64", "hd128"])
def test_split_decode_attention_equals_one_block(
    be: Any, tmp_path: Path, kv: str, shape: Shape
) -> None:
    """``MODELC_CUDA_ATTN_SPLIT=S`` (S blocks a row and head, each a run of the positions,
    the last merging their parts): after a 300-token prompt, 8 decode steps' logits within
    1e-4 of one block a row and head for S = 2, 3, 8 and 64 (more runs than some rows'
    positions: empty runs), greedy tokens equal; the counts left at zero for the next step."""
    from modelc.runtime.backends.cuda_llama import CudaLlama
    from modelc.runtime.model import SeqChunk

    ir = load_model(write_random_llama(tmp_path / "m.gguf", DType.Q4_0, shape, seed=7))
    model = CudaLlama(ir, be)
    model.use_graphs = False  # the grid's runs change between the two sides' steps
    prompt = np.random.default_rng(3).integers(0, 500, 300).tolist()
    try:
        caches = [model.new_cache(kv) for _ in range(2)]
        last = [model.forward([SeqChunk(c, prompt)])[-1] for c in caches]
        tok = int(np.argmax(last[0]))
        for s in (2, 3, 8, 64, 2, 3, 8, 64):
            be.dev.attn_split = 1
            one = model.forward([SeqChunk(caches[0], [tok])])[0]
            be.dev.attn_split = s
            split = model.forward([SeqChunk(caches[1], [tok])])[0]
            assert rel(split, one) < 1e-4, (s, rel(split, one))
            assert int(np.argmax(split)) == int(np.argmax(one))
            tok = int(np.argmax(one))
        assert int(be.dev.scratch.bufs["attn_count"].get().max()) == 0
        for c in caches:
            c.free()
    finally:
        be.dev.read_env()


@gpu
@pytest.mark.parametrize("kv", ["f16", "f32"])
@pytest.mark.parametrize("shape", [SMALL, WIDE_HEADS], ids=["hd64", "hd128"])
def test_rope_in_attention_equals_rope_store(
    be: Any, tmp_path: Path, kv: str, shape: Shape
) -> None:
    """``MODELC_CUDA_ROPE_ATTN=1`` (a decode step's attention rotates q and stores the rows'
    keys and values itself, no rope_store launch): after prompts of 40 and 70 tokens, 8
    decode steps of the two sequences together (two rows, two positions) give the logits of
    the steps with rope_store within 1e-5, greedy tokens equal (later steps read the keys
    and values the earlier ones stored); a step with a prompt chunk keeps rope_store."""
    from modelc.runtime.backends.cuda_llama import CudaLlama
    from modelc.runtime.model import SeqChunk

    ir = load_model(write_random_llama(tmp_path / "m.gguf", DType.Q4_K, shape, seed=9))
    model = CudaLlama(ir, be)
    model.use_graphs = False
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 500, k).tolist() for k in (40, 70)]
    sides = [[model.new_cache(kv) for _ in prompts] for _ in range(2)]
    try:
        toks = []
        for side in sides:
            model.rope_attn = False  # the prompts through rope_store and the tiles
            toks = [
                int(np.argmax(model.forward([SeqChunk(c, p)])[-1]))
                for c, p in zip(side, prompts, strict=True)
            ]
        for _ in range(8):
            out = []
            for on, side in zip((False, True), sides, strict=True):
                model.rope_attn = on
                out.append(
                    model.forward([SeqChunk(c, [t]) for c, t in zip(side, toks, strict=True)])
                )
            assert rel(out[1], out[0]) < 1e-5, rel(out[1], out[0])
            assert np.argmax(out[1], axis=1).tolist() == np.argmax(out[0], axis=1).tolist()
            toks = np.argmax(out[0], axis=1).tolist()
        model.rope_attn = True  # a prompt chunk beside a decode row: rope_store, the same
        a = model.forward(
            [SeqChunk(sides[0][0], [toks[0], 5, 6]), SeqChunk(sides[0][1], [toks[1]])]
        )
        model.rope_attn = False
        b = model.forward(
            [SeqChunk(sides[1][0], [toks[0], 5, 6]), SeqChunk(sides[1][1], [toks[1]])]
        )
        assert rel(a, b) < 1e-5
    finally:
        for side in sides:
            for c in side:
                c.free()
