"""Which path ``--device cuda`` takes, checked without a GPU: the device-resident forward
(CudaLlama) for what it runs, op by op on the op-level backend for the rest, with one log
line naming why (:func:`modelc.runtime.backends.cuda_offload.build_gpu`).

The numpy reference stands in for the GPU's op-level backend (as in tests/test_split.py),
so the op-by-op model's logits are checked against the CPU backend here; the same models
on a real GPU are tests/test_cuda_families.py.  Cost: three tiny models, a few seconds.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelc.errors import UsageError
from modelc.formats import load_model
from modelc.runtime.arch import build
from modelc.runtime.arch.decoder import Decoder
from modelc.runtime.backends.cuda import cuda_unavailable
from modelc.runtime.backends.cuda_offload import fused_lacks
from modelc.runtime.backends.numpy_ref import NumpyBackend
from modelc.runtime.split import SplitLM
from tests.runtime_support import (
    CountedNumpy,
    gpu_path,
    make_backend,
    same_as_reference,
    write_alike,
)
from tests.tiny_families import TINY


def _gpu(
    ir: Any,
    ngl: int | str = "auto",
    fused_only: bool = False,
    n_cpu_moe: int = 0,
    gpu: Any = NumpyBackend,  # stands in for CudaBackend
) -> Any:
    return gpu_path(ir, gpu, ngl, fused_only=fused_only, n_cpu_moe=n_cpu_moe)


def _same_as_cpu(ir: Any, model: Any) -> None:
    prompt = np.random.default_rng(3).integers(0, 300, 20).tolist()
    same_as_reference(build(ir, make_backend("cpu-exact")), model, prompt, 6)


@pytest.mark.parametrize(
    ("family", "lacking"),
    [
        ("qwen3", ""),  # every part runs device-resident
        ("gptoss", "a head size of 16"),  # its sinks, biases and experts run there
        ("lfm2", "short-convolution layers"),
        ("deepseek2", "multi-head latent attention"),
        ("gpt2", "gpt2 models"),
    ],
)
def test_what_the_fused_forward_lacks(family: str, lacking: str) -> None:
    why = fused_lacks(build(load_model(TINY[family]()), NumpyBackend()))
    assert lacking in why and bool(why) == bool(lacking), why


def test_a_family_the_fused_forward_lacks_runs_op_by_op(caplog: pytest.LogCaptureFixture) -> None:
    """The tiny gpt-oss (head size 16, which the fused kernels are not built for): the model's
    own forward on the GPU's op-level backend, one warning line saying so and why, the CPU
    backend's greedy tokens and log-probs; with ``--n-gpu-layers 1`` its first layer there
    and the rest on the CPU; with ``--device auto`` (fused only) the CPU runs it."""
    ir = load_model(TINY["gptoss"]())
    with caplog.at_level(logging.WARNING, logger="modelc"):
        model = _gpu(ir)
    (rec,) = caplog.records
    msg = rec.getMessage()
    assert "runs op by op" in msg and "a head size of 16" in msg and "\n" not in msg
    assert isinstance(model, Decoder) and isinstance(model.be, NumpyBackend)
    _same_as_cpu(ir, model)
    split = _gpu(ir, 1)
    assert isinstance(split, SplitLM)
    _same_as_cpu(ir, split)
    assert _gpu(ir, fused_only=True) is None


@pytest.mark.skipif(cuda_unavailable() is None, reason="CUDA is usable here")
def test_a_family_the_fused_forward_runs_goes_there(caplog: pytest.LogCaptureFixture) -> None:
    """qwen3 takes the device-resident path (here: no GPU, so its one-line refusal), no
    op-by-op line."""
    with caplog.at_level(logging.WARNING, logger="modelc"), pytest.raises(UsageError, match="cuda"):
        _gpu(load_model(TINY["qwen3"]()))
    assert not caplog.records


def test_prompt_attention_tiles_split_each_chunk() -> None:
    """The tiles the GPU's prompt attention takes (:func:`cuda_attn.tiles`): each chunk's
    rows in runs of 16, never across chunks (one sequence a tile), a decode row alone."""
    from modelc.runtime.backends.cuda_attn import MMA_ROWS, ROWS, runs, tiles

    t = tiles([slice(0, 37), slice(37, 38), slice(38, 41), slice(41, 57)])
    assert t.tolist() == [[0, 16], [16, 16], [32, 5], [37, 1], [38, 3], [41, 16]]
    assert ROWS == 16 and tiles([]).shape == (0, 2)
    t = tiles([slice(0, 130), slice(130, 131)], MMA_ROWS)  # attend_mma's tiles of 64
    assert t.tolist() == [[0, 64], [64, 64], [128, 2], [130, 1]]
    assert [hd for hd in (32, 64, 80, 96, 128, 256) if runs(hd)] == [32, 64, 96, 128]


@pytest.mark.parametrize("family", ["qwen3moe", "gptoss", "deepseek2"])
def test_experts_of_the_first_layers_on_the_cpu(
    family: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``--n-cpu-moe k`` (k: up to the first mixture layer, as llama.cpp counts layers, not
    mixtures: DeepSeek's first layer is dense): that layer's experts computed by the CPU
    kernels (the GPU's backend never multiplies by them), every other weight on the GPU's,
    op by op even for a family the fused forward runs (qwen3moe); one line says so; the
    CPU's greedy tokens and log-probs."""
    ir = load_model(TINY[family]())
    gpus: list[CountedNumpy] = []

    def gpu() -> CountedNumpy:
        gpus.append(CountedNumpy())
        return gpus[-1]

    host = build(ir, NumpyBackend())
    assert isinstance(host, Decoder)
    k = 1 + next(i for i, b in enumerate(host.blocks) if b.experts is not None)
    with caplog.at_level(logging.WARNING, logger="modelc"):
        model = _gpu(ir, n_cpu_moe=k, gpu=gpu)
    assert f"--n-cpu-moe {k}: the experts of 1 mixture layer(s) on the CPU" in caplog.text
    assert isinstance(model, Decoder) and model.be is gpus[0]
    _same_as_cpu(ir, model)
    first = model.blocks[k - 1].experts
    assert first is not None and first.backend is not None
    assert not isinstance(first.backend, NumpyBackend)  # the CPU kernels'
    later = [b.experts for b in model.blocks[k:] if b.experts is not None]
    assert later and all(e.backend is None for e in later)

    def ids(e: Any) -> set[int]:
        return {id(w) for w in (e.router, *e.gate, *e.up, *e.down)}

    assert not ids(first) & gpus[0].seen
    assert all(ids(e) & gpus[0].seen for e in later)
    assert id(model.blocks[k - 1].wo) in gpus[0].seen


