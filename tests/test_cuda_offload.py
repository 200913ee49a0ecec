"""Partial offload (``--n-gpu-layers``): the first layers on the GPU, the rest on the CPU
kernels, against the whole model on the CPU backend in exact mode (the reference).

Without a GPU only the planner (pure: given sizes) and the one-line refusals run; the
split's logic is held to the CPU in CI by ``tests/test_split.py`` with the numpy backend in
the GPU's place.  Where CuPy sees a GPU (``scripts/cuda_tests.sh``): the tiny random
families split half and half (top-10 log-probs within 2e-3 and greedy equal, as the whole
model on the GPU is held; the output head on the GPU part, and with
``MODELC_OFFLOAD_HEAD=last`` on the CPU's), the engine on a split SmolLM2 (batching, prefix cache, context
shift), and with ``MODELC_CUDA_8B`` (``python -m tests.gen_cuda_models DIR 8b``) the
8B-shaped Q4_0 half offloaded: greedy equal to the CPU's and faster than all-CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from modelc.formats import load_model
from modelc.runtime.backends.cuda import cuda_unavailable
from modelc.runtime.split import SplitLM
from tests.runtime_support import first_divergence, make_backend

WHY = cuda_unavailable()
gpu = pytest.mark.skipif(WHY is not None, reason=f"no CUDA here: {WHY}")


def test_auto_gpu_layers_fit_free_memory() -> None:
    """``--n-gpu-layers auto``: the first layers whose weights and KV fit beside the
    embedding, the output head (the GPU part's with any layer there) and the scratch; with
    ``MODELC_OFFLOAD_HEAD=last`` the head only with every layer."""
    from modelc.runtime.backends.cuda_offload import SCRATCH, plan_gpu_layers

    gib = 1 << 30
    layers = [gib] * 8  # an 8 GiB model of 8 layers, 0.25 GiB of KV each, 1 GiB embedding
    room = gib + SCRATCH
    for first in (True, False):
        assert plan_gpu_layers(layers, gib // 4, gib, gib, room + 11 * gib, first) == 8
        assert plan_gpu_layers(layers, gib // 4, gib, gib, room + 11 * gib - 1, first) == 7
        assert plan_gpu_layers(layers, gib // 4, gib, 0, room + 10 * gib, first) == 8  # tied
        assert plan_gpu_layers(layers, gib // 4, gib, 0, room + 5 * gib, first) == 4
        assert plan_gpu_layers(layers, gib // 4, gib, gib, room + gib, first) == 0
        assert plan_gpu_layers(layers, 0, gib, gib, gib // 2, first) == 0  # not the embedding
    # the head on the GPU part takes its bytes from the layers at any split
    assert plan_gpu_layers(layers, gib // 4, gib, gib, room + 5 * gib) == 3
    assert plan_gpu_layers(layers, gib // 4, gib, gib, room + 5 * gib, False) == 4
    assert plan_gpu_layers(layers, gib // 4, gib, gib, room + 2 * gib) == 0
    assert plan_gpu_layers(layers, gib // 4, gib, gib, room + 2 * gib, False) == 1


@pytest.mark.skipif(WHY is None, reason="CUDA is usable here")
def test_gpu_layers_without_a_gpu() -> None:
    """Layers asked of a GPU there is not: one line; ``auto`` runs every layer on the CPU."""
    from modelc.engine import EngineOptions, build_engine
    from modelc.errors import UsageError
    from modelc.runtime.arch.decoder import Decoder
    from tests.gen_families import ensure_family

    ir = load_model(ensure_family("qwen3")[1])
    for ngl in (2, "all"):
        with pytest.raises(UsageError, match=f"--n-gpu-layers {ngl}: .*auto or 0") as e:
            build_engine(ir, EngineOptions(n_gpu_layers=ngl))
        assert "\n" not in str(e.value)
    assert isinstance(build_engine(ir, EngineOptions(n_gpu_layers="auto")).lm, Decoder)


def test_gpu_layers_with_device_cpu_is_one_line() -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "modelc.cli",
            "run",
            "--device",
            "cpu",
            "-ngl",
            "8",
            "--port",
            "0",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    err = p.stderr.strip()
    assert p.returncode != 0 and len(err.splitlines()) == 1, err
    assert "--n-gpu-layers 8 needs --device cuda" in err, err


def offload(ir: Any, n_gpu: int | str, cpu: str = "cpu-exact", **kw: Any) -> Any:
    """``ir`` as ``--device cuda --n-gpu-layers n_gpu`` loads it, the GPU in exact mode."""
    from modelc.runtime.backends.cuda_offload import build_offload

    opts: dict[str, Any] = dict(kv_mode="f32", max_context=None, max_concurrent=4)
    lm = build_offload(ir, n_gpu, lambda: make_backend(cpu), kv_budget_bytes=None, **opts | kw)
    gpu_part = lm.parts[0] if isinstance(lm, SplitLM) else lm
    if gpu_part is not None:
        gpu_part.dev.exact = True
    return lm


@gpu
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "gemma2", "gemma3", "phi3", "mixtral"])
def test_families_split_half_match_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    """Each tiny family at CUDA's head sizes, its first layers and the output head on the
    GPU: batches of prefill chunks and decodes give the CPU's logits on every row, greedy
    tokens equal, also where some sequences want no logits (the head then runs on the rows
    the CPU part hands back); with ``MODELC_OFFLOAD_HEAD=last`` the head on the CPU."""
    from tests import gen_families as gf
    from tests.test_cuda import FAMILY_SHAPES, check_batches, cpu_exact
    from tests.test_split import head_steps

    monkeypatch.setitem(gf.CONFIGS, family, {**gf.CONFIGS[family], **FAMILY_SHAPES[family]})
    path = tmp_path / f"{family}.gguf"
    gf.write_gguf(family, gf.make_weights(family), path)
    ir = load_model(path)
    n = ir.hparams.n_layer
    for k in sorted({1, n // 2}):
        lm = offload(ir, k)
        assert isinstance(lm, SplitLM) and lm.n_layers == (k, n - k)
        assert lm.head is lm.parts[0] and lm.parts[0].output is not None  # the head on the GPU
        check_batches(cpu_exact(ir), lm, gf.BASE["vocab_size"])
        prompts = [np.random.default_rng(k).integers(3, 300, m).tolist() for m in (9, 7, 5)]
        want, want_tokens = head_steps(cpu_exact(ir), prompts, 4)
        got, tokens = head_steps(lm, prompts, 4)
        for a, b in zip(got, want, strict=True):  # as check_batches' rows
            assert a.shape == b.shape
            assert np.abs(a - b).max(initial=0) < 1e-3 * max(1.0, np.abs(b).max(initial=0))
        assert tokens == want_tokens
    monkeypatch.setenv("MODELC_OFFLOAD_HEAD", "last")
    lm = offload(ir, n // 2)
    assert isinstance(lm, SplitLM) and lm.head is lm.parts[-1] and lm.parts[0].output is None
    check_batches(cpu_exact(ir), lm, gf.BASE["vocab_size"])
    monkeypatch.delenv("MODELC_OFFLOAD_HEAD")
    assert offload(ir, 0) is None  # no layer on the GPU: the CPU runs it all
    assert not isinstance(offload(ir, "all"), SplitLM)


@gpu
def test_engine_on_a_split_smollm2() -> None:
    """The engine on --device cuda -ngl 15 (of 30): requests batched together give the plain
    loop's tokens over the whole model on the CPU; a repeated prompt loads its prefix from
    the cache into both parts; a context shift runs to max_tokens."""
    from modelc.engine import EngineOptions, build_engine
    from modelc.engine.api import FinishEvent, FinishReason, GenerationRequest, TokenEvent
    from modelc.runtime.arch import build
    from modelc.runtime.sampling import SamplingParams
    from tests.runtime_support import decode_alone
    from tests.test_cuda import smollm2_path

    os.environ["MODELC_MATMUL"] = "exact"
    ir = load_model(smollm2_path())
    cpu = build(ir, make_backend("cpu-exact"))
    opts = dict(device="cuda", n_gpu_layers=15, kv_cache="f32", speculative=False)
    eng = build_engine(ir, EngineOptions(**opts))  # type: ignore[arg-type]
    assert isinstance(eng.lm, SplitLM) and eng.lm.n_layers == (15, 15) and eng.tok is not None
    p = SamplingParams(temperature=0.0, max_tokens=16)
    base = "You are a careful assistant. Answer briefly. " * 8
    prompts = [eng.tok.encode(base + t) for t in ("Paris is", "def fib(n):", "Once", "1, 2,")]
    want = [decode_alone(cpu, cpu.new_cache("f32"), q, p) for q in prompts]

    async def serve(e: Any, qs: list[list[int]], sp: SamplingParams) -> list[Any]:
        got: dict[int, Any] = {}
        async with trio.open_nursery() as n:
            await n.start(e.run)

            async def one(i: int) -> None:
                toks, fin = [], None
                req = GenerationRequest(f"r{i}", qs[i], sp, ignore_eos=True)
                async for ev in e.submit(req):
                    if isinstance(ev, TokenEvent):
                        toks.append(ev.token_id)
                    elif isinstance(ev, FinishEvent):
                        fin = ev
                got[i] = (toks, fin)

            await one(0)
            async with trio.open_nursery() as m:
                for i in range(1, len(qs)):
                    m.start_soon(one, i)
            n.cancel_scope.cancel()
        return [got[i] for i in range(len(qs))]

    got = trio.run(serve, eng, prompts, p)
    assert [t for t, _ in got] == want
    assert all(f.cached_tokens > 0 for _, f in got[1:])
    shifting = build_engine(ir, EngineOptions(**opts, max_context=64, context_shift=True))  # type: ignore[arg-type]
    long = trio.run(serve, shifting, [list(range(100, 150))], SamplingParams(max_tokens=40))
    assert len(long[0][0]) == 40 and long[0][1].reason is FinishReason.LENGTH


@gpu
def test_8b_half_offloaded_matches_cpu_and_is_faster() -> None:
    """The issue's must-show 4 at the model level: an 8B-shaped Q4_0 with 16 of its 32
    layers on the GPU.  Exact mode: top-10 log-probs within 2e-3 of the CPU's and 16 greedy
    tokens equal; default mode: batch-1 decode faster than all on the CPU."""
    path = Path(os.environ.get("MODELC_CUDA_8B", "/nonexistent"))
    if not path.exists():
        pytest.skip("no 8B model: set MODELC_CUDA_8B (python -m tests.gen_cuda_models DIR 8b)")
    from bench.cuda_bench import greedy_rate
    from modelc.runtime.arch import build
    from tests.test_cuda import compare, cpu_exact

    ir = load_model(path)
    half = ir.hparams.n_layer // 2
    split = offload(ir, half, max_concurrent=1, max_context=512)
    err = compare(
        cpu_exact(ir), split, np.random.default_rng(5).integers(0, 32000, 40).tolist(), 16
    )
    print(f"8B -ngl {half}: top-10 log-prob error vs CPU {err:.2e}")
    del split
    prompt = np.random.default_rng(6).integers(0, 32000, 32).tolist()
    fast = offload(ir, half, cpu="cpu", max_concurrent=1, max_context=512)
    fast.parts[0].dev.exact = False
    toks_split, split_rate = greedy_rate(fast, prompt, 32)
    toks_cpu, cpu_rate = greedy_rate(build(ir, make_backend("cpu")), prompt, 32)
    same = first_divergence(toks_split, toks_cpu)  # default mode: int8 activations on the CPU
    print(
        f"8B decode: -ngl {half} {split_rate:.1f} tok/s, all-CPU {cpu_rate:.1f} tok/s; {same} equal"
    )
    assert split_rate > cpu_rate
