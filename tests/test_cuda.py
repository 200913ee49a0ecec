"""The CUDA backend against the CPU backend (the reference): ops, models, the engine.

Runs where CuPy sees a GPU (``scripts/cuda_tests.sh`` on the lent H200); elsewhere every
GPU test skips and only the checks that need no GPU run (the memory check's message, the
one-line ``--device cuda`` error).  Model files: SmolLM2-135M Q4_1 from the test assets
(or ``MODELC_CUDA_SMOLLM2``), the random ~1B llama GGUFs (Q4_0, Q8_0) from
``MODELC_CUDA_1B_DIR`` (``python -m tests.gen_cuda_models DIR``); small random models of
every supported block type, and the tiny random families of ``tests/gen_families`` (qwen2,
mistral, qwen3, phi3, gemma2, gemma3; f32, randomised norms), are made here.

Tolerances: ops within 1e-5 relative (f32 on both sides, sums in another order); models:
top-10 next-token log-probabilities within 2e-3 of the CPU backend's ``exact`` mode and
identical greedy continuations (the issue's bar).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from modelc.errors import CapacityError
from modelc.formats import load_model
from modelc.formats.ir import DType, ModelIR
from modelc.runtime.backends.cuda import cuda_unavailable
from modelc.runtime.backends.cuda_step import check_fits
from modelc.runtime.model import SeqChunk
from tests.gen_cuda_models import SMALL, as_the_gpu_reads, random_blocks, write_random_llama
from tests.runtime_support import LOGPROB_TOL, golden, log_softmax, make_backend, write_alike

WHY = cuda_unavailable()
gpu = pytest.mark.skipif(WHY is not None, reason=f"no CUDA here: {WHY}")
TYPES = [
    *(DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.Q8_0),
    *(DType.Q2_K, DType.Q3_K, DType.Q4_K, DType.Q5_K, DType.Q6_K),
    *(DType.IQ4_NL, DType.IQ4_XS, DType.MXFP4, DType.BF16, DType.F16, DType.F32),
]


def rel(a: Any, b: Any) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


# -- no GPU needed ------------------------------------------------------------------------
def test_memory_check_names_what_fits() -> None:
    gib = 1 << 30
    check_fits(4 * gib, gib, 8, 20 * gib, "llama model")  # 12 GiB of 20: fits
    with pytest.raises(CapacityError, match=r"at most 5 sequence\(s\)"):
        check_fits(4 * gib, 2 * gib, 8, 15 * gib, "llama model")
    with pytest.raises(CapacityError, match="weights alone do not fit"):
        check_fits(30 * gib, gib, 1, 20 * gib, "llama model")


@pytest.mark.skipif(WHY is None, reason="CUDA is usable here")
def test_device_cuda_without_cuda_is_one_line() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "modelc.cli", "run", "--device", "cuda", "--port", "0", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0
    err = p.stderr.strip()
    assert len(err.splitlines()) == 1 and "--device cuda" in err and "--device cpu" in err, err


def test_cuda_refuses_a_quantized_kv_cache_before_loading(tmp_path: Path) -> None:
    from modelc.errors import UsageError
    from modelc.runtime.backends.cuda_offload import build_cuda

    ir = load_model(write_random_llama(tmp_path / "m.gguf", DType.Q8_0, SMALL))
    with pytest.raises(UsageError, match="--kv-cache int8 is not supported with --device cuda"):
        build_cuda(ir, kv_mode="int8", max_context=None, max_concurrent=1, kv_budget_bytes=None)


def same_kv(host: Any, dev: Any) -> None:
    assert host.n == dev.n
    for layer in range(host.shape.n_layer):
        for a, b in zip(host.read(layer, host.n), dev.read(layer, dev.n), strict=True):
            np.testing.assert_array_equal(a, b)


@gpu
def test_device_kv_cache_behaves_as_the_host_cache() -> None:
    """Growth (old rows kept), host writes and reads (the prefix cache), a context shift,
    re-rotated keys, truncation and freeing, against the host KVCache of the same mode."""
    import cupy as cp

    from modelc.runtime.backends.cuda_kv import CudaKVCache
    from modelc.runtime.kv_cache import KVBudget, KVCache, KVShape

    shape, rng = KVShape(2, 2, 64), np.random.default_rng(8)
    for mode in ("f16", "f32"):
        bh, bd = KVBudget(1 << 30), KVBudget(1 << 30)
        host, dev = (
            KVCache(shape, 1024, mode, budget=bh),
            CudaKVCache(cp, shape, 1024, mode, budget=bd),
        )
        for n0, n in ((0, 100), (100, 300)):  # the second write grows 256 -> 512 slots
            write_alike((host, dev), n0, n, rng)
            for c in (host, dev):
                c.advance(n)
        assert dev.capacity == host.capacity == 512 and bd.used == bh.used == dev.nbytes

        same_kv(host, dev)
        whole = list(dev.read_all(dev.n))  # the prefix cache's read: one copy
        for layer, (k, v) in enumerate(whole):
            np.testing.assert_array_equal(k, host.read(layer, host.n)[0])
            np.testing.assert_array_equal(v, host.read(layer, host.n)[1])
        # the prefix cache's blocks, ordered on the device (one copy), as the host's
        # (MODELC_CUDA_PREFIX=host: copied to the host)
        dev.device_blocks = False
        np.testing.assert_array_equal(dev.read_blocks(384, 64, 32), host.read_blocks(384, 64, 32))
        # kept in GPU memory (the default), on the model's stream: the same blocks, and a
        # cache filled from them on the device holds what the host's holds
        side = cp.cuda.Stream(non_blocking=True)
        on_dev = CudaKVCache(cp, shape, 1024, mode, budget=KVBudget(1 << 30), stream=side)
        assert on_dev.device_blocks
        on_dev.fill(dev.n, lambda layer, first, w=whole: w[layer])
        kept = on_dev.read_blocks(384, 0, 32)
        assert isinstance(kept, cp.ndarray)
        np.testing.assert_array_equal(kept.get(), host.read_blocks(384, 0, 32))
        filled = CudaKVCache(cp, shape, 1024, mode, budget=KVBudget(1 << 30), stream=side)
        filled.fill_blocks(384, [(kept[i, 0], kept[i, 1]) for i in range(12)])
        side.synchronize()
        for layer in range(shape.n_layer):
            for a, b in zip(filled.read(layer, 384), host.read(layer, 384), strict=True):
                np.testing.assert_array_equal(a, b[:384])
        on_dev.free()
        filled.free()
        again = CudaKVCache(cp, shape, 1024, mode, budget=KVBudget(1 << 30))
        again.fill(dev.n, lambda layer, first, w=whole: w[layer])  # a prefix-cache hit
        same_kv(host, again)
        again.free()
        for c in (host, dev):
            c.shift(4, 10)
        same_kv(host, dev)

        def double(x: Any) -> None:
            x *= 2

        for c in (host, dev):
            c.update_keys(50, double)
            c.truncate(200)
        same_kv(host, dev)
        dev.free()
        assert bd.used == 0 and dev.nbytes == 0


# -- ops ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cuda_be() -> Any:
    from modelc.runtime.backends.cuda_backend import CudaBackend

    be = CudaBackend()
    be.dev.exact = True
    return be


@gpu
@pytest.mark.parametrize("dtype", TYPES, ids=lambda d: d.name)
def test_matmul_and_rows_match_the_reference(cuda_be: Any, dtype: DType) -> None:
    from modelc.runtime.backend import Weight
    from modelc.runtime.backends.numpy_ref import dequantize_weight

    rng = np.random.default_rng(1)
    dev = cuda_be.dev
    blas = dev.blas
    # both GEMV kernels (1..16 rows a pass; 40 rows as 3 passes with gemv_max 64; gemv4 with
    # and without warps splitting a row: 2 warps a row at 512 wide, 8 at 2048), and the
    # dequantize + cuBLAS path (40 rows) through gemmEx and through cupy.matmul
    configs = [
        ("gemv", 64, True, blas),
        ("gemv4", 64, True, blas),
        ("gemv4", 64, False, blas),
        ("gemv4", 16, True, blas),
        ("gemv4", 16, True, None),
    ]
    try:
        for rows, cols in ((96, 512), (40, 2048)):
            data, _ = random_blocks(rng, dtype, rows, cols, 0.05)
            w = Weight(dtype, (rows, cols), data)
            dense = dequantize_weight(w).astype(np.float64)
            for kind, gmax, split, bl in configs:
                dev.gemv_kind, dev.gemv_max, dev.split_k, dev.blas = kind, gmax, split, bl
                for n in (1, 3, 16, 40):
                    x = rng.standard_normal((n, cols)).astype(np.float32)
                    got = cuda_be.matmul(w, x)
                    assert rel(got, x @ dense.T) < 1e-5, (dtype, rows, n, kind, gmax, split, bl)
            ids = np.array([5, 0, rows - 1, 5])
            want = as_the_gpu_reads(w)[ids]  # MXFP4's subnormal scales flushed (-ftz=true)
            np.testing.assert_allclose(cuda_be.get_rows(w, ids), want, rtol=1e-6, atol=0)
    finally:
        dev.read_env()  # the kernels the environment asks for (not this test's last),
        dev.exact = True  # in the fixture's exact mode (read_env reads MODELC_MATMUL too)
        dev.blas = blas


@gpu
def test_norm_silu_attention_match_the_reference(cuda_be: Any) -> None:
    from modelc.runtime.backends.numpy_ref import NumpyBackend

    ref, rng = NumpyBackend(), np.random.default_rng(2)
    x = rng.standard_normal((7, 576)).astype(np.float32)
    wn = rng.uniform(0.5, 1.5, 576).astype(np.float32)
    assert rel(cuda_be.rms_norm(x, wn, 1e-5), ref.rms_norm(x, wn, 1e-5)) < 1e-6
    g, u = rng.standard_normal((2, 5, 300)).astype(np.float32) * 4
    assert rel(cuda_be.silu_mul(g, u), ref.silu_mul(g, u)) < 1e-6
    for hd, kv_dtype in ((64, np.float32), (64, np.float16), (128, np.float16)):
        q = rng.standard_normal((6, 8, hd)).astype(np.float32)
        k = rng.standard_normal((40, 2, hd)).astype(kv_dtype)
        v = rng.standard_normal((40, 2, hd)).astype(kv_dtype)
        s = 1 / np.sqrt(hd)
        got = cuda_be.attention(q, k, v, 34, s)  # queries at 34..39 over 0..p
        assert rel(got, ref.attention(q, k, v, 34, s)) < 1e-5, (hd, kv_dtype)
        for window, cap in ((5, 0.0), (1, 0.0), (0, 2.0), (7, 50.0)):  # sliding window, gemma2
            got = cuda_be.attention(q, k, v, 34, s, window=window, softcap=cap)
            want = ref.attention(q, k, v, 34, s, window=window, softcap=cap)
            assert rel(got, want) < 1e-5, (hd, kv_dtype, window, cap)
            assert rel(want, ref.attention(q, k, v, 34, s)) > 1e-3  # the case is not moot
        sinks = rng.standard_normal(8).astype(np.float32) * 3  # gpt-oss: a logit a head
        for window in (0, 4):
            got = cuda_be.attention(q, k, v, 34, s, window=window, sinks=sinks)
            want = ref.attention(q, k, v, 34, s, window=window, sinks=sinks)
            assert rel(got, want) < 1e-5, (hd, kv_dtype, window, "sinks")
            assert rel(want, ref.attention(q, k, v, 34, s, window=window)) > 1e-3


# -- models -------------------------------------------------------------------------------
def cpu_exact(ir: ModelIR) -> Any:
    from modelc.runtime.arch import build

    return build(ir, make_backend("cpu-exact"))


def on_gpu(ir: ModelIR) -> Any:
    from modelc.runtime.backends.cuda_backend import CudaBackend
    from modelc.runtime.backends.cuda_llama import CudaLlama

    be = CudaBackend()
    be.dev.exact = True
    return CudaLlama(ir, be)


def greedy_run(model: Any, prompt: list[int], n: int, mode: str) -> tuple[Any, list[int]]:
    """Log-probs after the prompt (whole-prompt prefill) and ``n`` greedy tokens."""
    cache = model.new_cache(mode)
    lp = log_softmax(model.forward([SeqChunk(cache, prompt)])[0])
    out = [int(np.argmax(lp))]
    while len(out) < n:
        out.append(int(np.argmax(model.forward([SeqChunk(cache, [out[-1]])])[0])))
    cache.free()
    return lp, out


def compare(ref: Any, dev: Any, prompt: list[int], n: int, mode: str = "f32") -> float:
    lp_ref, gen_ref = greedy_run(ref, prompt, n, mode)
    lp_dev, gen_dev = greedy_run(dev, prompt, n, mode)
    top = np.argsort(lp_ref)[-10:]
    err = float(np.max(np.abs(lp_dev[top] - lp_ref[top])))
    assert err <= LOGPROB_TOL, f"top-10 log-prob error {err:.2e}"
    assert gen_dev == gen_ref, f"greedy continuations differ: {gen_dev} vs {gen_ref}"
    return err


def check_batches(ref: Any, dev: Any, n_vocab: int) -> None:
    """A batch of 3 sequences (prefill chunks and decodes mixed) gives the CPU backend's
    logits on every row; prompt log-probs and greedy tokens agree."""
    rng = np.random.default_rng(4)
    seqs = [rng.integers(0, n_vocab, n).tolist() for n in (9, 1, 30)]
    caches = [(ref.new_cache("f32"), dev.new_cache("f32")) for _ in seqs]
    for part in ((0, 4), (4, 5), (5, 30)):
        batch_r, batch_d = [], []
        for s, (cr, cd) in zip(seqs, caches, strict=True):
            toks = s[part[0] : part[1]]
            if toks:
                rows = tuple(range(len(toks)))
                batch_r.append(SeqChunk(cr, toks, rows))
                batch_d.append(SeqChunk(cd, toks, rows))
        a, b = ref.forward(batch_r), dev.forward(batch_d)
        assert a.shape == b.shape and np.abs(a - b).max() < 1e-3 * max(1.0, np.abs(a).max())
    compare(ref, dev, seqs[2], 12)


@gpu
@pytest.mark.parametrize("dtype", TYPES, ids=lambda d: d.name)
def test_small_random_models_every_type(tmp_path: Path, dtype: DType) -> None:
    """A 2-layer model of every weight type against the CPU backend (:func:`check_batches`)."""
    ir = load_model(write_random_llama(tmp_path / "m.gguf", dtype, SMALL, seed=3))
    check_batches(cpu_exact(ir), on_gpu(ir), SMALL.n_vocab)


# each family's tiny model (tests/gen_families), at head sizes CUDA attention takes (32 up)
PHI3_16 = [1.0 + 0.75 * i for i in range(16)]  # a LongRoPE divisor per pair of head 32
FAMILY_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2": {"num_attention_heads": 2, "num_key_value_heads": 1},  # QKV biases
    "mistral": {"num_attention_heads": 2, "num_key_value_heads": 1},  # window 8, every layer
    "qwen3": {},  # per-head Q/K norms
    "gemma2": {"head_dim": 32, "query_pre_attn_scalar": 32},  # soft caps, window 4 on 0 and 2
    "gemma3": {},  # Q/K norms, 5 windowed layers of 6 with their own RoPE base
    "phi3": {  # fused QKV and gate-up; LongRoPE's short factors (long = short)
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "rope_scaling": {"type": "longrope", "short_factor": PHI3_16, "long_factor": PHI3_16},
    },
    "qwen3moe": {},  # 4 experts, 2 a token, Q/K norms
    "mixtral": {},  # a llama GGUF with stacked experts
}


def fused_on_gpu(path: Path) -> tuple[ModelIR, Any]:
    """The GGUF at ``path`` through ``build_cuda`` as ``--device cuda`` loads it, asserted
    device-resident (not op by op), in exact mode: (its IR, the model)."""
    from modelc.runtime.backends.cuda_llama import CudaLlama
    from modelc.runtime.backends.cuda_offload import build_cuda

    ir = load_model(path)
    dev = build_cuda(ir, kv_mode="f32", max_context=None, max_concurrent=4, kv_budget_bytes=None)
    assert isinstance(dev, CudaLlama)
    dev.dev.exact = True
    return ir, dev


@gpu
@pytest.mark.parametrize("family", list(FAMILY_SHAPES))
def test_families_match_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str) -> None:
    """The tiny random families (f32, randomised norms) through ``build_cuda``, as
    ``--device cuda`` loads them, against the CPU backend: prompts of 30 tokens cross every
    sliding window (:func:`check_batches`)."""
    from tests import gen_families as gf

    cfg = {**gf.CONFIGS[family], **FAMILY_SHAPES[family]}
    monkeypatch.setitem(gf.CONFIGS, family, cfg)
    path = tmp_path / f"{family}.gguf"
    gf.write_gguf(family, gf.make_weights(family), path)
    ir, dev = fused_on_gpu(path)
    check_batches(cpu_exact(ir), dev, gf.BASE["vocab_size"])


@gpu
def test_gptoss_fused_matches_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny gpt-oss (tests/gen_gptoss: sinks, the attention output's bias, alternating
    windows of 4, YaRN, MXFP4 experts with biases and the clamped SwiGLU) at head size 32
    through ``build_cuda`` (the device-resident forward, not op by op) against the CPU
    backend (:func:`check_batches`)."""
    from tests import gen_gptoss as go

    monkeypatch.setattr(go, "CONFIG", {**go.CONFIG, "head_dim": 32})
    path = tmp_path / "gptoss.gguf"
    go.write_gguf("mxfp4", go.make_weights("mxfp4"), path)
    ir, dev = fused_on_gpu(path)
    check_batches(cpu_exact(ir), dev, go.N_VOCAB)


