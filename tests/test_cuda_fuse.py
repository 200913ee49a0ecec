"""The norms and the gated activation fused into the wide GEMV's edges at batch 1
(:mod:`modelc.runtime.backends.cuda_fuse`): which launches a decode layer makes (on the CPU,
launches recorded), and on a GPU the fused steps' logits against the unfused ones, graph
replays against eager steps, the counts left at zero."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from modelc.formats import load_model
from modelc.formats.ir import DType
from modelc.runtime.backends import cuda_fuse
from modelc.runtime.backends.cuda import cuda_unavailable
from modelc.runtime.backends.cuda_scratch import Scratch
from tests.gen_cuda_models import Q4_K_M, Shape, write_random_llama

WHY = cuda_unavailable()
gpu = pytest.mark.skipif(WHY is not None, reason=f"no CUDA here: {WHY}")


class Arr:
    """A device array as the launches see it: a pointer and a shape; ``a[:, c:]`` moves
    the pointer by c floats."""

    def __init__(self, ptr: int, shape: tuple[int, ...]) -> None:
        self.data, self.shape = SimpleNamespace(ptr=ptr), shape

    def __getitem__(self, key: Any) -> Arr:
        c = key[1].start
        return Arr(self.data.ptr + 4 * c, (self.shape[0], self.shape[1] - c))


def fake_device(**kw: Any) -> Any:
    """What cuda_fuse reads of a cuda.Device, its launches recorded in ``calls``."""
    calls: list[tuple[str, tuple[int, ...], tuple[Any, ...]]] = []

    class Rec(dict[str, Any]):
        def __missing__(self, name: str) -> Any:
            return lambda grid, block, args: calls.append((name, grid, args))

    def norm_q8(x: Any, n: int, wn: Any, eps: float, h: Any, d: int) -> tuple[Any, Any]:
        calls.append(("rms_norm_v4_q8", (n,), (x, wn)))
        return "xq", "xs"

    dev = SimpleNamespace(fn=Rec(), sms=132, split_k=True, wpr=0, waves=0, fuse=True)
    dev.__dict__.update(gemv_kind="wide", exact=False, norm_q8=norm_q8, calls=calls)
    dev.edges = cuda_fuse.Edges(Scratch(np))
    dev.__dict__.update(kw)
    return dev


def weight(*parts: tuple[int, int], cols: int) -> Any:
    ps = [SimpleNamespace(code=c, rows=r, cols=cols, row_bytes=cols // 256 * 144, data=None)
          for c, r in parts]  # fmt: skip
    return SimpleNamespace(parts=ps, rows=sum(p.rows for p in ps), cols=cols)


def test_a_decode_layers_products_carry_its_norms_and_activation() -> None:
    """One row of x, the 8B's shapes: O (one Q4_K part) writes x and quantizes the FFN
    norm's input into its out edge (mode 1, the norm's weights); gate+up takes it (its in
    edge: the groups' sums of squares, d / 32 of them, eps) and quantizes SiLU(gate) * up
    (mode 2, half the rows); the activation is taken from there, not launched; down's out
    edge carries the next layer's norm into QKV, whose two parts (Q4_K, Q6_K) both scale by
    it.  Every product's warps a row are cuda_gemvw.split's."""
    from modelc.runtime.backends import cuda_gemvw

    dev = fake_device()
    x, wn1, wn2 = Arr(1 << 20, (1, 4096)), Arr(2 << 20, (4096,)), Arr(3 << 20, (4096,))
    gu = Arr(4 << 20, (1, 28672))
    wo, wgu = weight((12, 4096), cols=4096), weight((12, 28672), cols=4096)
    wdown, wqkv = weight((14, 4096), cols=14336), weight((12, 5120), (14, 1024), cols=4096)
    q8 = ("aq", "as")
    assert cuda_fuse.out_norm(dev, wo, 1, x, True, q8, wn1)
    assert dev.edges.pending == ("norm", x.data.ptr, wn1.data.ptr)
    act = cuda_fuse.Act(14336, False, wdown)
    assert cuda_fuse.norm_matmul(dev, x, 1, wn1, 1e-5, None, wgu, gu, act)
    assert dev.edges.pending == ("act", gu.data.ptr, 14336)
    hq8 = cuda_fuse.act_taken(dev, gu, 14336)
    assert hq8 is not None and dev.edges.pending is None
    assert cuda_fuse.out_norm(dev, wdown, 1, x, True, hq8, wn2)
    qkv = Arr(6 << 20, (1, 6144))
    assert cuda_fuse.norm_matmul(dev, x, 1, wn2, 1e-5, None, wqkv, qkv, None) is False
    assert dev.edges.pending is None
    names = [c[0] for c in dev.calls]
    assert names == ["gemvf_12", "gemvf_12", "gemvf_14", "gemvf_12", "gemvf_14"]
    o, g, d, q, v = (c[2] for c in dev.calls)
    # (W, rb, rows, cols, xq, xs, y, acc, wpr, gss, ngs, eps, mode, half, wn, oq, os, ogs, cnt)
    assert o[4:8] == ("aq", "as", x, 1) and o[12:15] == (1, 0, wn1) and int(o[10]) == 0
    assert g[6] is gu and int(g[7]) == 0 and int(g[10]) == 128 and g[9] is o[17]
    assert g[12:14] == (2, 14336) and g[4] is o[15] and g[5] is o[16]
    assert d[4] is g[15] and d[5] is g[16] and d[12:15] == (1, 0, wn2)
    assert q[9] is d[17] and v[9] is d[17] and int(q[10]) == int(v[10]) == 128
    assert int(q[12]) == int(v[12]) == 0  # no out edge on a product of two parts
    assert v[6].data.ptr == 6 << 20 | 4 * 5120  # V's rows after Q and K's
    assert o[17] is not None and o[15] is not g[15]  # norm and activation: their own x
    for name, grid, args in dev.calls:
        rows, cols = int(args[2]), int(args[3])
        w = cuda_gemvw.split(int(name.rsplit("_")[-1]), rows, cols, 1, 132)
        assert int(args[8]) == w and grid == (-(-rows // (8 // w)),), (name, rows, cols)


@pytest.mark.parametrize(
    "kw", [{"gemv_kind": "q8"}, {"exact": True}, {"fuse": False}, {"n": 2}, {"rows": 4100}]
)
def test_no_edges_where_they_do_not_apply(kw: dict[str, Any]) -> None:
    """Two rows of x, another GEMV kind, exact mode, ``MODELC_CUDA_FUSE=0`` or rows not in
    whole groups of 32: nothing launched, nothing left pending (the plain kernels run); an
    in edge only where the last out edge was x's by the same norm, an activation's out edge
    only for gate+up whose down product is wide."""
    n, rows = kw.pop("n", 1), kw.pop("rows", 4096)
    dev = fake_device(**kw)
    x, wn = Arr(1 << 20, (n, rows)), Arr(2 << 20, (rows,))
    assert not cuda_fuse.out_norm(dev, weight((12, rows), cols=4096), n, x, True, ("q", "s"), wn)
    assert dev.edges.pending is None and not dev.calls
    dev = fake_device()
    x, wn = Arr(1 << 20, (1, 4096)), Arr(2 << 20, (4096,))
    dev.edges.pending = ("norm", x.data.ptr, 7)  # another norm's: no in edge, no launch
    wq = weight((12, 4096), cols=4096)
    assert not cuda_fuse.norm_matmul(dev, x, 1, wn, 1e-5, None, wq, Arr(9, (1, 4096)), None)
    assert dev.edges.pending is None and not dev.calls
    act = cuda_fuse.Act(2048, False, weight((2, 4096), (12, 4096), cols=2048))  # down: 2 parts
    y = Arr(9 << 20, (1, 4096))
    assert cuda_fuse.norm_matmul(dev, x, 1, wn, 1e-5, None, wq, y, act)  # no in, act's out
    assert [c[0] for c in dev.calls] == ["rms_norm_v4_q8", "gemvf_12"]
    assert int(dev.calls[1][2][12]) == 2 and int(dev.calls[1][2][10]) == 0
    dev = fake_device()
    act = cuda_fuse.Act(2048, False, weight((8, 4096), cols=2048))  # Q8_0 down: not wide
    assert cuda_fuse.norm_matmul(dev, x, 1, wn, 1e-5, None, wq, y, act) is None


def rel(a: Any, b: Any) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


FUSE_SHAPE = Shape(n_vocab=512, d=512, n_layer=4, n_head=4, n_head_kv=2, ff=1536, n_ctx=512)


@pytest.fixture(scope="module")
def be() -> Any:
    from modelc.runtime.backends.cuda_backend import CudaBackend

    return CudaBackend()


@gpu
@pytest.mark.parametrize(
    ("dtype", "kv"), [(DType.Q4_0, "f16"), (Q4_K_M, "f16"), (Q4_K_M, "f32"), (DType.Q6_K, "f16")]
)
def test_fused_decode_matches_the_unfused_one(be: Any, tmp_path: Path, dtype: Any, kv: str) -> None:
    """A 4-layer random llama (d 512, ff 1,536: Q4_0, Q4_K with Q6_K V and down (an f16 and
    an f32 cache), Q6_K): after a 40-token prompt, 12 decode steps with the edges (eager)
    as close to the float CPU model's logits as the steps
    without (each layer's norms and SiLU as their own kernels): within twice their error
    and 1e-3 (8-bit rounding of x in another order: a last-place difference now and then
    turns into a quantization step, which Q4_K's min term carries undamped), greedy tokens
    equal;
    then graph replays of the fused step give the eager fused step's logits (1e-5); the counts are
    zero after every step."""
    from modelc.runtime.backends.cuda_llama import CudaLlama
    from modelc.runtime.model import SeqChunk
    from tests.test_cuda import cpu_exact

    ir = load_model(write_random_llama(tmp_path / "m.gguf", dtype, FUSE_SHAPE, seed=11))
    model = CudaLlama(ir, be)
    dev = be.dev
    prompt = np.random.default_rng(5).integers(0, 500, 40).tolist()
    try:
        dev.gemv_kind, dev.exact = "wide", False
        model.use_graphs = False
        caches = [model.new_cache(kv) for _ in range(3)]
        cpu = cpu_exact(ir)  # the float reference both paths are held to
        ccache = cpu.new_cache("f32")
        cpu.forward([SeqChunk(ccache, prompt)])
        last = [model.forward([SeqChunk(c, prompt)])[-1] for c in caches[:2]]
        tok = int(np.argmax(last[0]))
        eager = []
        for i in range(12):
            dev.fuse = False
            plain = model.forward([SeqChunk(caches[0], [tok])])[0]
            dev.fuse = True
            fused = model.forward([SeqChunk(caches[1], [tok])])[0]
            ref = cpu.forward([SeqChunk(ccache, [tok])])[0]
            e_plain, e_fused = rel(plain, ref), rel(fused, ref)
            assert e_fused <= 2 * e_plain + 1e-3, (i, e_fused, e_plain)
            assert int(np.argmax(fused)) == int(np.argmax(plain))
            assert int(dev.scratch.bufs["edge_cnt"].get().max()) == 0
            eager.append(fused)
            tok = int(np.argmax(plain))
        model.use_graphs = True
        model.reset_graphs()
        toks = [int(np.argmax(model.forward([SeqChunk(caches[2], prompt)])[-1]))]
        for e in eager:  # the same tokens through captured graphs: the same logits
            got = model.forward([SeqChunk(caches[2], [toks[-1]])])[0]
            assert rel(got, e) < 1e-5
            toks.append(int(np.argmax(got)))
        assert int(dev.scratch.bufs["edge_cnt"].get().max()) == 0
        for c in caches:
            c.free()
    finally:
        dev.read_env()
        model.reset_graphs()
