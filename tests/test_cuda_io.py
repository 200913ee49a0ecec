"""A CUDA step carrying its own meta in and greedy picks out (``cuda_io.StepIO``,
``MODELC_CUDA_STEP_IO=graph``): the greedy parameters as the one-launch sampler reads them,
which steps take the picks, the copies' sizes and addresses (CuPy's calls on numpy stand-ins
here); on a GPU, a model's greedy tokens with the step's own I/O as without it."""

from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from modelc.runtime.backends.cuda import cuda_unavailable
from modelc.runtime.backends.cuda_io import StepIO, greedy_params
from modelc.runtime.backends.cuda_sampler import params, sample_rows_ref
from modelc.runtime.batch_sampler import BatchParams
from modelc.runtime.sampling import Sampler, SamplingParams


def test_greedy_params_pick_each_rows_argmax() -> None:
    """The kernel's algorithm (``sample_rows_ref``) on :func:`greedy_params`: row i's first
    largest logit, -1 (handed back) for a row with a NaN or an infinite maximum."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 300)).astype(np.float32)
    x[2, [7, 40]] = 9.0  # a tie: the first
    x[4, 11] = np.nan
    x[5, 3] = np.inf
    got = sample_rows_ref(x, greedy_params(6))
    assert got[:4].tolist() == np.argmax(x[:4], axis=1).tolist() and got[2] == 7
    assert got[4:].tolist() == [-1, -1]


def test_set_params_puts_the_batch_first_and_greedy_rows_after() -> None:
    """:meth:`StepIO.set_params`: the batch's rows as :func:`.cuda_sampler.params` gives them,
    greedy rows past them (a step of other rows after a wider one picks greedily there)."""
    io = StepIO(stand_in_cupy(), rows=6, meta_len=8)
    chat = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1)
    bp = BatchParams.gather([Sampler(chat, 100), Sampler(SamplingParams(temperature=0.0), 100)])
    prm = params(bp, np.array([3, 1]))
    io.set_params(prm)
    assert (io.params[:2] == prm).all() and (io.params[2:] == greedy_params(6)[2:]).all()
    assert io.params[0, 0] == 0.8 and io.params[0, 5] == 3 and 0 < io.params[0, 4] < 1
    io.set_params(None)
    assert (io.params == greedy_params(6)).all()


class Arr:  # a device array's stand-in: its ``data.ptr`` an address on the host
    def __init__(self, arr: np.ndarray[Any, Any]) -> None:
        self.a, self.shape = arr, arr.shape
        self.data = SimpleNamespace(ptr=arr.ctypes.data)


class Runtime:  # cudaMemcpyAsync's stand-in: each copy made at once, and noted
    memcpyHostToDevice, memcpyDeviceToHost = 1, 2

    def __init__(self) -> None:
        self.copies: list[tuple[int, int, int, int]] = []  # dst, n, kind, stream

    def memcpyAsync(self, dst: int, src: int, n: int, kind: int, stream: int) -> None:
        ctypes.memmove(dst, src, n)
        self.copies.append((dst, n, kind, stream))


class PinnedBuf(bytearray):  # page-locked memory's stand-in: a buffer with an address
    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(self))


def stand_in_cupy() -> Any:
    return SimpleNamespace(
        cuda=SimpleNamespace(alloc_pinned_memory=PinnedBuf, runtime=Runtime()),
        asarray=lambda a: Arr(np.array(a)),
        zeros=lambda shape, dtype: Arr(np.zeros(shape, dtype)),
    )


def test_step_io_copies_the_meta_in_and_the_picks_out() -> None:
    """:meth:`StepIO.send` copies the page-locked meta and parameters to their device arrays
    whole, on the step's stream; :meth:`StepIO.pick` launches the sampler's kernel over r
    rows with those parameters and copies r picks back to :attr:`StepIO.picks`."""
    cp = stand_in_cupy()
    rt, stream = cp.cuda.runtime, SimpleNamespace(ptr=0x5150)
    io = StepIO(cp, rows=8, meta_len=64)
    meta = Arr(np.zeros(64, np.int64))
    io.meta[:10] = np.arange(10) * 3
    io.params[1] = [0.8, 40, 0.95, 0.05, 0.5, 1]
    io.send(meta, stream)
    assert meta.a[:10].tolist() == (np.arange(10) * 3).tolist() and (io.prm.a == io.params).all()
    h2d = rt.memcpyHostToDevice
    assert rt.copies == [
        (meta.data.ptr, 512, h2d, 0x5150),
        (io.prm.data.ptr, 8 * 6 * 8, h2d, 0x5150),
    ]
    launched = []

    def sample_rows(grid: Any, block: Any, args: Any) -> None:
        logits, v, prm, out = args
        launched.append(grid)
        out.a[: grid[0]] = sample_rows_ref(logits.a[:, : int(v)], prm.a[: grid[0]])

    dev = SimpleNamespace(fn={"sample_rows": sample_rows})
    rng = np.random.default_rng(1)
    logits = Arr(rng.standard_normal((8, 50)).astype(np.float32))
    logits.a[3, 0] = np.nan
    tokens = Arr(np.zeros(8, np.int64))
    io.set_params(None)
    io.send(meta, stream)
    io.pick(dev, logits, 5, tokens, stream)
    assert launched == [(5,)] and rt.copies[-1][1:] == (40, rt.memcpyDeviceToHost, 0x5150)
    want = np.argmax(logits.a[:5], axis=1)
    want[3] = -1
    assert io.picks[:5].tolist() == want.tolist()
    io.pick(dev, logits, 0, tokens, stream)  # no logit rows: nothing launched
    assert launched == [(5,)]


@pytest.mark.skipif(cuda_unavailable() is not None, reason="no CUDA here")
def test_steps_pick_on_the_device_as_the_samplers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small random llama's steps through ``forward_sample`` with the step's own I/O
    (prompts, then decode steps replayed, 11 sequences in a 16-row bucket), greedy and then
    with sampled rows (llama-server's defaults, seeded) and a banned id (the sampler's other
    calls): the tokens the default path picks (the one-launch sampler, the batched one)."""
    from modelc.formats import load_model
    from modelc.formats.ir import DType
    from modelc.runtime.backends.cuda import device
    from modelc.runtime.model import SeqChunk
    from tests.gen_cuda_models import SMALL, write_random_llama
    from tests.test_cuda_kernels import q8_gpu, restore

    ir = load_model(write_random_llama(tmp_path / "m.gguf", DType.Q4_0, SMALL, seed=5))
    rng = np.random.default_rng(9)
    prompts = [rng.integers(3, 500, int(rng.integers(3, 9))).tolist() for _ in range(11)]
    chat = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    mixes = {
        "greedy": [SamplingParams(temperature=0.0)] * 11,
        "sampled": [dataclasses.replace(chat, seed=i) if i % 3 else chat for i in range(11)],
        "banned": [SamplingParams(temperature=0.0, banned_token_ids=[1, 2])] * 11,
    }
    for name, ps in mixes.items():
        runs = []
        for io in ("host", "graph"):
            monkeypatch.setenv("MODELC_CUDA_STEP_IO", io)
            model = q8_gpu(ir, gemv_max=None)
            assert (model.io is not None) == (io == "graph")
            samplers = [
                Sampler(dataclasses.replace(p, seed=i), SMALL.n_vocab) for i, p in enumerate(ps)
            ]
            caches = [model.new_cache("f16", max_tokens=40) for _ in prompts]
            chunks = [SeqChunk(c, p) for c, p in zip(caches, prompts, strict=True)]
            out = []
            for _ in range(7):
                toks = model.forward_sample(chunks, BatchParams.gather(samplers)).tokens
                out.append(toks)
                for s, t in zip(samplers, toks, strict=True):
                    s.accept(int(t))
                chunks = [SeqChunk(c, [int(t)]) for c, t in zip(caches, toks, strict=True)]
            assert model.graph_steps["replayed"] >= 3
            runs.append(np.stack(out))
            for c in caches:
                c.free()
        assert (runs[0] == runs[1]).all(), (name, runs[0], runs[1])
    restore(device())