@gpu
def test_smollm3_nope_layers_match_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny SmolLM3 (tests/gen_smollm3: its fourth layer without RoPE) at head size 32
    device-resident, its NoPE layer rotated by zero frequencies, against the CPU backend
    (:func:`check_batches`)."""
    from tests import gen_smollm3 as sm

    monkeypatch.setattr(sm, "CONFIG", {**sm.CONFIG, "hidden_size": 128})  # 4 heads of 32
    path = tmp_path / "smollm3.gguf"
    sm.write_gguf(sm.weights(), path)
    ir, dev = fused_on_gpu(path)
    assert [bool(f.any()) for f in dev.inv_freq_host] == [True, True, True, False]  # 4: NoPE
    check_batches(cpu_exact(ir), dev, sm.CONFIG["vocab_size"])


@gpu
def test_olmo2_post_norms_and_whole_qk_norms_match_cpu(tmp_path: Path) -> None:
    """The tiny OLMo 2 (tests/gen_olmo2: norms after attention and the FFN only, Q/K norms
    over the whole projection) and OLMo 3 (tests/gen_olmo3: and windowed layers with their
    own RoPE base, YaRN on the full ones) at head size 32 device-resident against the CPU."""
    from tests import gen_olmo2 as ol
    from tests import gen_olmo3 as o3

    # OLMo 3: windowed layers with their own RoPE base, YaRN on the full layers only
    for name, base in (("olmo2", ol.CONFIG), ("olmo3", o3.CONFIG)):
        cfg = {**base, "hidden_size": 128}  # 4 heads of 32
        path = tmp_path / f"{name}.gguf"
        ol.write_gguf(ol.olmo_weights(cfg, ol.SEED), path, "olmo2", cfg=cfg)
        ir, dev = fused_on_gpu(path)
        assert dev.qk_whole
        assert (len(set(dev.rope_ms)) > 1) == (name == "olmo3")  # the full layers' factor
        check_batches(cpu_exact(ir), dev, cfg["vocab_size"])


@gpu
def test_mistral3_attention_temperature_matches_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny Mistral 3 (tests/gen_mistral3: queries scaled by position past an original
    context of 16, which the 30-token prompts cross) at head size 32 device-resident against
    the CPU backend."""
    from tests import gen_mistral3 as mi

    monkeypatch.setattr(mi, "CONFIG", {**mi.CONFIG, "head_dim": 32})
    path = tmp_path / "mistral3.gguf"
    mi.write_gguf(mi.weights(), path)
    ir, dev = fused_on_gpu(path)
    assert all(dev.temp_layers)
    check_batches(cpu_exact(ir), dev, mi.CONFIG["vocab_size"])


