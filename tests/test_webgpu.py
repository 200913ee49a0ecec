"""The WebGPU backend (WGSL shaders through wgpu) against the CPU backend and the numpy
reference: every op of the Backend protocol, weights split over the binding limit, a
SmolLM2 greedy run, and ``--device`` errors where no adapter exists.

CI runs these on Mesa's software Vulkan (lavapipe; scripts/test.sh installs it and sets
MODELC_REQUIRE_WEBGPU=1, so a missing adapter fails there instead of skipping).  Shapes
are small: lavapipe runs the shaders on the CPU.

Tolerances: both sides compute in float32 but sum in different orders (the shaders per
thread over quads of weights, the CPU in SIMD lanes, numpy in BLAS blocks), so products
agree to ~1e-6 relative to the output's scale, not bit for bit.  Dequantized rows
(get_rows) and RoPE rotations are elementwise and compared at 1e-6 relative.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from modelc.errors import UnsupportedError
from modelc.formats.ir import BLOCK_SIZES, DType
from modelc.formats.quants import quantize
from modelc.runtime.backend import Backend, Weight
from modelc.runtime.backends.numpy_ref import NumpyBackend
from tests.runtime_support import LOGPROB_TOL, golden, log_softmax, make_backend, webgpu_backend

pytest.importorskip("wgpu")

from modelc.runtime.backends.webgpu import DEQ, WebGPUBackend

if not os.environ.get("XDG_RUNTIME_DIR"):  # Mesa's WSI warns without one
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="modelc-xdg-")

REF = NumpyBackend()
RNG = np.random.default_rng(16)
# byte offsets of each block type's f16 scales (set to sane values in random blocks)
F16_FIELDS = {
    DType.Q4_0: [0],
    DType.Q4_1: [0, 2],
    DType.Q5_0: [0],
    DType.Q5_1: [0, 2],
    DType.Q8_0: [0],
    DType.Q4_K: [0, 2],
    DType.Q5_K: [0, 2],
    DType.Q6_K: [208],
    DType.IQ4_NL: [0],
    DType.Q2_K: [80, 82],  # no shader: the numpy fallback
}
QUANTIZED_BY_MODELC = (DType.Q8_0, DType.Q4_0, DType.Q4_1)


@pytest.fixture(scope="module")
def gpu() -> WebGPUBackend:
    return webgpu_backend()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def cpu() -> Backend:
    return make_backend("cpu-exact")


def weight(dtype: DType, rows: int, cols: int) -> Weight:
    """Real quantization of Gaussian weights where modelc quantizes that type; else random
    blocks (every bit pattern of the quants) with small random f16 scales."""
    dense = RNG.standard_normal((rows, cols)).astype(np.float32)
    if dtype is DType.F32:
        return Weight(dtype, (rows, cols), dense)
    if dtype is DType.F16:
        return Weight(dtype, (rows, cols), dense.astype(np.float16))
    if dtype is DType.BF16:
        return Weight(dtype, (rows, cols), (dense.view(np.uint32) >> 16).astype(np.uint16))
    if dtype in QUANTIZED_BY_MODELC:
        return Weight(dtype, (rows, cols), quantize(dense, dtype))
    bs, ts = BLOCK_SIZES[dtype]
    raw = RNG.integers(0, 256, (rows, cols // bs, ts), dtype=np.uint8)
    for off in F16_FIELDS.get(dtype, ()):
        scales = RNG.uniform(-0.05, 0.05, (rows, cols // bs, 1)).astype(np.float16)
        raw[:, :, off : off + 2] = scales.view(np.uint8)
    if dtype is DType.MXFP4:  # its E8M0 scale byte: 2^-10 .. 2^2, and the subnormal 0 and 1
        raw[:, :, 0] = RNG.choice([0, 1, *range(118, 131)], (rows, cols // bs))
    return Weight(dtype, (rows, cols), raw.reshape(rows, -1))


def close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], rel: float = 2e-6) -> None:
    """Agreement to ``rel`` of the reference's largest magnitude."""
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.all(np.isfinite(got))
    err = float(np.abs(got - want).max()) if got.size else 0.0
    assert err <= rel * max(float(np.abs(want).max()), 1e-30), f"max error {err:.3g}"


@pytest.mark.parametrize("dtype", list(DEQ), ids=lambda d: d.name)
def test_matmul_and_get_rows_every_type(gpu: WebGPUBackend, cpu: Backend, dtype: DType) -> None:
    # F32/F16/BF16 rows of a width that is not a multiple of 4 (the shader's tail path)
    cols = 70 if dtype in (DType.F32, DType.F16, DType.BF16) else (512 if "K" in dtype.name else 96)
    w = weight(dtype, 37, cols)
    for n in (1, 3, 11):  # single row, a padded tile of 4, two tiles of 8
        x = RNG.standard_normal((n, cols)).astype(np.float32)
        got = gpu.matmul(w, x)
        close(got, REF.matmul(w, x))
        close(got, cpu.matmul(w, x))
    ids = np.array([5, 36, 0, 5])
    close(gpu.get_rows(w, ids), REF.get_rows(w, ids), 1e-6)
    out = np.empty((len(ids), cols), np.float32)
    assert gpu.get_rows(w, ids, out=out) is out
    close(out, cpu.get_rows(w, ids), 1e-6)