def test_n_cpu_moe_on_a_dense_model_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """A model with no experts: ``--n-cpu-moe`` is a no-op (as llama.cpp's) and the model
    takes its usual path (LFM2 here: op by op, which runs without a GPU)."""
    ir = load_model(TINY["lfm2"]())
    with caplog.at_level(logging.INFO, logger="modelc"):
        model = _gpu(ir, n_cpu_moe=4)
    assert "--n-cpu-moe 4: this lfm2 model has no experts" in caplog.text
    assert isinstance(model, Decoder) and isinstance(model.be, NumpyBackend)
    _same_as_cpu(ir, model)


def test_n_cpu_moe_needs_the_gpu_and_a_number() -> None:
    from modelc.engine import EngineOptions

    with pytest.raises(UsageError, match="--n-cpu-moe 2 needs --device cuda"):
        EngineOptions(device="cpu", n_cpu_moe=2).validate()
    with pytest.raises(UsageError, match="--n-cpu-moe must be a number of layers"):
        EngineOptions(n_cpu_moe=-1).validate()
    EngineOptions(device="cpu", n_cpu_moe=0).validate()


def test_decode_steps_pad_to_graph_buckets() -> None:
    """With MODELC_CUDA_GRAPH_BUCKETS=1 a decode step of n sequences runs as
    :func:`graph_rows` (n up to 8, then the next multiple of 8: 64 streams meet 15 graphs);
    :func:`step_meta` gives the padding rows token 0 at position 0 of one more sequence,
    the scratch cache, and their own logit rows; the batch's own rows are as unpadded."""
    from modelc.runtime.backends.cuda_step import graph_rows, step_meta

    assert [graph_rows(n) for n in (1, 5, 8, 9, 16, 17, 63, 64, 65)] == [
        1, 5, 8, 16, 16, 24, 64, 64, 72,
    ]  # fmt: skip
    assert len({graph_rows(n) for n in range(1, 65)}) == 15
    ids, pos = np.array([11, 12, 13], np.int64), np.array([4, 9, 2], np.int64)
    slices = [slice(0, 1), slice(1, 2), slice(2, 3)]
    caches = [(1000, 16), (2000, 32), (3000, 8)]
    rows = np.arange(3, dtype=np.int64)
    m = 8
    plain = step_meta(ids, pos, slices, caches, rows, m).reshape(8, m)
    padded = step_meta(ids, pos, slices, caches, rows, m, 5, (9000, 1)).reshape(8, m)
    assert plain[:, :3].tolist() == padded[:, :3].tolist()  # the batch's own rows alike
    assert plain[0, :3].tolist() == [11, 12, 13] and plain[1, :3].tolist() == [4, 9, 2]
    assert plain[2, :3].tolist() == [0, 1, 2] and plain[3, :3].tolist() == [1000, 2000, 3000]
    assert plain[4, :3].tolist() == [16, 32, 8] and plain[5, :3].tolist() == [0, 1, 2]
    assert padded[0, 3:5].tolist() == [0, 0] and padded[1, 3:5].tolist() == [0, 0]
    assert padded[2, 3:5].tolist() == [3, 3]  # the padding rows' sequence: the fourth
    assert padded[3, 3] == 9000 and padded[4, 3] == 1  # the scratch cache
    assert padded[5, 3:5].tolist() == [3, 4]  # their logits: rows 3 and 4
    assert not padded[:, 5:].any() and not plain[:, 3:].any()
    with pytest.raises(ValueError, match="does not fit"):
        step_meta(ids, pos, slices, caches, rows, 4, 5, (9000, 1))