@gpu
def test_phi4mini_partial_rope_matches_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny Phi-4-mini (tests/gen_phi4mini: 24 of each 32-wide head rotate, LongRoPE's
    factor on the rotation as the CPU scales its tables) device-resident against the CPU."""
    from tests import gen_phi4mini as ph

    factors = [1.0 + 0.25 * i for i in range(12)]  # a divisor a rotated pair
    rope = {"type": "longrope", "short_factor": factors, "long_factor": factors}
    monkeypatch.setattr(ph, "CONFIG", {**ph.CONFIG, "hidden_size": 96, "rope_scaling": rope})
    path = tmp_path / "phi4mini.gguf"
    ph.write_gguf(ph.weights(), path)
    ir, dev = fused_on_gpu(path)
    assert (dev.rot, dev.hd) == (24, 32)
    assert dev.rope_ms[0] != 1.0  # LongRoPE's factor on the rotation
    check_batches(cpu_exact(ir), dev, ph.CONFIG["vocab_size"])


@gpu
def test_glm4moe_routing_and_shared_expert_match_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny GLM-4.5 (tests/gen_glm4moe: sigmoid scores with a bias for the choice, scaled
    weights, a shared expert, the first layer dense; Q/K/V biases before Q/K norms; half of
    each head rotated) at head size 32 device-resident against the CPU backend."""
    from tests import gen_glm4moe as gl

    monkeypatch.setattr(gl, "CONFIG", {**gl.CONFIG, "head_dim": 32})
    path = tmp_path / "glm4moe.gguf"
    gl.write_gguf(gl.make_weights(), path)
    ir, dev = fused_on_gpu(path)
    assert (dev.rot, dev.hd) == (16, 32)
    check_batches(cpu_exact(ir), dev, gl.CONFIG["vocab_size"])