def test_matmul_many_mixed_types_and_fallback(gpu: WebGPUBackend) -> None:
    # Q2_K has no shader: it takes the numpy fallback inside the same call
    ws = [weight(DType.Q4_1, 20, 256), weight(DType.Q8_0, 7, 256), weight(DType.Q2_K, 9, 256)]
    x = RNG.standard_normal((2, 256)).astype(np.float32)
    outs = [np.empty((2, w.shape[0]), np.float32) for w in ws]
    res = gpu.matmul_many(ws, x, outs)
    for r, o, w in zip(res, outs, ws, strict=True):
        assert r is o
        close(r, REF.matmul(w, x))


def test_weight_split_over_the_binding_limit(gpu: WebGPUBackend) -> None:
    """A weight over maxStorageBufferBindingSize is split by rows over several buffers."""
    w = weight(DType.Q8_0, 50, 128)  # 136 bytes a row
    saved = gpu.gpu.max_binding
    gpu.gpu.max_binding = 1024  # 7 rows a buffer
    try:
        chunks = gpu._chunks(w)
        wide = Weight(DType.F32, (2, 512), RNG.standard_normal((2, 512)).astype(np.float32))
        with pytest.raises(UnsupportedError, match="storage-binding limit"):
            gpu._chunks(wide)  # one row of 2048 bytes: no split helps
    finally:
        gpu.gpu.max_binding = saved
    assert len(chunks) == 8 and sum(c[2] for c in chunks) == 50
    x = RNG.standard_normal((9, 128)).astype(np.float32)
    close(gpu.matmul(w, x), REF.matmul(w, x))
    ids = np.array([49, 0, 7, 13, 14])
    close(gpu.get_rows(w, ids), REF.get_rows(w, ids), 1e-6)


def test_norms_softmax_activations(gpu: WebGPUBackend, cpu: Backend) -> None:
    x = (RNG.standard_normal((5, 200)) * 3).astype(np.float32)
    w = RNG.standard_normal(200).astype(np.float32)
    b = RNG.standard_normal(200).astype(np.float32)
    for ref in (REF, cpu):
        close(gpu.rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5))
        close(gpu.layer_norm(x, w, b, 1e-5), ref.layer_norm(x, w, b, 1e-5))
        s = x * 20  # a wide range: the row max must be subtracted
        close(gpu.softmax(s.copy()), ref.softmax(s.copy()))
        big = np.concatenate([x * 30, np.full((1, 200), -200.0, np.float32)])  # exp over/underflow
        up = RNG.standard_normal(big.shape).astype(np.float32)
        close(gpu.silu_mul(big, up), ref.silu_mul(big, up))
        close(gpu.gelu(big), ref.gelu(big))
    out = np.empty_like(x)
    assert gpu.rms_norm(x, w, 1e-6, out=out) is out
    sm = x.copy()
    assert gpu.softmax(sm) is sm  # in place
    close(sm, REF.softmax(x.copy()))


def test_rope(gpu: WebGPUBackend, cpu: Backend) -> None:
    # positions to 32k and negative ones (a context shift re-rotates by -n_discard)
    pos = np.array([0, 1, 5, 100, 2047, 8191, -300, 32767], np.int64)
    inv = (10000.0 ** (-np.arange(0, 48, 2) / 64)).astype(np.float32)  # rot_dim 48 of hd 64
    cs, sn = gpu.rope_angles(pos, inv)
    rcs, rsn = REF.rope_angles(pos, inv)
    assert float(np.abs(cs - rcs).max()) < 1e-6 and float(np.abs(sn - rsn).max()) < 1e-6
    for neox in (False, True):
        q = RNG.standard_normal((len(pos), 3, 64)).astype(np.float32)
        want = cpu.rope(q.copy(), (rcs, rsn), neox)
        got = q.copy()
        assert gpu.rope(got, (rcs, rsn), neox) is got
        close(got, want, 1e-6)
        np.testing.assert_array_equal(got[..., 48:], q[..., 48:])  # past rot_dim: unchanged