def test_steps_with_prompt_chunks_pad_to_graph_buckets() -> None:
    """:func:`run_shape`: a decode step pads its rows (each padding row its logits); a step
    with prompt chunks of up to ``mixed_rows`` rows pads its rows past one more (the
    padding tiles' and logit rows' row), its logit rows and tiles each to
    :func:`graph_rows`; past ``mixed_rows`` it runs as it is.  :func:`step_meta` points
    the padding logit rows at the padding rows in turn, :func:`pad_tiles` the padding
    tiles at the first padding row."""
    from modelc.runtime.backends.cuda_step import (
        graph_rows,
        mixed_runs,
        pad_tiles,
        run_shape,
        step_meta,
    )

    assert run_shape(11, 11, 0, True, 256) == (16, 16, 0)
    assert run_shape(11, 9, 0, True, 0) == (16, 14, 0)  # decode buckets whatever mixed_rows
    assert run_shape(95, 63, 66, False, 256) == (96, 64, 72)
    assert run_shape(96, 63, 66, False, 256) == (104, 64, 72)  # one padding row at least
    assert run_shape(5, 2, 3, False, 256) == (6, 2, 3)
    assert run_shape(255, 9, 30, False, 256) == (256, 16, 32)
    assert run_shape(256, 9, 30, False, 256) is None and run_shape(40, 2, 4, False, 0) is None
    # MODELC_CUDA_MIXED_BUCKET=32: mixed steps in multiples of 32, the rows within the buffers
    assert run_shape(258, 65, 70, False, 520, 32) == (288, 96, 96)
    assert run_shape(500, 65, 70, False, 520, 32) == (512, 96, 96)
    assert run_shape(515, 65, 70, False, 520, 32) == (520, 96, 96)  # 544 > 520: its 8s
    assert run_shape(5, 2, 3, False, 520, 32) == (32, 32, 32)
    assert run_shape(11, 11, 0, True, 520, 32) == (16, 16, 0)  # decode steps as before
    # the shapes of a 64-stream load's mixed steps (decoding rows beside a ~190-token
    # chunk): 8s meet several times as many as 32s
    load = [(d + c, d + 1, d + c // 16) for d in range(40, 65) for c in range(185, 200)]
    count = [len({run_shape(*x, False, 520, b) for x in load}) for b in (8, 32)]
    assert count[1] * 3 <= count[0], count
    for n, r, t in ((13, 7, 7), (100, 64, 70), (200, 3, 20)):
        run, r_run, t_run = run_shape(n, r, t, False, 256) or (0, 0, 0)
        assert run > n and r <= r_run <= run and t <= t_run <= run
        assert (run, r_run, t_run) == (graph_rows(n + 1), graph_rows(r), graph_rows(t))
    # MODELC_CUDA_MIXED_KEY=rows: the logit rows and tiles as the rows say, so one graph a
    # row bucket (every one captured when the model loads: mixed_runs), unless they need more
    assert run_shape(95, 63, 66, False, 520, 8, True) == (96, 72, 84)
    assert run_shape(95, 73, 66, False, 520, 8, True) == (96, 80, 72)  # past 72 logit rows
    assert run_shape(95, 63, 90, False, 520, 8, True) == (96, 64, 96)  # past 72 + run / 8 tiles
    assert run_shape(5, 2, 3, False, 520, 8, True) == (6, 6, 6)
    for b in (8, 32):
        keys = {run_shape(*x, False, 520, b, True) for x in load}
        runs = {k[0] for k in keys if k is not None}
        assert len(keys) == len(runs) and runs <= set(mixed_runs(520, b, 4096)), (b, keys)
    assert mixed_runs(520, 32, 4096) == [*range(32, 513, 32), 520]
    assert mixed_runs(520, 32, 200) == [32, 64, 96, 128, 160, 192]  # a chunk within n_ctx
    assert mixed_runs(520, 8, 4096)[:6] == [4, 5, 6, 7, 8, 16]  # a decode row, a 2-row chunk
    tiles = np.array([[0, 1], [1, 1], [2, 16], [18, 4]], np.int64)
    assert pad_tiles(tiles, 6, 22).tolist() == [[0, 1], [1, 1], [2, 16], [18, 4], [22, 1], [22, 1]]
    assert pad_tiles(tiles, 4, 22).tolist() == tiles.tolist()
    # 2 decodes and a 3-token chunk: 5 rows run as 8, 3 logit rows as 6
    ids, pos = np.arange(1, 6, dtype=np.int64), np.array([7, 3, 0, 1, 2], np.int64)
    slices = [slice(0, 1), slice(1, 2), slice(2, 5)]
    meta = step_meta(
        ids, pos, slices, [(1, 8), (2, 8), (3, 8)], np.array([0, 1, 4]), 8, 8, (9, 1), 6
    )
    meta = meta.reshape(8, 8)
    assert meta[5, :6].tolist() == [0, 1, 4, 5, 6, 7]  # padding logit rows: rows 5, 6, 7
    assert meta[2, :8].tolist() == [0, 1, 2, 2, 2, 3, 3, 3] and meta[3, 3] == 9
    meta = step_meta(
        ids, pos, slices, [(1, 8), (2, 8), (3, 8)], np.array([0, 1, 4]), 8, 6, (9, 1), 6
    )
    assert meta.reshape(8, 8)[5, :6].tolist() == [0, 1, 4, 5, 5, 5]  # one padding row, thrice
    with pytest.raises(ValueError, match="need padding rows"):
        step_meta(ids, pos, slices, [(1, 8), (2, 8), (3, 8)], np.array([0, 1, 4]), 8, 0, (0, 0), 6)


class NumpyAsCupy:
    """The CuPy calls :class:`CudaKVCache` makes, on numpy, counting copies between the
    host and the (stand-in) device."""

    def __init__(self) -> None:
        self.copies = 0
        self.copied: list[tuple[int, ...]] = []  # the shapes copied to the host
        self.empty = np.empty
        self.cuda = type(
            "cuda", (), {"get_current_stream": lambda: type("s", (), {"synchronize": lambda: None})}
        )

    def asarray(self, a: Any) -> Any:
        self.copies += 1
        return np.array(a)

    def asnumpy(self, a: Any) -> Any:
        self.copies += 1
        self.copied.append(a.shape)
        return np.array(a)


def test_device_kv_cache_moves_a_prefix_in_one_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``MODELC_CUDA_PREFIX=host`` the prefix cache's insert reads a GPU cache with one
    copy to the host
    (:meth:`CudaKVCache.read_blocks`: ordered block by block on the device, not two copies
    a layer), from its first new block on (a
    sequence that grew: the new blocks only), and a hit fills one with one copy to the
    device (:meth:`CudaKVCache.fill`); the blocks it stores and the cache it fills hold
    what the host :class:`KVCache` given the same rows holds (CuPy's calls on numpy)."""
    from modelc.engine.prefix_cache import PrefixCache
    from modelc.runtime.backends.cuda_kv import CudaKVCache
    from modelc.runtime.kv_cache import KVCache, KVShape

    monkeypatch.setenv("MODELC_CUDA_PREFIX", "host")
    shape, rng = KVShape(3, 2, 32), np.random.default_rng(3)
    tokens = rng.integers(0, 1000, 72).tolist()
    cp = NumpyAsCupy()
    host, dev = KVCache(shape, 256, "f16"), CudaKVCache(cp, shape, 256, "f16")
    assert not dev.device_blocks
    stores = [PrefixCache(shape, 1 << 24, block_tokens=16) for _ in (host, dev)]
    for n0, n in ((0, 40), (40, 32)):  # a prompt of 40, then 32 generated tokens
        write_alike((host, dev), n0, n, rng)
        for c, pc in zip((host, dev), stores, strict=True):
            c.advance(n)
            before = cp.copies
            assert pc.insert(tokens[: n0 + n], c) == 2  # 32 of 40 tokens, then 64 of 72
            if c is dev:  # one copy, of the new blocks' positions only
                assert cp.copies - before == 1 and cp.copied[-1] == (2, 2, 3, 16, 2, 32), cp.copied
    for pc in stores:
        blocks = pc.match(tokens)
        assert len(blocks) == 4
        for c in (KVCache(shape, 256, "f16"), CudaKVCache(cp, shape, 256, "f16")):
            before = cp.copies
            assert pc.load(blocks, c) == 64
            if isinstance(c, CudaKVCache):
                assert cp.copies - before == 1
            for layer in range(3):
                for a, b in zip(c.read(layer, 64), host.read(layer, 64), strict=True):
                    np.testing.assert_array_equal(a, b[:64])
        pc.release(blocks)


def test_device_resident_prefix_blocks_never_touch_the_host() -> None:
    """A GPU cache's blocks stay where they were read out (the default,
    ``MODELC_CUDA_PREFIX=device``): no copy to the host at an insert, none at a hit
    (:meth:`CudaKVCache.fill_blocks`), and what a hit loads equals the host cache's rows; the same blocks load into a host
    cache through the host (CuPy's calls on numpy)."""
    from modelc.engine.prefix_cache import PrefixCache
    from modelc.runtime.backends.cuda_kv import CudaKVCache
    from modelc.runtime.kv_cache import KVCache, KVShape

    shape, rng = KVShape(3, 2, 32), np.random.default_rng(4)
    tokens = rng.integers(0, 1000, 72).tolist()
    cp = NumpyAsCupy()
    host, dev = KVCache(shape, 256, "f16"), CudaKVCache(cp, shape, 256, "f16")
    assert dev.device_blocks  # the default
    write_alike((host, dev), 0, 72, rng)
    for c in (host, dev):
        c.advance(72)
    pc = PrefixCache(shape, 1 << 24, block_tokens=16)
    before = cp.copies
    assert pc.insert(tokens, dev) == 4
    assert cp.copies == before and all(b.on_device for b in pc.blocks.values())
    blocks = pc.match(tokens)
    for c in (CudaKVCache(cp, shape, 256, "f16"), KVCache(shape, 256, "f16")):
        before = cp.copies
        assert pc.load(blocks, c) == 64
        assert cp.copies == before  # the device cache: on the device; the host one: no GPU
        for layer in range(3):
            for a, b in zip(c.read(layer, 64), host.read(layer, 64), strict=True):
                np.testing.assert_array_equal(a, b[:64])
    pc.release(blocks)


def test_kernel_arguments_pack_as_the_kernel_reads_them() -> None:
    """:func:`cuda_launch.pack`: a device array as its pointer, each numpy scalar as its own
    bytes, one 8-byte slot each (what ``cuLaunchKernel`` reads through the slot's address);
    a Python number or a type it does not know goes to CuPy's launch (None)."""
    from types import SimpleNamespace

    from modelc.runtime.backends.cuda_launch import dims, pack

    class Dev:  # a device array's stand-in: its data pointer
        def __init__(self, ptr: int) -> None:
            self.data = SimpleNamespace(ptr=ptr)

    args = [Dev(0x7F00_1234_5678), np.int32(-3), np.float32(1.5), np.uint64(7), np.int64(-9)]
    blob = pack([*args, np.float64(2.5), np.uint32(5)], Dev)
    assert blob is not None and len(blob) == 7 * 8
    assert blob[:8] == np.uint64(0x7F00_1234_5678).tobytes()
    for i, a in enumerate([np.int32(-3), np.float32(1.5), np.uint64(7), np.int64(-9)], 1):
        assert blob[8 * i : 8 * i + a.nbytes] == a.tobytes()
    assert blob[48:52] == np.uint32(5).tobytes() and blob[12:16] == bytes(4)
    assert pack([Dev(1), 3], Dev) is None and pack([np.bool_(True)], Dev) is None
    assert dims(5) == (5, 1, 1) and dims((2, 3)) == (2, 3, 1) and dims(np.int64(4)) == (4, 1, 1)


FAKE_DRIVER = r"""
#include <string.h>
static unsigned long long seen[16];
static unsigned char args[64];
static int rc = 0, nargs = 0;  /* the driver knows a kernel's parameters; here, the test */
void set_rc(int r) { rc = r; }
void set_nargs(int n) { nargs = n; }
unsigned long long* calls(void) { return seen; }
unsigned char* arg_bytes(void) { return args; }
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shmem, void* stream, void** params, void** extra) {
  seen[0] = (unsigned long long)f; seen[1] = gx; seen[2] = gy; seen[3] = gz;
  seen[4] = bx; seen[5] = by; seen[6] = bz; seen[7] = shmem;
  seen[8] = (unsigned long long)stream; seen[9] = (unsigned long long)extra;
  for (int i = 0; i < nargs && i < 8; i++) memcpy(args + 8 * i, params[i], 8);
  seen[10] += 1;
  return rc;
}
"""


def test_kernel_launches_reach_the_driver_as_cupys_would(tmp_path: Path) -> None:
    """:class:`cuda_launch.Kernel` through ctypes into a stand-in for libcuda (built here
    with gcc): the function, grid and block (padded to three), shared memory, the current
    stream, each argument's bytes at the address it passes; a Python number goes to
    CuPy's own launch, an uninitialised context (201) too, any other error is raised."""
    import ctypes
    import shutil
    import subprocess
    from types import SimpleNamespace

    from modelc.runtime.backends.cuda_launch import Launcher

    if shutil.which("gcc") is None:
        pytest.skip("no gcc here")
    (tmp_path / "fake.c").write_text(FAKE_DRIVER)
    so = tmp_path / "libfakecuda.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-o", str(so), str(tmp_path / "fake.c")], check=True
    )

    class Dev:  # a device array's stand-in
        def __init__(self, ptr: int) -> None:
            self.data = SimpleNamespace(ptr=ptr)

    stream = SimpleNamespace(ptr=0x5150)
    cp = SimpleNamespace(ndarray=Dev, cuda=SimpleNamespace(get_current_stream=lambda: stream))
    by_cupy: list[tuple[Any, ...]] = []

    class Fn:  # CuPy's RawKernel (RawModule.get_function's): its Function's handle, its launch
        kernel = SimpleNamespace(ptr=0xABC0)

        def __call__(self, grid: Any, block: Any, args: Any, shared_mem: int = 0) -> None:
            by_cupy.append((grid, block, args, shared_mem))

    kernel = Launcher(cp, str(so)).wrap(Fn())
    lib = ctypes.CDLL(str(so))
    lib.calls.restype = ctypes.POINTER(ctypes.c_ulonglong)
    lib.arg_bytes.restype = ctypes.POINTER(ctypes.c_ubyte * 64)
    args = (Dev(0x7F00_0000_1230), np.int32(-5), np.float32(2.5), np.uint64(9))
    lib.set_nargs(4)
    kernel((3, 2), (128,), args, shared_mem=4096)
    seen = lib.calls()
    assert [seen[i] for i in range(11)] == [0xABC0, 3, 2, 1, 128, 1, 1, 4096, 0x5150, 0, 1]
    got = bytes(lib.arg_bytes().contents)
    assert got[:8] == np.uint64(0x7F00_0000_1230).tobytes()
    assert got[8:12] == np.int32(-5).tobytes() and got[16:20] == np.float32(2.5).tobytes()
    assert got[24:32] == np.uint64(9).tobytes() and not by_cupy
    kernel(7, 32, (Dev(1), 3))  # a Python int: CuPy's launch, not the driver's
    assert seen[10] == 1 and len(by_cupy) == 1 and by_cupy[0][:2] == (7, 32)
    lib.set_nargs(1)
    lib.set_rc(201)  # CUDA_ERROR_INVALID_CONTEXT: CuPy's launch sets the thread up
    kernel((1,), (1,), (np.int32(1),))
    assert seen[10] == 2 and len(by_cupy) == 2
    lib.set_rc(700)
    with pytest.raises(RuntimeError, match="CUDA error 700"):
        kernel((1,), (1,), (np.int32(1),))


FAKE_DRIVER_EX = r"""
#include <string.h>
#include <cuda.h>
static unsigned long long seen[16];
static unsigned char args[16];
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shmem, CUstream stream, void** params,
                        void** extra) { return CUDA_ERROR_NOT_SUPPORTED; }
unsigned long long* calls(void) { return seen; }
unsigned char* arg_bytes(void) { return args; }
CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
  seen[0] = (unsigned long long)f; seen[1] = c->gridDimX; seen[2] = c->gridDimY;
  seen[3] = c->gridDimZ; seen[4] = c->blockDimX; seen[5] = c->blockDimY; seen[6] = c->blockDimZ;
  seen[7] = c->sharedMemBytes; seen[8] = (unsigned long long)c->hStream; seen[9] = c->numAttrs;
  seen[10] = c->numAttrs ? (unsigned long long)c->attrs[0].id : 99;
  seen[11] = c->numAttrs ? (unsigned long long)c->attrs[0].value.programmaticStreamSerializationAllowed : 99;
  seen[12] = (unsigned long long)extra;
  memcpy(args, params[0], 8); memcpy(args + 8, params[1], 8);
  seen[13] += 1;
  return CUDA_SUCCESS;
}
"""


def test_pdl_launches_pass_cuda_h_s_launch_config(tmp_path: Path) -> None:
    """``MODELC_CUDA_PDL``'s launches (:class:`cuda_launch.Launcher` with ``pdl``) through
    ctypes into a stand-in for libcuda compiled against CUDA's own ``cuda.h``: the
    ``CUlaunchConfig`` it reads (grid, block, shared memory, stream) and one attribute,
    programmatic stream serialization allowed, as the header lays them out."""
    import ctypes
    import shutil
    import subprocess
    from types import SimpleNamespace

    from modelc.runtime.backends.cuda_launch import Launcher

    inc = next(iter(sorted(Path("/usr/local").glob("cuda*/include/cuda.h"))), None)
    if shutil.which("gcc") is None or inc is None:
        pytest.skip("no gcc or no CUDA toolkit header here")
    (tmp_path / "fake.c").write_text(FAKE_DRIVER_EX)
    so = tmp_path / "libfakecudaex.so"
    cmd = ["gcc", "-shared", "-fPIC", "-O1", f"-I{inc.parent}", "-o", str(so)]
    subprocess.run([*cmd, str(tmp_path / "fake.c")], check=True)

    class Dev:
        def __init__(self, ptr: int) -> None:
            self.data = SimpleNamespace(ptr=ptr)

    stream = SimpleNamespace(ptr=0x5150)
    cp = SimpleNamespace(ndarray=Dev, cuda=SimpleNamespace(get_current_stream=lambda: stream))

    class Fn:
        kernel = SimpleNamespace(ptr=0xABC0)

    for gil in (True, False):
        kernel = Launcher(cp, str(so), gil=gil, pdl=True).wrap(Fn())
        kernel((3, 2), (256,), (Dev(0x7F00_0000_1230), np.int32(-5)), shared_mem=1024)
    lib = ctypes.CDLL(str(so))
    lib.calls.restype = ctypes.POINTER(ctypes.c_ulonglong)
    lib.arg_bytes.restype = ctypes.POINTER(ctypes.c_ubyte * 16)
    seen = lib.calls()
    assert [seen[i] for i in range(14)] == [0xABC0, 3, 2, 1, 256, 1, 1, 1024, 0x5150, 1, 6, 1, 0, 2]
    got = bytes(lib.arg_bytes().contents)
    assert got[:8] == np.uint64(0x7F00_0000_1230).tobytes() and got[8:12] == np.int32(-5).tobytes()


def test_pdl_is_on_from_hopper_on_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`cuda_launch.pdl`: programmatic dependent launch by default on compute
    capability 9.0 and later (``griddepcontrol`` exists there), ``MODELC_CUDA_PDL`` 0 or 1
    either way; :func:`cuda_launch.kernels` keeps CuPy's launches where libcuda cannot be
    opened (no GPU: this machine)."""
    import ctypes
    from types import SimpleNamespace

    from modelc.runtime.backends import cuda_launch

    def cp_of(cc: str) -> Any:
        dev = SimpleNamespace(compute_capability=cc)
        return SimpleNamespace(cuda=SimpleNamespace(Device=lambda: dev))

    monkeypatch.delenv("MODELC_CUDA_PDL", raising=False)
    assert [cuda_launch.pdl(cp_of(cc)) for cc in ("75", "80", "89", "90", "100")] == [
        False, False, False, True, True,
    ]  # fmt: skip
    monkeypatch.setenv("MODELC_CUDA_PDL", "0")
    assert not cuda_launch.pdl(cp_of("90"))
    monkeypatch.setenv("MODELC_CUDA_PDL", "1")
    assert cuda_launch.pdl(cp_of("80"))
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:  # no driver: the kernels keep CuPy's launches
        fns = {"k": object()}
        assert cuda_launch.kernels(cp_of("90"), fns) is fns