@gpu
def test_phi3_long_factors_keep_to_the_original_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Phi-3 whose LongRoPE has long factors runs on the GPU within its original context
    (64 here, of 256), where the short factors hold and it matches the CPU backend."""
    from tests import gen_families as gf

    long = [2 * f for f in PHI3_16]
    rope = {"type": "longrope", "short_factor": PHI3_16, "long_factor": long}
    cfg = {**gf.CONFIGS["phi3"], **FAMILY_SHAPES["phi3"], "rope_scaling": rope}
    monkeypatch.setitem(gf.CONFIGS, "phi3", cfg)
    path = tmp_path / "phi3.gguf"
    gf.write_gguf("phi3", gf.make_weights("phi3"), path)
    ir, dev = fused_on_gpu(path)
    assert (ir.hparams.n_ctx, dev.n_ctx) == (256, 64)
    check_batches(cpu_exact(ir), dev, gf.BASE["vocab_size"])


@gpu
def test_big_decode_batches_replayed_as_graphs(tmp_path: Path) -> None:
    """24 sequences decoding together (the cuBLAS path): the first step eager, the second
    captured, the rest replayed; every step's logits equal the CPU backend's."""
    ir = load_model(write_random_llama(tmp_path / "m.gguf", DType.Q4_0, SMALL, seed=6))
    ref, dev = cpu_exact(ir), on_gpu(ir)
    dev.dev.gemv_max = 16  # the cuBLAS path above 16 rows (a model this small gets GEMV passes)
    rng = np.random.default_rng(7)
    seqs = [rng.integers(0, SMALL.n_vocab, 5).tolist() for _ in range(24)]
    cr = [ref.new_cache("f16") for _ in seqs]
    cd = [dev.new_cache("f16") for _ in seqs]
    a = ref.forward([SeqChunk(c, s) for c, s in zip(cr, seqs, strict=True)])
    b = dev.forward([SeqChunk(c, s) for c, s in zip(cd, seqs, strict=True)])
    for step in range(5):
        assert np.abs(a - b).max() < 1e-3 * np.abs(a).max(), step
        nxt = [int(t) for t in np.argmax(a, axis=1)]
        assert nxt == [int(t) for t in np.argmax(b, axis=1)]
        a = ref.forward([SeqChunk(c, [t]) for c, t in zip(cr, nxt, strict=True)])
        b = dev.forward([SeqChunk(c, [t]) for c, t in zip(cd, nxt, strict=True)])
    assert dev.dev.blas is not None, "cuBLAS called directly did not pass its own check"
    assert dev.graph_error is None
    assert len(dev._graphs) == 1


@gpu
def test_a_first_step_waits_for_the_models_own_loading(tmp_path: Path) -> None:
    """The model's weights upload and its buffers' zero fills queue on CuPy's default stream,
    which the model's non-blocking stream does not wait for: built behind ~50-100 ms of
    queued default-stream work, its first step (at once) must still read loaded weights and
    its own meta (a random 8B's first prompt wrote its keys to address 0 in session 30:
    its meta zeroed by the load's fill landing after the step's copy)."""
    from modelc.runtime.backends.cuda_backend import CudaBackend
    from modelc.runtime.backends.cuda_llama import CudaLlama

    ir = load_model(write_random_llama(tmp_path / "m.gguf", DType.Q4_0, SMALL, seed=11))
    be = CudaBackend()
    be.dev.exact = True
    busy = be.cp.ones(1 << 27, np.float32)  # the default stream busy ~50-100 ms
    for _ in range(200):
        busy *= 1.0001
    dev = CudaLlama(ir, be)  # its uploads and fills queue behind that
    ref = cpu_exact(ir)
    prompt = np.random.default_rng(11).integers(0, SMALL.n_vocab, 20).tolist()
    b = dev.forward([SeqChunk(dev.new_cache("f32"), prompt)])
    a = ref.forward([SeqChunk(ref.new_cache("f32"), prompt)])
    assert np.abs(a - b).max() < 1e-3 * np.abs(a).max()


@gpu
def test_a_step_that_grows_the_buffers_behind_queued_work(tmp_path: Path) -> None:
    """A step bigger than the model's buffers regrows them (``_alloc``: fresh zeroed arrays,
    the meta among them, zero-filled on the model's stream) while that stream is still
    busy: the step's meta must land after those fills."""
    ir = load_model(write_random_llama(tmp_path / "m.gguf", DType.Q4_0, SMALL, seed=9))
    ref, dev = cpu_exact(ir), on_gpu(ir)
    cp = dev.cp
    rng = np.random.default_rng(9)
    seqs = [rng.integers(0, SMALL.n_vocab, 40).tolist() for _ in range(6)]
    cr = [ref.new_cache("f16") for _ in seqs]
    cd = [dev.new_cache("f16") for _ in seqs]
    assert sum(map(len, seqs)) > dev.rows  # this step regrows the buffers
    with dev.stream:  # ~tens of ms of queued work on the model's stream
        busy = cp.ones(1 << 26, np.float32)
        for _ in range(40):
            busy *= 1.0001
    a = ref.forward([SeqChunk(c, s) for c, s in zip(cr, seqs, strict=True)])
    b = dev.forward([SeqChunk(c, s) for c, s in zip(cd, seqs, strict=True)])
    assert np.abs(a - b).max() < 1e-3 * np.abs(a).max()