@pytest.mark.parametrize("kv", [np.float32, np.float16], ids=["f32", "f16"])
def test_attention_ops(gpu: WebGPUBackend, cpu: Backend, kv: Any) -> None:
    hd, nh, nkv = 32, 6, 2  # grouped-query: 3 heads per KV head
    q = RNG.standard_normal((4, nh, hd)).astype(np.float32)
    k = RNG.standard_normal((9, nkv, hd)).astype(kv)
    v = RNG.standard_normal((9, nkv, hd)).astype(kv)
    for ref in (REF, cpu):
        close(gpu.attention(q, k, v, 5, 0.17), ref.attention(q, k, v, 5, 0.17))
    qs, ks, vs = [q, q[:1], q[:2]], [k, k[:3], k[:7]], [v, v[:3], v[:7]]
    want = cpu.attention_batch(qs, ks, vs, [5, 2, 5], 0.2)
    outs = [np.empty_like(a) for a in qs]
    got = gpu.attention_batch(qs, ks, vs, [5, 2, 5], 0.2, outs)
    for g, o, e in zip(got, outs, want, strict=True):
        assert g is o
        close(g, e)
    # append: rows 0-1 to a cache holding 3, rows 2-4 to an empty one
    stores = [np.zeros((12, nkv, hd), kv) for _ in range(4)]
    stores[0][:3] = RNG.standard_normal((3, nkv, hd))
    ref_stores = [s.copy() for s in stores]
    qn = RNG.standard_normal((5, nh, hd)).astype(np.float32)
    kn = RNG.standard_normal((5, nkv, hd)).astype(np.float32)
    vn = RNG.standard_normal((5, nkv, hd)).astype(np.float32)
    out, ref_out = np.zeros_like(qn), np.zeros_like(qn)
    gpu.attention_append(qn, kn, vn, stores[:2], stores[2:], [3, 0], [2, 3], 0.3, out)
    cpu.attention_append(qn, kn, vn, ref_stores[:2], ref_stores[2:], [3, 0], [2, 3], 0.3, ref_out)
    for s, r in zip(stores, ref_stores, strict=True):
        np.testing.assert_array_equal(s, r)  # f16 stores round as numpy does
    close(out, ref_out)
    # a sliding window (the shader starts each row at its window), soft-capped scores and
    # sinks (gpt-oss: a logit a head in the denominator), in the shader: as the CPU kernels
    sinks = (RNG.standard_normal(nh) * 2).astype(np.float32)
    for window, softcap, sk in ((3, 0.0, None), (1, 0.0, None), (0, 2.0, None), (4, 1.5, None),
                                (0, 0.0, sinks), (3, 0.0, sinks), (2, 1.5, sinks)):  # fmt: skip
        kw: dict[str, Any] = {"window": window, "softcap": softcap, "sinks": sk}
        got1 = gpu.attention(q * 3, k, v, 5, 0.17, **kw)
        close(got1, cpu.attention(q * 3, k, v, 5, 0.17, **kw))
        want = cpu.attention_batch(qs, ks, vs, [5, 2, 5], 0.2, **kw)
        got = gpu.attention_batch(qs, ks, vs, [5, 2, 5], 0.2, **kw)
        for g, e in zip(got, want, strict=True):
            close(g, e)
        gpu.attention_append(qn, kn, vn, stores[:2], stores[2:], [3, 0], [2, 3], 0.3, out, **kw)  # fmt: skip
        cpu.attention_append(qn, kn, vn, ref_stores[:2], ref_stores[2:], [3, 0], [2, 3], 0.3, ref_out, **kw)  # fmt: skip
        close(out, ref_out)
        assert not np.allclose(got1, gpu.attention(q * 3, k, v, 5, 0.17))  # they matter


@pytest.fixture(scope="module")
def smollm2_pair(gpu: WebGPUBackend, cpu: Backend) -> Iterator[tuple[Any, Any]]:
    from modelc.formats import load_model
    from modelc.runtime.arch import build
    from tests.assets import smollm2_gguf

    ir = load_model(smollm2_gguf())
    yield build(ir, gpu), build(ir, cpu)


def test_smollm2_greedy_matches_cpu(smollm2_pair: tuple[Any, Any]) -> None:
    """SmolLM2-135M Q4_1 (Q4_1 + Q8_0 weights): a 4-token prompt and 3 greedy steps on the
    GPU equal the CPU backend's (exact mode, f32 KV cache) tokens, top-10 log-probs within
    2e-3 at every step; the prompt's also within 2e-3 of transformers' (the golden)."""
    from modelc.runtime.model import SeqChunk

    rec = golden("smollm2.json")["records"][18]  # "The mitochondria is the": margin 0.22
    gpu_model, cpu_model = smollm2_pair
    runs = []
    for model in (gpu_model, cpu_model):
        cache = model.new_cache("f32")
        lps = [log_softmax(model.forward([SeqChunk(cache, rec["prompt_ids"])])[0])]
        toks = [int(np.argmax(lps[0]))]
        for _ in range(3):
            lps.append(log_softmax(model.forward([SeqChunk(cache, [toks[-1]])])[0]))
            toks.append(int(np.argmax(lps[-1])))
        runs.append((toks, lps))
    (g_toks, g_lps), (c_toks, c_lps) = runs
    assert g_toks == c_toks == rec["greedy"][:4]
    for g, c in zip(g_lps, c_lps, strict=True):
        top = np.argsort(c)[-10:]
        assert float(np.abs(g[top] - c[top]).max()) <= LOGPROB_TOL
    err = float(np.abs(g_lps[0][rec["top_ids"]] - np.asarray(rec["top_logprobs"])).max())
    assert err <= LOGPROB_TOL, f"prompt log-probs {err:.2e} from transformers'"


