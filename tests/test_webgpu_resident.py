"""The resident WebGPU decoder (webgpu_llama.py: weights, KV caches and a step's
activations on the device, one submit a step) against the CPU backend in exact mode, on
Mesa's software Vulkan in CI: tiny random llama (Q4_K_M's mixture), qwen2 (Q/K/V
biases), qwen3, mistral, gemma2 (soft caps) and gemma3 (scaled embeddings, post-norms,
the windowed layers' own RoPE base), f16 and f32 caches, greedy tokens equal and top-10 log-probs within 2e-3;
a context shift; the real Gemma 3 270M (within 1e-4, f32 caches); a step mixing a
prompt chunk with decode rows of other sequences after a cache was freed; one submit a
step; a family it does not run refused in one line, the engine then op by op.
SmolLM2 through ``modelc generate --device webgpu`` is test_webgpu.py's (resident there
by default)."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelc.errors import UnsupportedError
from modelc.runtime.model import SeqChunk
from tests.runtime_support import LOGPROB_TOL, log_softmax, make_backend, webgpu_backend

pytest.importorskip("wgpu")

from modelc.runtime.backends.webgpu import GEMV_ROWS, WebGPUBackend
from modelc.runtime.backends.webgpu_layer import webgpu_host
from modelc.runtime.backends.webgpu_llama import WebGpuLlama

if not os.environ.get("XDG_RUNTIME_DIR"):  # Mesa's WSI warns without one
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="modelc-xdg-")


@pytest.fixture(scope="module")
def gpu() -> WebGPUBackend:
    """The adapter's backend with decode products on gemv.wgsl, as on a GPU (a CPU
    adapter, lavapipe in CI, would take matmul.wgsl)."""
    be = webgpu_backend()
    be.gemv_rows = GEMV_ROWS
    return be  # type: ignore[no-any-return]


def _llama() -> Path:
    from tests.assets import assets_dir, cache_lock
    from tests.gen_cuda_models import Q4_K_M, SMALL, write_random_llama

    p = assets_dir() / "webgpu-resident-llama-q4km.gguf"
    with cache_lock(p.name):
        if not p.exists():
            tmp = p.with_suffix(".tmp")
            write_random_llama(tmp, Q4_K_M, SMALL, seed=3, std=0.05)
            tmp.replace(p)
    return p


# the random llama and the tiny families (tests/tiny_families.py) the resident decoder runs
FAMILIES = (
    *("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3"),
    *("smollm3", "phi3", "phi4mini", "olmo2", "olmo3", "mistral3", "qwen3moe", "mixtral"),
    *("gptoss", "gptoss-mxfp4", "glm4moe", "llama4", "qwen2vl", "deepseek2", "deepseek3"),
    *("gemma4", "gemma4moe", "lfm2", "lfm2moe"),
)


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request: Any, gpu: WebGPUBackend) -> tuple[Any, Any]:
    """The resident model and the CPU's exact one: a random llama (Q4_K_M's mixture), tiny
    qwen2 (Q/K/V biases), qwen3 (per-head Q/K norms), mistral (a sliding window of 8:
    the tests' prompts and steps run past it), gemma2 (soft-capped scores and logits,
    windows of 4 on alternate layers), gemma3 (windows of 4 on 5 of 6 layers, their RoPE
    base their own; both with scaled embeddings, post-norms and GELU), smollm3 (layers
    without RoPE), phi4mini (partial RoPE), olmo2 (post-norms only, Q/K norms over the
    whole projection), olmo3 (that, windows, and YaRN on the full-attention layers only),
    mistral3 (the queries' temperature by position), qwen3moe and mixtral (mixtures of
    experts, softmax top-k), gpt-oss with f32 and MXFP4 experts (attention sinks, output
    biases, its routing, expert biases and clamped SwiGLU) and glm4moe (sigmoid routing
    with a bias for the choice, scaled, a shared expert, a dense first layer; partial RoPE;
    Q/K/V biases with Q/K norms) and llama4 (chunked attention, weightless Q/K norms, NoPE
    layers, the query temperature, sigmoid top-k scaling the experts' input, a shared
    expert), qwen2vl's text (M-RoPE with every section at the token's position), deepseek2
    and deepseek3 (latent attention; V3's expert groups), gemma4 (layers of two head shapes
    in one cache, the last two reusing the keys and values of earlier ones, V norms, values
    from keys, proportional RoPE, per-layer input embeddings, output scales), gemma4moe
    (a mixture of 4 experts beside every layer's FFN, its router's norm and scale, each
    expert's output scale), lfm2 and lfm2moe (short convolutions in place of attention on
    two of three layers, each sequence's state kept on the host and moved each step)."""
    from modelc.formats import load_model
    from modelc.runtime.arch import build
    from tests.tiny_families import TINY

    ir = load_model(_llama() if request.param == "llama" else TINY[request.param]())
    return WebGpuLlama(ir, gpu), build(ir, make_backend("cpu-exact"))


def _close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> None:
    for g, c in zip(log_softmax(got), log_softmax(want), strict=True):
        top = np.argsort(c)[-10:]
        assert int(np.argmax(g)) == int(np.argmax(c))
        assert float(np.abs(g[top] - c[top]).max()) <= LOGPROB_TOL


def _greedy_like_cpu(model: Any, ref: Any, prompt: list[int], steps: int, kv: str) -> None:
    """``prompt`` and ``steps`` greedy steps on each: the same tokens, top-10 log-probs
    within 2e-3 (:func:`_close`)."""
    runs = []
    for m in (model, ref):
        cache = m.new_cache(kv)
        out = [m.forward([SeqChunk(cache, prompt)])]
        for _ in range(steps):
            out.append(m.forward([SeqChunk(cache, [int(np.argmax(out[-1][0]))])]))
        runs.append(np.concatenate(out))
        cache.free()
    _close(*runs)


@pytest.mark.parametrize("kv", ["f16", "f32"])
def test_prompt_and_decode_match_cpu(pair: tuple[Any, Any], kv: str) -> None:
    """A 9-token prompt and 5 greedy steps: the same tokens, top-10 log-probs within 2e-3."""
    _greedy_like_cpu(*pair, [1, 17, 33, 5, 90, 12, 7, 64, 3], 5, kv)


def test_mixed_step_freed_cache_and_one_submit(pair: tuple[Any, Any], gpu: WebGPUBackend) -> None:
    """Sequence A's prompt chunk (two logit rows) beside decode rows of B and C, after D's
    cache was filled and freed (a cancelled request), f16 caches: each row as the CPU's;
    the step and a decode step of three sequences are one submit each, and a decode step
    like the one before makes no bind group (~500 a step otherwise)."""
    model, ref = pair
    got = []
    for m in (model, ref):
        b, c, d = (m.new_cache("f16") for _ in range(3))
        m.forward([SeqChunk(b, [4, 8, 15]), SeqChunk(c, [16, 23]), SeqChunk(d, [42, 5, 6, 7])])
        d.free()
        a = m.new_cache("f16")
        runs0 = gpu.gpu.runs
        mixed = [SeqChunk(b, [9]), SeqChunk(a, [2, 11, 29, 30, 31], (1, 4)), SeqChunk(c, [77])]
        out1 = m.forward(mixed)
        out2 = m.forward([SeqChunk(x, [5]) for x in (a, b, c)])
        if m is model:
            assert gpu.gpu.runs - runs0 == 2  # one job (one submit) a step
        got.append(np.concatenate([out1, out2]))
        assert out1.shape[0] == 4 and (a.n, b.n, c.n) == (6, 5, 4)
        if m is model:
            made = gpu.gpu.groups_made  # the same step again: every bind group reused
            m.forward([SeqChunk(x, [6]) for x in (a, b, c)])
            assert gpu.gpu.groups_made == made
    _close(*got)


def test_refused_in_one_line_and_the_engine_goes_op_by_op(
    gpu: WebGPUBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """Qwen3.5 (Gated DeltaNet layers): refused naming what it lacks; the engine's
    --device webgpu then builds the op-level decoder and logs why."""
    from modelc.engine import EngineOptions, build_runtime
    from modelc.formats import load_model
    from modelc.runtime.arch.decoder import Decoder
    from tests.tiny_families import TINY

    ir = load_model(TINY["qwen35"]())
    with pytest.raises(UnsupportedError) as e:
        webgpu_host(ir)
    assert "\n" not in str(e.value) and "Gated DeltaNet" in str(e.value)
    with caplog.at_level(logging.WARNING, logger="modelc"):
        runtime, _ = build_runtime(ir, EngineOptions(device="webgpu"))
    assert isinstance(runtime, Decoder)
    assert any("op by op" in r.getMessage() for r in caplog.records)
    runtime, _ = build_runtime(load_model(_llama()), EngineOptions(device="webgpu"))
    assert isinstance(runtime, WebGpuLlama)


@pytest.mark.parametrize(
    "family", ["llama", "gptoss", "llama4", "deepseek3", "gemma4", "gemma4moe", "lfm2"]
)
def test_engine_batching_and_prefix_hits(gpu: WebGPUBackend, family: str) -> None:
    """Through the engine on ``--device webgpu`` (resident; a mixture's experts picked on
    the device row by row, gpt-oss's, Llama 4's and DeepSeek V3's, its latent rows through
    the prefix cache; Gemma 4's layers sharing cache layers; LFM2's states, their
    checkpoints for drafts and the prefix cache's blocks): requests batched (one joining
    late, one cancelled mid-way), the same prompt again and the next turn (prefix-cache
    hits: blocks copied through the host into a fresh device cache), speculative drafts
    rolled back (the cache truncated): each request's greedy tokens are the resident
    model's one-at-a-time tokens (``recurrent_support.check_engine_equal_alone``; the
    steps themselves are held to the CPU above)."""
    import trio

    from modelc.engine import EngineOptions, build_engine
    from modelc.formats import load_model
    from tests.recurrent_support import ENGINE_CHECK, check_engine_equal_alone
    from tests.tiny_families import TINY

    ir = load_model(_llama() if family == "llama" else TINY[family]())
    eng = build_engine(ir, EngineOptions(device="webgpu", kv_cache="f32", **ENGINE_CHECK))
    assert isinstance(eng.lm, WebGpuLlama)
    trio.run(check_engine_equal_alone, ir, eng)


def test_step_plans_kept_only_while_their_buffers_are(gpu: WebGPUBackend) -> None:
    """A decode step after a decode step runs the plan kept for its shape (no recording);
    a cache that grew (its buffer replaced, at 256 positions) or other rows make a fresh
    one (a kept plan would bind the destroyed buffer): every step's logits bit-equal to
    a model recording every step afresh, gate and up as two products besides."""
    from modelc.formats import load_model

    ir = load_model(_llama())
    kept, fresh = WebGpuLlama(ir, gpu), WebGpuLlama(ir, gpu)
    for ly in fresh.layers:
        ly.gate_up = None  # two products into gu's halves
    prompt = [(7 * i) % 90 + 1 for i in range(254)]
    got: list[list[np.ndarray[Any, Any]]] = [[], []]
    made = []
    for i, m in enumerate((kept, fresh)):
        cache, other = m.new_cache("f16"), m.new_cache("f16")
        m.forward([SeqChunk(other, [3, 4])])
        out = m.forward([SeqChunk(cache, prompt)])
        for _ in range(4):  # positions 254 .. 257: the cache grows at 256
            if m is fresh:
                m._plans.clear()
            buf = cache.buf
            out = m.forward([SeqChunk(cache, [int(np.argmax(out[-1]))])])
            got[i].append(out)
            if m is kept:
                made.append((kept.plans_made, cache.buf is buf))
        both = [SeqChunk(cache, [5]), SeqChunk(other, [6])]
        got[i].append(m.forward(both))  # two rows: not the one-row plan
        if m is kept:
            made.append((kept.plans_made, True))
    # 2 (the first steps) + the decode plan, kept at 255; a fresh one at 256 (grown), kept
    # at 257; one for the two-row step
    assert made == [(3, True), (3, True), (4, False), (4, True), (5, True)]
    for a, b in zip(*got, strict=True):
        assert np.array_equal(a, b)


def test_a_chunk_without_logit_rows(pair: tuple[Any, Any]) -> None:
    """A long prompt's first chunk, whose logits nobody wants (the engine's chunked
    prefill): the step waits for its work with nothing to read back, and the next chunk
    continues from the cache it wrote as the CPU's does."""
    model, ref = pair
    prompt = [1, 17, 33, 5, 90, 12, 7, 64, 3, 11, 19]
    got = []
    for m in (model, ref):
        cache = m.new_cache("f16")
        first = m.forward([SeqChunk(cache, prompt[:6], ())])
        assert first.shape[0] == 0 and cache.n == 6
        got.append(m.forward([SeqChunk(cache, prompt[6:])]))
        cache.free()
    _close(*got)


def test_context_shift_rerotates_each_layer_with_its_base(pair: tuple[Any, Any]) -> None:
    """A context shift (the kept keys re-rotated on the host, layer by layer: gemma3's
    windowed layers by their own RoPE base), then two greedy steps: as the CPU's."""
    model, ref = pair
    prompt = [(5 * i) % 80 + 1 for i in range(20)]
    if model.state_shapes:  # a recurrent state cannot forget tokens: no shift is offered
        cache = model.new_cache("f32", full=True)
        model.forward([SeqChunk(cache, prompt)])
        assert cache.max_discard(4) == 0 == ref.new_cache("f32").max_discard(4)
        return
    got = []
    for m in (model, ref):
        cache = m.new_cache("f32", full=True)
        m.forward([SeqChunk(cache, prompt)])
        m.shift_context(cache, 4, min(8, cache.max_discard(4)))
        out = [m.forward([SeqChunk(cache, [9])])]
        out.append(m.forward([SeqChunk(cache, [int(np.argmax(out[-1][0]))])]))
        got.append(np.concatenate(out))
        cache.free()
    _close(*got)


def test_real_gemma3_resident_equals_cpu(gpu: WebGPUBackend) -> None:
    """Gemma 3 270M Q4_K_M (scaled embeddings, post-norms, per-head Q/K norms, 5 of 6
    layers windowed with a RoPE base of their own, a 262k vocabulary) runs resident: a
    prompt and 4 greedy steps, f32 caches, the CPU's exact tokens and top-10 log-probs
    within 1e-4 (1.4e-5 measured on lavapipe)."""
    from modelc.formats import load_model
    from modelc.runtime.arch import build
    from tests.assets import gemma3_gguf

    ir = load_model(gemma3_gguf())
    runs = []
    for m in (WebGpuLlama(ir, gpu), build(ir, make_backend("cpu-exact"))):
        cache = m.new_cache("f32")
        out = [m.forward([SeqChunk(cache, [2, 818, 5279, 529, 7001, 563])])]
        for _ in range(4):
            out.append(m.forward([SeqChunk(cache, [int(np.argmax(out[-1][0]))])]))
        runs.append(np.concatenate(out))
        cache.free()
    got, want = runs
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()
    for g, c in zip(log_softmax(got), log_softmax(want), strict=True):
        top = np.argsort(c)[-10:]
        assert float(np.abs(g[top] - c[top]).max()) <= 1e-4


def test_experts_split_over_buffers(gpu: WebGPUBackend) -> None:
    """A mixture whose stacked experts are split over many buffers (a binding limit of 3
    rows, so buffers end inside an expert and inside a workgroup's 4 rows): each pair's
    rows found in whichever buffer holds them; the CPU's tokens and log-probs."""
    from modelc.formats import load_model
    from modelc.runtime.arch import build
    from tests.tiny_families import TINY

    ir = load_model(TINY["qwen3moe"]())
    saved = gpu.gpu.max_binding
    gpu.gpu.max_binding = 800  # 3 rows of 256 bytes a buffer (a workgroup takes 4)
    try:
        model = WebGpuLlama(ir, gpu)
    finally:
        gpu.gpu.max_binding = saved
    stacks = [m.gate for m in model.moes]
    assert all(len(gpu._chunks(w)) > 8 for w in stacks)
    assert any(r0 % (w.shape[0] // 4) for w in stacks for _, r0, _ in gpu._chunks(w))
    runs = []
    for m in (model, build(ir, make_backend("cpu-exact"))):
        cache = m.new_cache("f32")
        out = [m.forward([SeqChunk(cache, [1, 17, 33, 5, 90])])]
        for _ in range(3):
            out.append(m.forward([SeqChunk(cache, [int(np.argmax(out[-1][0]))])]))
        runs.append(np.concatenate(out))
        cache.free()
    _close(*runs)


def test_llama4_chunks_of_8(gpu: WebGPUBackend) -> None:
    """Llama 4 with chunks of 8 (tests/test_llama4.py's: the release's 8192 never binds in
    a short test): a 20-token prompt and 4 greedy steps cross two chunk starts, each query
    seeing its own chunk only; the CPU's tokens and log-probs."""
    from modelc.formats import load_model
    from modelc.runtime.arch import build
    from tests.tiny_families import TINY

    ir = load_model(TINY["llama4"]())
    ir.hparams.attn_chunk = 8
    runs = []
    for m in (WebGpuLlama(ir, gpu), build(ir, make_backend("cpu-exact"))):
        assert m.spec.chunks == (8, 8, 8, 0)  # type: ignore[attr-defined]
        cache = m.new_cache("f32")
        out = [m.forward([SeqChunk(cache, [(3 * i) % 90 + 1 for i in range(20)])])]
        for _ in range(4):
            out.append(m.forward([SeqChunk(cache, [int(np.argmax(out[-1][0]))])]))
        runs.append(np.concatenate(out))
        cache.free()
    _close(*runs)


@pytest.mark.parametrize("family", ["qwen3moe", "gptoss-mxfp4", "llama4", "deepseek3", "gemma4moe"])
def test_experts_grouped_by_expert_as_per_pair(
    gpu: WebGPUBackend, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's (token, slot) pairs grouped by expert (moe_group.wgsl, then each expert's
    rows read once over its pairs: moe_gemv_grouped) give the per-pair products' logits
    bit for bit (a 12-token prompt, every row's logits, and a decode step); a step groups
    when it has more pairs than half the experts (``MODELC_WEBGPU_MOE_GROUP`` 1 / 0: always
    / never)."""
    from modelc.formats import load_model
    from modelc.runtime.backends.webgpu_moe import grouped
    from tests.tiny_families import TINY

    monkeypatch.delenv("MODELC_WEBGPU_MOE_GROUP", raising=False)
    assert [grouped(p, 128) for p in (8, 64, 65, 4096)] == [False, False, True, True]
    assert not grouped(10_000, 1024)  # more experts than moe_group counts
    ir = load_model(TINY[family]())
    prompt = [1, 17, 33, 5, 90, 12, 7, 64, 3, 44, 21, 8]
    runs = []
    for mode in ("0", "1"):
        monkeypatch.setenv("MODELC_WEBGPU_MOE_GROUP", mode)
        model = WebGpuLlama(ir, gpu)
        cache = model.new_cache("f32")
        a = model.forward([SeqChunk(cache, prompt, tuple(range(len(prompt))))])
        b = model.forward([SeqChunk(cache, [int(np.argmax(a[-1]))])])
        runs.append(np.concatenate([a, b]))
        cache.free()
    assert np.array_equal(runs[0], runs[1])


def test_lfm2_cache_holds_its_attention_layers_only(gpu: WebGPUBackend) -> None:
    """LFM2's layers with a short convolution keep no keys or values: the device cache has
    a layer per attention layer (the tiny model: 1 of 3), as the CPU's keeps those layers'
    rows only, and its attention reads the right one (the prompt's greedy tokens and
    log-probs are test_prompt_and_decode_match_cpu's)."""
    from modelc.formats import load_model
    from tests.tiny_families import TINY

    model = WebGpuLlama(load_model(TINY["lfm2"]()), gpu)
    assert model.convs == [0, 2] and model.cache_layer == {1: 0}
    assert model.kv_shape.n_layer == 1 and model.new_cache("f16").shape.n_layer == 1


def test_phi3_long_factors_keep_to_the_original_context(
    gpu: WebGPUBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Phi-3 whose LongRoPE has long factors runs resident within its original context
    (64 of 256, as on CUDA and as llama.cpp at that context size), where its short factors
    hold: a prompt and greedy steps as the CPU's."""
    from modelc.formats import load_model
    from modelc.runtime.arch import build
    from tests import gen_families as gf

    short = gf.CONFIGS["phi3"]["rope_scaling"]["short_factor"]
    rope = {"type": "longrope", "short_factor": short, "long_factor": [2 * f for f in short]}
    monkeypatch.setitem(gf.CONFIGS, "phi3", {**gf.CONFIGS["phi3"], "rope_scaling": rope})
    path = tmp_path / "phi3.gguf"
    gf.write_gguf("phi3", gf.make_weights("phi3"), path)
    ir = load_model(path)
    model, ref = WebGpuLlama(ir, gpu), build(ir, make_backend("cpu-exact"))
    assert "long_rope" in model.spec.features()
    assert (ir.hparams.n_ctx, model.n_ctx) == (256, 64)
    _greedy_like_cpu(model, ref, [(7 * i) % 90 + 1 for i in range(40)], 4, "f32")