@gpu
def test_models_one_after_another_on_the_cublas_path(tmp_path: Path) -> None:
    """Models built one after another in a process, each freed (its stream, caches and
    captured cuBLAS graph gone) before the next: each one's steps equal the CPU backend's."""
    import gc

    import cupy as cp

    rng = np.random.default_rng(8)
    seqs = [rng.integers(0, SMALL.n_vocab, 5).tolist() for _ in range(24)]
    for i, dtype in enumerate((DType.Q4_K, DType.F16, DType.Q4_K)):
        ir = load_model(write_random_llama(tmp_path / f"m{i}.gguf", dtype, SMALL, seed=i))
        ref, dev = cpu_exact(ir), on_gpu(ir)
        dev.dev.gemv_max = 16  # the cuBLAS path, captured from the second decode step
        cr = [ref.new_cache("f16") for _ in seqs]
        cd = [dev.new_cache("f16") for _ in seqs]
        a = ref.forward([SeqChunk(c, s) for c, s in zip(cr, seqs, strict=True)])
        b = dev.forward([SeqChunk(c, s) for c, s in zip(cd, seqs, strict=True)])
        for _ in range(3):
            assert np.abs(a - b).max() < 1e-3 * np.abs(a).max(), (i, dtype)
            nxt = [int(t) for t in np.argmax(a, axis=1)]
            a = ref.forward([SeqChunk(c, [t]) for c, t in zip(cr, nxt, strict=True)])
            b = dev.forward([SeqChunk(c, [t]) for c, t in zip(cd, nxt, strict=True)])
        assert dev.dev.blas is not None and len(dev._graphs) == 1
        for c in cd:
            c.free()
        del dev, cd
        gc.collect()
        cp.get_default_memory_pool().free_all_blocks()