def _modelc(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelc.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


@pytest.mark.skipif(sys.platform != "linux", reason="Metal/D3D12 adapters stay without Vulkan")
def test_run_device_without_adapter_is_one_line() -> None:
    """No Vulkan driver at all (the ICD list points nowhere; wgpu's OpenGL adapter, which
    remains, is not used for compute): ``--device webgpu`` and ``--device metal`` refuse in
    one line, exit 2, before loading a model."""
    env = {"VK_ICD_FILENAMES": "/nonexistent", "VK_DRIVER_FILES": "/nonexistent"}
    for device, words in (("webgpu", "no Metal, Vulkan or D3D12 adapter"), ("metal", "no Metal")):
        r = _modelc("run", "no-such-model", "--device", device, "--port", "0", env=env)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "--device cpu" in lines[0], r.stderr


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS has a Metal adapter")
def test_run_device_metal_needs_a_metal_adapter(gpu: WebGPUBackend) -> None:
    """Off macOS a Vulkan adapter exists (the fixture found it) but ``metal`` asks for a Metal
    one: the one-line error names what there is and points to ``--device webgpu``."""
    r = _modelc("run", "no-such-model", "--device", "metal", "--port", "0", env={})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device webgpu" in lines[0] and "Vulkan" in lines[0], r.stderr


def test_generate_device_webgpu_matches_cpu(gpu: WebGPUBackend) -> None:
    """``modelc generate --device webgpu``: the engine on the resident WebGPU decoder writes
    the same greedy text as on the CPU (exact mode) for SmolLM2 (f16 KV caches)."""
    from tests.assets import smollm2_gguf

    args = ["generate", str(smollm2_gguf()), "The mitochondria is the", "--max-tokens", "4"]
    args += ["--temperature", "0"]
    env = {"MODELC_MATMUL": "exact"}
    on_gpu = _modelc(*args, "--device", "webgpu", env=env)
    on_cpu = _modelc(*args, "--device", "cpu", env=env)
    assert on_gpu.returncode == 0 and on_cpu.returncode == 0, on_gpu.stderr + on_cpu.stderr
    assert "op by op" not in on_gpu.stderr  # the resident decoder (webgpu_llama.py) ran it
    assert on_gpu.stdout == on_cpu.stdout and len(on_cpu.stdout.split()) >= 2, (
        on_gpu.stdout,
        on_cpu.stdout,
    )


def test_weights_over_the_memory_budget_refused_at_load(gpu: WebGPUBackend) -> None:
    """A budget (MODELC_WEBGPU_MEMORY; on macOS Metal's recommended working set) smaller
    than the model: refused in one line while the engine loads (its first step places the
    weights), naming the budget and the sizes; SmolLM2's embedding alone is 29 MiB."""
    from tests.assets import smollm2_gguf

    args = ["generate", str(smollm2_gguf()), "Hi", "--max-tokens", "1", "--device", "webgpu"]
    r = _modelc(*args, env={"MODELC_WEBGPU_MEMORY": "16"})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "16 MiB budget (MODELC_WEBGPU_MEMORY): 0 MiB placed, the next needs 28 MiB" in lines[0]


@pytest.mark.parametrize("family", ["gptoss", "gptoss-mxfp4", "gemma2"])
def test_sinks_and_soft_caps_in_the_shader(gpu: WebGPUBackend, family: str) -> None:
    """gpt-oss (attention sinks, sliding windows) and Gemma 2 (soft-capped scores), tiny and
    random, with attention in the WGSL shader: a 30-token prompt and 8 greedy tokens equal
    to the CPU's exact mode, top-10 log-probs within 2e-3 (lavapipe: ~5e-7)."""
    from modelc.formats import load_model
    from modelc.runtime.arch import build
    from tests.runtime_support import make_backend, same_as_reference
    from tests.tiny_families import TINY

    ir = load_model(TINY[family]())
    ref = build(ir, make_backend("cpu-exact"))
    prompt = np.random.default_rng(5).integers(0, min(ref.n_vocab, 300), 30).tolist()
    same_as_reference(ref, build(ir, gpu), prompt, 8)