def smollm2_path() -> Path:
    env = os.environ.get("MODELC_CUDA_SMOLLM2")
    if env:
        return Path(env)
    from tests.assets import smollm2_gguf

    try:
        return smollm2_gguf()
    except Exception as e:  # no network and no cached copy (the GPU machine)
        pytest.skip(f"SmolLM2 not available ({e}); set MODELC_CUDA_SMOLLM2")


@gpu
@pytest.mark.parametrize("mode", ["f32", "f16"])
def test_smollm2_matches_cpu_and_transformers(mode: str) -> None:
    ir = load_model(smollm2_path())
    ref, dev = cpu_exact(ir), on_gpu(ir)
    records = golden("smollm2.json")["records"]
    errs = []
    for rec in records[:: 4 if mode == "f32" else 8]:
        errs.append(compare(ref, dev, rec["prompt_ids"], len(rec["greedy"]), mode))
        if mode == "f32":  # and transformers' f32 goldens
            lp, gen = greedy_run(dev, rec["prompt_ids"], len(rec["greedy"]), mode)
            assert np.max(np.abs(lp[rec["top_ids"]] - rec["top_logprobs"])) <= LOGPROB_TOL
            assert gen == rec["greedy"]
    print(f"smollm2 {mode}: max top-10 log-prob error vs CPU {max(errs):.2e}")


@gpu
@pytest.mark.parametrize("name", ["q4_0", "q8_0"])
def test_random_1b_matches_cpu(name: str) -> None:
    d = os.environ.get("MODELC_CUDA_1B_DIR")
    if not d or not (Path(d) / f"llama1b-{name}.gguf").exists():
        pytest.skip("no 1B model: set MODELC_CUDA_1B_DIR (python -m tests.gen_cuda_models DIR)")
    ir = load_model(Path(d) / f"llama1b-{name}.gguf")
    ref, dev = cpu_exact(ir), on_gpu(ir)
    prompt = np.random.default_rng(5).integers(0, ir.hparams.n_vocab, 40).tolist()
    err = compare(ref, dev, prompt, 16)
    print(f"1B {name}: top-10 log-prob error vs CPU {err:.2e}")


# -- the engine ---------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_engine_batches_cancels_and_frees_kv_on_gpu(model: str) -> None:
    """The unchanged engine on --device cuda (SmolLM2, and the tiny random Gemma 3 of
    tests/gen_families): four greedy requests running together give each one's alone
    result; a request cancelled mid-generation stops within a step and its KV memory goes
    back (budget and GPU pool)."""
    import cupy as cp

    from modelc.engine import EngineOptions, build_engine
    from modelc.engine.api import FinishEvent, FinishReason, GenerationRequest, TokenEvent
    from modelc.runtime.backends.cuda_llama import CudaLlama
    from modelc.runtime.sampling import SamplingParams
    from tests.runtime_support import decode_alone

    os.environ["MODELC_MATMUL"] = "exact"
    from tests.gen_families import ensure_family

    path = smollm2_path() if model == "smollm2" else ensure_family(model)[1]
    eng = build_engine(path, EngineOptions(device="cuda", speculative=False))
    assert isinstance(eng.lm, CudaLlama) and eng.tok is not None
    p = SamplingParams(temperature=0.0, max_tokens=16)
    texts = ["The capital of France is", "def fib(n):", "Once upon a time", "1, 2, 3, 4,"]
    prompts = [eng.tok.encode(t) for t in texts]
    expected = []
    for pr in prompts:
        c = eng.lm.new_cache(eng.mode, max_tokens=eng.max_context)
        expected.append(decode_alone(eng.lm, c, pr, p, sorted(eng.prompt.eog_ids)))  # type: ignore[union-attr]
        c.free()
    pool = cp.get_default_memory_pool()

    async def main() -> None:
        async with trio.open_nursery() as n:
            await n.start(eng.run)
            base = pool.used_bytes()
            got: dict[int, list[int]] = {}

            async def one(i: int) -> None:
                toks = []
                async for ev in eng.submit(GenerationRequest(f"r{i}", prompts[i], p)):
                    if isinstance(ev, TokenEvent):
                        toks.append(ev.token_id)
                got[i] = toks

            async with trio.open_nursery() as m:
                for i in range(4):
                    m.start_soon(one, i)
            assert [got[i] for i in range(4)] == expected
            assert eng.kv_budget.used == 0
            long = SamplingParams(temperature=0.0, max_tokens=200)
            victim = eng.submit(GenerationRequest("victim", prompts[0], long, ignore_eos=True))
            seen, after = 0, []
            async for ev in victim:
                if isinstance(ev, TokenEvent) and seen < 5:
                    seen += 1
                    if seen == 5:
                        assert eng.kv_budget.used > 0 and pool.used_bytes() > base
                        steps = eng.stats().steps
                        victim.cancel()
                else:
                    after.append(ev)
            assert len(after) == 1 and isinstance(after[0], FinishEvent)
            assert after[0].reason is FinishReason.CANCELLED
            assert eng.stats().steps <= steps + 1
            assert eng.kv_budget.used == 0
            assert pool.used_bytes() <= base  # the cache's device memory is back in the pool
            n.cancel_scope.cancel()

    trio.run(main)


@gpu
def test_prefix_hits_kept_on_the_gpu_answer_as_a_fresh_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished request's blocks stay in GPU memory (the default,
    ``MODELC_CUDA_PREFIX=device``: the prefix cache holds CuPy arrays) and the same prompt again loads them on the device
    (``cached_tokens``) and answers token for token as the first run did."""
    import cupy as cp

    from modelc.engine import EngineOptions, build_engine
    from modelc.engine.api import GenerationRequest
    from modelc.runtime.sampling import SamplingParams
    from tests.runtime_support import engine_in_turn

    d = os.environ.get("MODELC_CUDA_1B_DIR")
    if not d or not (Path(d) / "llama1b-q4_0.gguf").exists():
        pytest.skip("no 1B model: set MODELC_CUDA_1B_DIR (python -m tests.gen_cuda_models DIR)")
    monkeypatch.setenv("MODELC_MATMUL", "exact")
    monkeypatch.delenv("MODELC_CUDA_PREFIX", raising=False)
    opts = EngineOptions(device="cuda", speculative=False, max_context=512)
    eng = build_engine(Path(d) / "llama1b-q4_0.gguf", opts)
    assert eng.runner is not None
    prompt = np.random.default_rng(9).integers(0, 32000, 100).tolist()
    p = SamplingParams(temperature=0.0, max_tokens=16)

    reqs = [GenerationRequest(f"r{i}", prompt, p, ignore_eos=True) for i in range(2)]
    (first, c0), (again, c1) = trio.run(engine_in_turn, eng, reqs)
    blocks = list(eng.runner.prefix.blocks.values())
    assert blocks and all(b.on_device and isinstance(b.k, cp.ndarray) for b in blocks)
    assert c0 == 0 and c1 >= len(prompt) // 32 * 32 - 32, (c0, c1)
    assert again == first


@pytest.mark.skipif(WHY is None, reason="CUDA is usable here")
def test_get_backend_cuda_without_cuda_is_a_usage_error() -> None:
    from modelc.errors import UsageError
    from modelc.runtime.backends.factory import get_backend

    with pytest.raises(UsageError, match="use --device cpu") as e:
        get_backend("cuda")
    assert "\n" not in str(e.value)


@gpu
def test_device_sampling_matches_the_host_path() -> None:
    """The batched sampler over CuPy (what ``CudaLlama.forward_sample`` runs: only the
    chosen tokens and the log-probabilities asked for come back) against the host sampler
    on the same device logits, step by step for a batch of mixed settings: the same
    tokens, log-probabilities within 1e-6 (CuPy's exp and sums round apart from numpy's);
    then the engine sampling on the GPU (--device-sampling on) gives the tokens of
    --device-sampling off."""
    from modelc.engine import EngineOptions, build_engine
    from modelc.engine.api import GenerationRequest
    from modelc.runtime.batch_sampler import BatchParams, sample_batch
    from modelc.runtime.sampling import Sample, Sampler, SamplingParams
    from tests.runtime_support import engine_events

    path = smollm2_path()
    dev = on_gpu(load_model(path))
    n_vocab = dev.n_vocab
    mixes = [
        SamplingParams(temperature=0.0, logprobs=3),
        SamplingParams(temperature=0.8, top_k=40, seed=7, logprobs=0),
        SamplingParams(top_p=0.9, repetition_penalty=1.2, seed=8),
        SamplingParams(temperature=1.3, min_p=0.05, presence_penalty=0.6, seed=9, logprobs=5),
        SamplingParams(frequency_penalty=0.5, logit_bias={13: 4.0}, banned_token_ids=[2], seed=10),
        SamplingParams(top_k=5, top_p=0.5, temperature=0.7, seed=11, logprobs=20),
    ]
    rng = np.random.default_rng(6)
    prompts = [rng.integers(0, n_vocab, n).tolist() for n in (12, 5, 30, 8, 17, 3)]
    host = [Sampler(p, n_vocab, pr) for p, pr in zip(mixes, prompts, strict=True)]
    on_dev = [Sampler(p, n_vocab, pr) for p, pr in zip(mixes, prompts, strict=True)]
    caches = [dev.new_cache("f32") for _ in prompts]
    feed: list[list[int]] = prompts

    def lps(s: Sample) -> list[float]:
        return [s.logprob, *(v for _, v in s.top)]

    for step in range(24):
        logits = dev.forward([SeqChunk(c, f) for c, f in zip(caches, feed, strict=True)])
        want = [s.sample(x) for s, x in zip(host, logits, strict=True)]
        bp = BatchParams.gather(on_dev)
        got = sample_batch(dev.cp, dev.logits[: len(feed)], bp).samples(bp)
        for w, g, s_h, s_d in zip(want, got, host, on_dev, strict=True):
            assert g.token == w.token and [t for t, _ in g.top] == [t for t, _ in w.top], step
            np.testing.assert_allclose(lps(g), lps(w), rtol=0, atol=1e-6)
            s_h.accept(w.token)
            s_d.accept(g.token)
        feed = [[w.token] for w in want]
    for c in caches:
        c.free()
    del dev

    requests = [
        GenerationRequest(f"r{i}", pr, dataclasses.replace(p, max_tokens=16))
        for i, (pr, p) in enumerate(zip(prompts, mixes, strict=True))
    ]
    got_events: dict[str, Any] = {}
    for mode in ("off", "on"):
        eng = build_engine(path, EngineOptions(device="cuda", device_sampling=mode))
        got_events[mode] = trio.run(engine_events, eng, requests)
        extra = eng.stats().extra
        steps = int(extra["device_sampled_steps"])
        assert (steps > 0) == (mode == "on"), (mode, steps)
        # the model's graph counts reach the stats (and /metrics: modelc_engine_graph_steps_*)
        assert extra.get("graph_steps_replayed", 0) + extra.get("graph_steps_eager", 0) > 0, extra
        del eng
    for a, b in zip(got_events["off"], got_events["on"], strict=True):
        assert [e.token_id for e in a] == [e.token_id for e in b]
        np.testing.assert_allclose(
            [e.logprob if e.logprob is not None else 0.0 for e in a],
            [e.logprob if e.logprob is not None else 0.0 for e in b],
            rtol=0,
            atol=1e-6,
        )


@gpu
def test_cublas_steps_from_another_thread(tmp_path: Path) -> None:
    """The server runs steps on a worker thread, not the one that built the model: a
    24-sequence batch (the cuBLAS path) stepped there gives the main thread's logits."""
    import threading

    ir = load_model(write_random_llama(tmp_path / "m.gguf", DType.Q4_0, SMALL, seed=9))
    dev = on_gpu(ir)
    dev.dev.gemv_max = 16
    rng = np.random.default_rng(10)
    seqs = [rng.integers(0, SMALL.n_vocab, 5).tolist() for _ in range(24)]
    out: dict[str, Any] = {}

    def run(key: str) -> None:
        try:
            caches = [dev.new_cache("f16") for _ in seqs]
            out[key] = dev.forward([SeqChunk(c, s) for c, s in zip(caches, seqs, strict=True)])
            for c in caches:
                c.free()
        except Exception as e:  # reported below, on the test's thread
            out[key] = e

    run("main")
    t = threading.Thread(target=run, args=("worker",))
    t.start()
    t.join()
    assert dev.dev.blas is not None
    assert not isinstance(out["worker"], Exception), out["worker"]
    assert np.array_equal(out["main"], out["worker"])
