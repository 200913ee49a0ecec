"""The CUDA kernels of issue 35's decode work against numpy: the coalesced dequantizer
(``deq8``, :mod:`modelc.runtime.backends.cuda_deq`) bit for bit the first one (``deq_rows``)
and the reference, and the int8 GEMV (``q8``, :mod:`modelc.runtime.backends.cuda_gemvq`)
against the weights' product with the activations quantized as it quantizes them; then
models on the q8 path against their numpy twin (the same quantizing; top-10 log-probs
within 2e-3, greedy equal) and against the CPU's exact mode, no further from it than the
CPU's fast mode is.

Needs a GPU (skips elsewhere; the bit layouts are checked on the CPU by
``tests/test_cuda_quants_host.py``, the source's compiling by ``tests/test_cuda_compile.py``).
A few seconds on an H100, plus the 1B Q4_K_M's CPU runs (numpy twin, exact and fast modes,
64-token prompt and 6 tokens: ~30 s) where ``MODELC_CUDA_1B_DIR`` has it.
"""

from __future__ import annotations

import os
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelc.formats import load_model
from modelc.formats.ir import DType
from modelc.runtime.backends.cuda import cuda_unavailable, device
from tests.gen_cuda_models import (
    Q4_K_M,
    SMALL,
    as_the_gpu_reads,
    random_blocks,
    write_random_llama,
)
from tests.runtime_support import LOGPROB_TOL, make_backend

WHY = cuda_unavailable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"no CUDA here: {WHY}")
DEQ_TYPES = [
    *(DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.Q8_0, DType.Q2_K, DType.Q3_K),
    *(DType.Q4_K, DType.Q5_K, DType.Q6_K, DType.IQ4_NL, DType.IQ4_XS, DType.MXFP4),
    *(DType.BF16, DType.F16, DType.F32),
]
Q8_TYPES = [DType.Q4_0, DType.Q8_0, DType.Q4_K, DType.Q5_K, DType.Q6_K]


@pytest.fixture(scope="module")
def be() -> Any:
    from modelc.runtime.backends.cuda_backend import CudaBackend

    return CudaBackend()


def restore(dev: Any) -> None:
    """The process's device back to the environment's settings (tests after these use it)."""
    dev.read_env()


def rel(a: Any, b: Any) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


@pytest.mark.parametrize("dtype", DEQ_TYPES, ids=lambda d: d.name)
def test_deq8_equals_the_first_dequantizer_bit_for_bit(be: Any, dtype: DType) -> None:
    """Every row, f32 and f16, into a tight matrix (16-byte stores) and into a view one
    column in (scalar stores), picked rows and all rows: the same bits as ``deq_rows``."""
    from modelc.runtime.backend import Weight

    cp, dev = be.cp, be.dev
    rows, cols = 37, 2304
    data, _ = random_blocks(np.random.default_rng(7), dtype, rows, cols, 0.05)
    w = Weight(dtype, (rows, cols), data)
    part = be.weight(w).parts[0]
    ids = cp.asarray(np.array([36, 0, 5, 5, 17], np.int64))
    want32 = as_the_gpu_reads(w)  # MXFP4's subnormal scales flushed (-ftz=true)
    try:
        for f16, dt in ((False, np.float32), (True, np.float16)):
            for picked in (None, ids):
                n = rows if picked is None else int(ids.size)
                outs = {}
                for kind in ("deq32", "deq8"):
                    dev.deq_kind = kind
                    full = cp.full((n, cols + 9), 3, dt)
                    for out in (full[:, :cols], full[:, 1 : cols + 1]):
                        dev.dequant(part, picked, n, out, cols + 9, f16)
                        outs[kind, out.data.ptr % 16] = out.get()
                ref = want32 if picked is None else want32[ids.get()]
                for got in outs.values():
                    assert got.tobytes() == outs["deq32", 0].tobytes()
                    np.testing.assert_array_equal(got, ref.astype(dt))
    finally:
        restore(dev)


def k_mins(raw: np.ndarray[Any, Any], rows: int, dtype: DType) -> np.ndarray[Any, Any] | None:
    """Each 32-weight group's min ``dmin * mn`` (rows, cols / 32) of Q4_K or Q5_K blocks
    (the weights ``dl * q - ml``); None for the types without a min."""
    size = {DType.Q4_K: 144, DType.Q5_K: 176}.get(dtype)
    if size is None:
        return None
    b = raw.reshape(rows, -1, size)
    dmin = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    sm = b[..., 4:16].astype(np.int32)
    hi = (sm[..., 8:12] >> 4) | ((sm[..., 4:8] >> 6) << 4)
    mn = np.concatenate([sm[..., 4:8] & 63, hi], axis=-1).astype(np.float32)
    return (dmin[..., None] * mn).reshape(rows, -1)


def q8_reference(
    dense: np.ndarray[Any, Any], x: np.ndarray[Any, Any], mins: np.ndarray[Any, Any] | None
) -> np.ndarray[Any, Any]:
    """dense @ x.T with x quantized as ``quant_q8`` does (groups of 32, scale amax / 127),
    and a min's share (Q4_K, Q5_K: ``mins``) taken with the float sum of x, as ``gemvq``."""
    g = x.reshape(x.shape[0], -1, 32)
    d = (np.abs(g).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    q = np.rint(np.divide(g, d, out=np.zeros_like(g), where=d > 0))
    xd = (q * d).astype(dense.dtype)  # float64 for the kernels' checks, float32 for models'
    out: np.ndarray[Any, Any] = xd.reshape(x.shape) @ dense.T
    if mins is not None:  # w = dl q - ml: the kernel's - ml sum(x) for the reference's - ml sum(xd)
        xs = xd.astype(np.float64).sum(axis=-1) - g.astype(np.float64).sum(axis=-1)
        out += (xs @ mins.T).astype(out.dtype)
    return out


@pytest.mark.parametrize("dtype", Q8_TYPES, ids=lambda d: d.name)
def test_int8_gemv_is_the_product_with_quantized_activations(be: Any, dtype: DType) -> None:
    """1..16 rows a pass and 40 rows as 3 passes (gemv_max 64), with and without warps
    splitting a row: within 1e-5 of the quantized product (sums in another order), and
    off the float product by the quantizing."""
    from modelc.runtime.backend import Weight
    from modelc.runtime.backends.numpy_ref import dequantize_weight

    rng = np.random.default_rng(11)
    dev = be.dev
    try:
        dev.gemv_kind, dev.exact = "q8", False
        for rows, cols in ((96, 512), (40, 2048), (300, 4096)):
            data, _ = random_blocks(rng, dtype, rows, cols, 0.05)
            w = Weight(dtype, (rows, cols), data)
            dense = dequantize_weight(w).astype(np.float64)
            mins = k_mins(data, rows, dtype)
            for gmax, split in ((64, True), (64, False), (16, True)):
                dev.gemv_max, dev.split_k = gmax, split
                for n in (1, 3, 16, 40):
                    x = rng.standard_normal((n, cols)).astype(np.float32)
                    got = be.matmul(w, x)
                    if n > gmax:  # past the GEMV rows: cuBLAS in f16, no int8 at all
                        assert rel(got, x @ dense.T) < 2e-3, (rows, n, gmax, split)
                        continue
                    assert rel(got, q8_reference(dense, x, mins)) < 1e-5, (rows, n, gmax, split)
                    assert 1e-5 < rel(got, x @ dense.T) < 3e-2, (rows, n, gmax, split)
    finally:
        restore(dev)


def q8_gpu(ir: Any, gemv_max: int | None = 256, kind: str = "q8") -> Any:
    """The model on the GPU's q8 path (``kind`` "wide": :mod:`.cuda_gemvw`'s); ``gemv_max``
    256: prompts too in int8 GEMV passes, not through f16 cuBLAS (None: the backend's own
    split)."""
    from modelc.runtime.backends.cuda_backend import CudaBackend
    from modelc.runtime.backends.cuda_llama import CudaLlama

    b = CudaBackend()
    b.dev.exact, b.dev.gemv_kind = False, kind
    model = CudaLlama(ir, b)
    if gemv_max is not None:
        b.dev.gemv_max = gemv_max
    return model


def q8_twin(ir: Any, f64: bool = False) -> Any:
    """The model on the numpy reference with every product of a Q4_0 / Q8_0 / Q4_K / Q5_K / Q6_K
    weight taking its activations quantized as the GPU's q8 path does
    (:func:`q8_reference`): the GPU's int8 arithmetic in float64-free numpy (``f64``: those
    products' sums in float64, the same quantizing)."""
    from modelc.runtime.arch import build
    from modelc.runtime.backends.numpy_ref import NumpyBackend

    class Q8Twin(NumpyBackend):
        def matmul(self, w: Any, x: Any, out: Any = None) -> Any:
            if w.dtype not in Q8_TYPES:
                return super().matmul(w, x, out)
            raw = np.asarray(w.data).view(np.uint8).reshape(w.shape[0], -1)
            mins = k_mins(raw, w.shape[0], w.dtype)
            x2 = np.asarray(x, np.float32).reshape(-1, w.shape[1])
            dense = self._dense(w)
            y = q8_reference(dense.astype(np.float64) if f64 else dense, x2, mins)
            if out is None:
                return y.astype(np.float32)
            out[...] = y
            return out

    return build(ir, Q8Twin())


def _apart(a: tuple[Any, list[int]], b: tuple[Any, list[int]]) -> tuple[float, bool]:
    top = np.argsort(a[0])[-10:]
    return float(np.max(np.abs(b[0][top] - a[0][top]))), a[1] == b[1]


def check_q8_model(ir: Any, prompt: list[int], n: int, twin: bool = True, kind: str = "q8") -> None:
    """The GPU's q8 path (``twin``: every product in int8 GEMV passes, prompts too) against
    its numpy twin, and from the CPU's exact mode no more than twice as far as the CPU's
    fast mode is (which quantizes to 8 bits too: K-quants in groups of 256, outliers kept
    apart).

    How close the twin can be held is the model's own: 8-bit rounding turns a last-place
    difference in an activation into a whole quantization step now and then, and a type
    with a min (Q4_K, Q5_K: ``dl * q - ml``, its two terms ~7x the weight) carries that
    step on undamped.  So the bound is the twin against itself with its products summed in
    float64 (on the random SMALL models, top-10: Q8_0 2e-7, Q4_0 4e-7, Q4_K 9e-3, Q5_K
    1.5e-2), four times over, or LOGPROB_TOL where that is smaller; greedy tokens are not
    asserted against the twin (Q4_0's twin parts from exact at a near tie itself)."""
    from tests.test_cuda import cpu_exact, greedy_run

    exact = greedy_run(cpu_exact(ir), prompt, n, "f32")
    try:
        gpu_model = q8_gpu(ir, kind=kind) if twin else q8_gpu(ir, gemv_max=None, kind=kind)
        gpu = greedy_run(gpu_model, prompt, n, "f32")
    finally:
        restore(device())
    if twin:
        tw = greedy_run(q8_twin(ir), prompt, n, "f32")
        spread, _ = _apart(tw, greedy_run(q8_twin(ir, f64=True), prompt, n, "f32"))
        err, _ = _apart(tw, gpu)
        assert err <= max(LOGPROB_TOL, 4 * spread), f"q8 GPU vs its twin {err:.2e} ({spread=:.2e})"
    gpu_err, _ = _apart(exact, gpu)
    fast_err, _ = _apart(exact, greedy_run(build_fast(ir), prompt, n, "f32"))
    assert gpu_err <= max(LOGPROB_TOL, 2 * fast_err), (gpu_err, fast_err)


def build_fast(ir: Any) -> Any:
    from modelc.runtime.arch import build

    return build(ir, make_backend("cpu"))


@pytest.mark.parametrize("dtype", [*Q8_TYPES, Q4_K_M], ids=str)
def test_small_models_on_the_int8_gemv(tmp_path: Path, dtype: DType | str) -> None:
    check_q8_model(
        load_model(write_random_llama(tmp_path / "m.gguf", dtype, SMALL, seed=3)),
        list(range(5, 40)),
        12,
    )


def test_1b_q4_k_m_on_the_int8_gemv() -> None:
    """The 1.1B Q4_K_M as served (the 64-token prompt through cuBLAS in f16, decode in
    int8 GEMV passes) against the CPU's exact and fast modes (an H100: top-10 2.1e-2 from
    exact, the fast mode 9.9e-2; with the prompt in int8 passes too, 0.20)."""
    d = os.environ.get("MODELC_CUDA_1B_DIR")
    path = Path(d or ".") / "llama1b-q4_k_m.gguf"
    if not d or not path.exists():
        pytest.skip("no 1B Q4_K_M: set MODELC_CUDA_1B_DIR (python -m tests.gen_cuda_models DIR)")
    check_q8_model(load_model(path), list(range(100, 164)), 6, twin=False)


def test_norm_and_quantizing_in_one_launch_equal_the_two(be: Any) -> None:
    """``norm_matmul`` on the q8 path (rms_norm_q8, then the GEMV of its quantized output)
    against rms_norm, then the product quantizing on its own: the same bits (Q4_K's
    within 1e-5: its group sums), for a stack of Q4_K, Q6_K and Q5_0 rows (a Q4_K_M QKV's mix, and a type the int8 GEMV leaves to
    gemv4); in exact mode the same call is rms_norm and the f32 product."""
    from modelc.runtime.backend import Weight

    cp, dev, rng = be.cp, be.dev, np.random.default_rng(12)
    cols = 1024
    ws = []
    for dtype, rows in ((DType.Q4_K, 64), (DType.Q6_K, 32), (DType.Q5_0, 32)):
        data, _ = random_blocks(rng, dtype, rows, cols, 0.05)
        ws.append(Weight(dtype, (rows, cols), data))
    w = dev.upload(ws)
    assert [p.code for p in w.parts] == [12, 14, 6]
    wn = cp.asarray(rng.uniform(0.5, 1.5, cols).astype(np.float32))
    try:
        for exact in (False, True):
            dev.gemv_kind, dev.exact = "q8", exact
            for n in (1, 5, 16):
                x = cp.asarray(rng.standard_normal((n, cols)).astype(np.float32) * 3)
                h1, h2 = cp.zeros((n, cols), np.float32), cp.zeros((n, cols), np.float32)
                y1, y2 = cp.zeros((n, w.rows), np.float32), cp.zeros((n, w.rows), np.float32)
                dev.rms_norm(x, None, n, wn, 1e-5, h1)
                dev.matmul(w, h1, n, y1)
                dev.norm_matmul(x, n, wn, 1e-5, h2, w, y2)
                assert h1.get().tobytes() == h2.get().tobytes()
                # Q4_K's min takes each group's sum, added in another order by the norm
                # (four values a lane) than by quant_q8 (one a lane); the rest bit for bit
                a, b = y1.get(), y2.get()
                assert a[:, 64:].tobytes() == b[:, 64:].tobytes(), (exact, n)
                np.testing.assert_allclose(b[:, :64], a[:, :64], rtol=1e-5, atol=1e-6)
    finally:
        restore(dev)


@pytest.mark.parametrize("gelu", [False, True], ids=["silu", "gelu"])
def test_activation_and_quantizing_in_one_launch_equal_the_two(be: Any, gelu: bool) -> None:
    """``act_mul(..., then=w_down)`` on the q8 path against act_mul, then the product
    quantizing on its own: the same activations and the same product, bit for bit; in
    exact mode (or for a weight the int8 GEMV leaves to gemv4) no quantizing at all."""
    from modelc.runtime.backend import Weight

    cp, dev, rng = be.cp, be.dev, np.random.default_rng(13)
    ff = 768
    try:
        for dtype, exact in ((DType.Q6_K, False), (DType.Q5_0, False), (DType.Q6_K, True)):
            data, _ = random_blocks(rng, dtype, 96, ff, 0.05)
            w = dev.upload([Weight(dtype, (96, ff), data)])
            dev.gemv_kind, dev.exact = "q8", exact
            for n in (1, 7):
                gu = cp.asarray(rng.standard_normal((n, 2 * ff)).astype(np.float32) * 2)
                g1, g2 = cp.zeros((n, ff), np.float32), cp.zeros((n, ff), np.float32)
                y1, y2 = cp.ones((n, 96), np.float32), cp.ones((n, 96), np.float32)
                assert dev.act_mul(gu, n, ff, g1, gelu) is None
                dev.matmul(w, g1, n, y1, acc=True)
                q8 = dev.act_mul(gu, n, ff, g2, gelu, then=w)
                assert (q8 is not None) == (dtype is DType.Q6_K and not exact)
                dev.matmul(w, g2, n, y2, acc=True, q8=q8)
                assert g1.get().tobytes() == g2.get().tobytes()
                assert y1.get().tobytes() == y2.get().tobytes(), (dtype, exact, n)
    finally:
        restore(dev)


@pytest.mark.parametrize("hd", [64, 128, 96])
def test_attention_quantizes_its_output_for_the_next_product(be: Any, hd: int) -> None:
    """``attention(..., then=w_o)`` on the q8 path: the same output bits as without, and
    the product from its quantized output equal to the product quantizing on its own (bit
    for bit for Q6_K; Q4_K's min takes the group's sum, added in another order); head size
    96 (three lanes' values straddle a group) quantizes apart."""
    from modelc.runtime.backend import Weight

    cp, dev, rng = be.cp, be.dev, np.random.default_rng(14)
    nq, nh, nkv, n_kv = 3, 8, 2, 20  # nh * hd a whole number of K-quant super-blocks
    q = cp.asarray(rng.standard_normal((nq, nh, hd)).astype(np.float32))
    kv = cp.asarray(rng.standard_normal((2, n_kv, nkv, hd)).astype(np.float16))
    host = np.zeros(2 * nq + 2, np.int64)
    host[:nq] = np.arange(n_kv - nq, n_kv)  # the last 3 positions, sequence 0
    host[2 * nq :] = (kv.data.ptr, n_kv)
    meta = cp.asarray(host)
    parts = (meta[:nq], meta[nq : 2 * nq], meta[2 * nq : 2 * nq + 1], meta[2 * nq + 1 :])
    try:
        for dtype in (DType.Q6_K, DType.Q4_K):
            data, _ = random_blocks(rng, dtype, 96, nh * hd, 0.05)
            w = dev.upload([Weight(dtype, (96, nh * hd), data)])
            dev.gemv_kind, dev.exact = "q8", False
            o1, o2 = cp.zeros((nq, nh * hd), np.float32), cp.zeros((nq, nh * hd), np.float32)
            y1, y2 = cp.ones((nq, 96), np.float32), cp.ones((nq, 96), np.float32)
            args = (parts, nq, nh, nkv, hd, True, 1 / np.sqrt(hd), 0, 0)
            assert dev.attention(q, *args, o1) is None
            dev.matmul(w, o1, nq, y1, acc=True)
            q8 = dev.attention(q, *args, o2, then=w)
            assert (q8 is not None) == (hd != 96)
            dev.matmul(w, o2, nq, y2, acc=True, q8=q8)
            assert o1.get().tobytes() == o2.get().tobytes()
            if dtype is DType.Q6_K:
                assert y1.get().tobytes() == y2.get().tobytes(), hd
            else:
                np.testing.assert_allclose(y2.get(), y1.get(), rtol=1e-5, atol=1e-6)
    finally:
        restore(dev)


def test_kept_f16_copies_give_the_same_products(be: Any) -> None:
    """``MODELC_CUDA_F16_CACHE=1``: a batch past the GEMV rows takes the f16 copy kept on
    the part (made by its first product) and gets the bits it got dequantizing each time."""
    from modelc.runtime.backend import Weight

    cp, dev, rng = be.cp, be.dev, np.random.default_rng(15)
    data, _ = random_blocks(rng, DType.Q4_K, 96, 512, 0.05)
    w = dev.upload([Weight(DType.Q4_K, (96, 512), data)])
    x = cp.asarray(rng.standard_normal((40, 512)).astype(np.float32))
    ys = [cp.zeros((40, 96), np.float32) for _ in range(3)]
    try:
        dev.exact, dev.gemv_max = False, 16
        dev.matmul(w, x, 40, ys[0])
        dev.f16_cache = True
        dev.matmul(w, x, 40, ys[1])
        kept = w.parts[0].dense16
        assert kept is not None and kept.dtype == np.float16
        dev.matmul(w, x, 40, ys[2])
        assert w.parts[0].dense16 is kept
        assert ys[0].get().tobytes() == ys[1].get().tobytes() == ys[2].get().tobytes()
    finally:
        dev.f16_cache = False
        restore(dev)


@pytest.mark.parametrize("d", [64, 2048, 5120, 16384, 96])
def test_register_norms_equal_numpy(be: Any, d: int) -> None:
    """``rms_norm_v4`` (rows read once into registers; 5,120 and 16,384 wide: several
    float4s a thread) and, on a view one float off 16-byte alignment, ``rms_norm``: both
    within 1e-6 of numpy's norm in double, gathered rows and ``acc`` included; the q8
    variant writes the same floats."""
    from modelc.runtime.backends.cuda_norm import threads

    cp, dev, rng = be.cp, be.dev, np.random.default_rng(15)
    n = 3
    x = rng.standard_normal((n, d)).astype(np.float32) * 2
    w = rng.uniform(0.5, 1.5, d).astype(np.float32)
    xd = x.astype(np.float64)
    ref = xd / np.sqrt((xd * xd).mean(axis=1, keepdims=True) + 1e-5) * w
    assert threads(d) is not None
    rows = cp.asarray(np.array([2, 0], np.int64))
    wide = cp.zeros((n, d + 1), np.float32)
    for xs, out, v4 in (
        (cp.asarray(x), cp.zeros((n, d), np.float32), True),
        (cp.asarray(x), wide[:, 1:], False),
    ):
        assert (dev._v4(xs, out, cp.asarray(w)) is not None) == v4
        dev.rms_norm(xs, None, n, cp.asarray(w), 1e-5, out)
        np.testing.assert_allclose(out.get(), ref, rtol=1e-6, atol=1e-6)
        acc = cp.ones((2, d), np.float32)
        dev.rms_norm(xs, rows, 2, cp.asarray(w), 1e-5, acc, acc=True)
        np.testing.assert_allclose(acc.get(), 1 + ref[[2, 0]], rtol=1e-6, atol=1e-6)
    h1, h2 = cp.zeros((n, d), np.float32), cp.zeros((n, d), np.float32)
    xq, xs_ = dev._q8_views(n, d)
    dev.rms_norm(cp.asarray(x), None, n, cp.asarray(w), 1e-5, h1)
    dev.fn["rms_norm_v4_q8"](
        (n,), (threads(d),),
        (cp.asarray(x), np.int32(d), cp.asarray(w), np.float32(1e-5), np.int32(d), h2,
         np.int32(d), xq, xs_),
    )  # fmt: skip
    assert h1.get().tobytes() == h2.get().tobytes()
    q = xq.get()[: n * d].view(np.int8).reshape(n, d // 32, 32).astype(np.float32)
    sc = xs_.get()[: n * d // 32 * 8].view(np.float32).reshape(n, d // 32, 2)
    g = h1.get().reshape(n, d // 32, 32)
    np.testing.assert_allclose(sc[..., 0], np.abs(g).max(axis=-1) / 127, rtol=1e-6)
    np.testing.assert_allclose(sc[..., 1], g.sum(axis=-1), rtol=1e-4, atol=1e-4)
    assert np.abs(q * sc[..., :1] - g).max() <= sc[..., 0].max() * 0.5 + 1e-6


def _attention_step(
    be: Any,
    rng: Any,
    chunks: list[tuple[int, int, int]],
    nh: int,
    nkv: int,
    hd: int,
    cap: int,
    dt: Any,
    rows: int,
) -> tuple[Any, Any, int, Any, list[int], list[Any]]:
    """A step's queries and attention meta over random caches, one a sequence: ``chunks``
    (sequence, first position, rows); returns q, (pos, seq, base, cap), the row count,
    the device tiles of ``rows``, their sizes and the caches (the meta holds only their
    addresses: the caller keeps them alive, or CuPy's pool hands their memory to the
    next arrays, the outputs among them)."""
    from modelc.runtime.backends.cuda_attn import tiles

    cp = be.cp
    caches = [cp.asarray(rng.standard_normal((2, cap, nkv, hd)).astype(dt)) for _ in chunks]
    pos = np.concatenate([np.arange(p, p + r) for _, p, r in chunks])
    seq = np.concatenate([np.full(r, s) for s, _, r in chunks])
    n = len(pos)
    host = np.concatenate([pos, seq, [c.data.ptr for c in caches], [cap] * len(chunks)])
    meta = cp.asarray(host.astype(np.int64))
    k = len(chunks)
    parts = (meta[:n], meta[n : 2 * n], meta[2 * n : 2 * n + k], meta[2 * n + k :])
    starts = np.cumsum([0] + [r for _, _, r in chunks])
    t = tiles([slice(int(a), int(b)) for a, b in pairwise(starts)], rows)
    q = cp.asarray(rng.standard_normal((n, nh, hd)).astype(np.float32))
    return q, parts, n, (cp.asarray(t.ravel()), len(t)), t[:, 1].tolist(), caches


@pytest.mark.parametrize("hd", [32, 64, 96, 128])
@pytest.mark.parametrize("f16", [True, False], ids=["f16", "f32"])
def test_tiled_prompt_attention_equals_a_block_a_row(be: Any, hd: int, f16: bool) -> None:
    """``attn_tile`` (:mod:`~modelc.runtime.backends.cuda_attn`: a tile of rows a block,
    keys read once into shared memory) against ``attend`` (a block a row and head), with
    GQA, on a step mixing a 37-row prompt chunk (three tiles, at positions 20..56), a
    decode row (at 70) and a 3-row chunk (0..2), causal, in a sliding window of 5, with
    soft-capped scores and with sinks: within 1e-5."""
    from modelc.runtime.backends.cuda_attn import ROWS

    cp, dev, nh, nkv = be.cp, be.dev, 4, 2
    dt = np.float16 if f16 else np.float32
    chunks = [(0, 20, 37), (1, 70, 1), (2, 0, 3)]  # (sequence, first position, rows)
    step = _attention_step(be, np.random.default_rng(16), chunks, nh, nkv, hd, 80, dt, ROWS)
    q, parts, n, tiles, sizes, _caches = step
    assert sizes == [16, 16, 5, 1, 3]
    dev.attn_mma = False  # the float tiles (an f16 cache takes the tensor cores' by default)
    sinks = cp.asarray(np.random.default_rng(18).standard_normal(nh).astype(np.float32) * 3)
    try:  # gpt-oss's sinks too: a logit a head in the softmax's denominator
        for window, softcap, sk in ((0, 0.0, None), (5, 0.0, None), (0, 30.0, None), (0, 0.0, sinks), (5, 0.0, sinks)):  # fmt: skip
            a, b = cp.zeros((n, nh * hd), np.float32), cp.zeros((n, nh * hd), np.float32)
            args = (parts, n, nh, nkv, hd, f16, 1 / np.sqrt(hd), window, 0)
            dev.attention(q, *args, a, softcap, sinks=sk)
            assert dev.attention(q, *args, b, softcap, tiles=tiles, sinks=sk) is None
            np.testing.assert_allclose(b.get(), a.get(), rtol=1e-5, atol=1e-5)
            if sk is not None:  # the case is not moot
                dev.attention(q, *args, b, softcap, tiles=tiles)
                assert float(np.abs(b.get() - a.get()).max()) > 1e-3
    finally:
        restore(dev)


@pytest.mark.parametrize("hd", [32, 64, 96, 128])
def test_prompt_attention_on_tensor_cores(be: Any, hd: int) -> None:
    """``attn_mma`` (:mod:`~modelc.runtime.backends.cuda_attn`: tiles of 64 rows, scores and
    values on tensor cores, f16 queries and probabilities) against ``attend`` (a block a
    row and head, in floats) over an f16 cache, with GQA, on a step mixing a 100-row prompt
    chunk at positions 20..119 (tiles of 64 and 36), a decode row and a 3-row chunk, causal,
    in a sliding window of 5 and of 40, and with soft-capped scores.  The bound is what
    rounding the queries and the probabilities to f16 moves (an f16 value's relative step,
    2^-11, a few times over on outputs of size ~1): 4e-3, where the float tiles are within
    1e-5 (an H100: 5e-4 to 1.1e-3); its own spread is printed."""
    from modelc.runtime.backends.cuda_attn import MMA_ROWS

    cp, dev, nh, nkv = be.cp, be.dev, 8, 2
    dev.attn_mma = True  # as served (exact mode keeps the float tiles)
    assert dev.tile_rows(True) == MMA_ROWS and dev.tile_rows(False) < MMA_ROWS
    chunks = [(0, 20, 100), (1, 70, 1), (2, 0, 3)]
    rng = np.random.default_rng(17)
    q, parts, n, tiles, sizes, _caches = _attention_step(
        be, rng, chunks, nh, nkv, hd, 130, np.float16, MMA_ROWS
    )
    assert sizes == [64, 36, 1, 3]
    sinks = cp.asarray(rng.standard_normal(nh).astype(np.float32) * 3)  # gpt-oss's
    for window, softcap, sk in ((0, 0.0, None), (5, 0.0, None), (40, 0.0, None), (0, 30.0, None), (0, 0.0, sinks), (40, 0.0, sinks)):  # fmt: skip
        a, b = cp.zeros((n, nh * hd), np.float32), cp.zeros((n, nh * hd), np.float32)
        args = (parts, n, nh, nkv, hd, True, 1 / np.sqrt(hd), window, 0)
        dev.attention(q, *args, a, softcap, sinks=sk)
        assert dev.attention(q, *args, b, softcap, tiles=tiles, sinks=sk) is None
        err = float(np.abs(b.get() - a.get()).max())
        print(f"hd {hd} window {window} softcap {softcap} sinks {sk is not None}: {err:.2e}")
        assert np.isfinite(b.get()).all() and err < 4e-3, err
    restore(dev)


WIDE_TYPES = [DType.Q4_0, DType.Q4_K, DType.Q6_K]


@pytest.mark.parametrize("dtype", WIDE_TYPES, ids=lambda d: d.name)
def test_wide_gemv_equals_the_int8_gemv(be: Any, dtype: DType) -> None:
    """``MODELC_CUDA_GEMV=wide`` (:mod:`~modelc.runtime.backends.cuda_gemvw`: 16-byte loads,
    Q4_0 and Q6_K repacked at upload) against gemvq over the GGUF blocks, the same int8
    arithmetic: within 1e-5 for 1..16 rows of x (8-row launches past 8), odd weight rows,
    a 4096 x 14336 down projection, with and without warps splitting a row, ``acc`` on and
    off.  A repacked part also gives the native part's bits through ``deq8w`` (picked rows,
    a batch past the GEMV rows on cuBLAS) and, in exact mode, its float product."""
    from modelc.runtime.backend import Weight

    cp, dev, rng = be.cp, be.dev, np.random.default_rng(21)
    try:
        dev.exact, dev.gemv_max = False, 16
        for rows, cols in ((37, 512), (300, 4096), (4096, 14336)):
            data, _ = random_blocks(rng, dtype, rows, cols, 0.05)
            w = Weight(dtype, (rows, cols), data)
            dev.gemv_kind = "q8"
            native = dev.upload([w])
            dev.gemv_kind = "wide"
            wide = dev.upload([w])
            assert wide.parts[0].layout == "wide"  # Q4_0, Q4_K, Q6_K repacked
            for n in (1, 2, 3, 4, 5, 8, 11, 16):
                x = cp.asarray(rng.standard_normal((n, cols)).astype(np.float32))
                base = cp.asarray(rng.standard_normal((n, rows)).astype(np.float32))
                for acc in (False, True):
                    for split in (True, False):
                        dev.split_k = split
                        y0, y1 = base.copy(), base.copy()
                        dev.gemv_kind = "q8"
                        dev.matmul(native, x, n, y0, acc)
                        dev.gemv_kind = "wide"
                        dev.matmul(wide, x, n, y1, acc)
                        assert rel(y1.get(), y0.get()) < 1e-5, (rows, cols, n, acc, split)
            ids = cp.asarray(np.array([rows - 1, 0, 5, 5], np.int64))
            for f16, dt in ((False, np.float32), (True, np.float16)):
                a, b = cp.zeros((4, cols), dt), cp.zeros((4, cols), dt)
                dev.dequant(native.parts[0], ids, 4, a, cols, f16)
                dev.dequant(wide.parts[0], ids, 4, b, cols, f16)
                assert a.get().tobytes() == b.get().tobytes()
            if rows > 1000:
                continue
            x = cp.asarray(rng.standard_normal((20, cols)).astype(np.float32))
            for exact, n in ((False, 20), (True, 3)):  # cuBLAS f16, and exact mode's floats
                dev.exact = exact
                y0, y1 = cp.zeros((n, rows), np.float32), cp.zeros((n, rows), np.float32)
                dev.matmul(native, x, n, y0)
                dev.matmul(wide, x, n, y1)
                assert rel(y1.get(), y0.get()) < (1e-6 if exact else 1e-3), (exact, n)
            dev.exact = False
    finally:
        restore(dev)


@pytest.mark.parametrize("dtype", [DType.Q4_0, Q4_K_M], ids=str)
def test_small_models_on_the_wide_gemv(tmp_path: Path, dtype: DType | str) -> None:
    """A model with its products on the wide GEMV (Q4_K_M: Q4_K as stored, Q6_K
    repacked), prompts too: held to its numpy twin and the CPU's exact mode as q8 is."""
    check_q8_model(
        load_model(write_random_llama(tmp_path / "m.gguf", dtype, SMALL, seed=3)),
        list(range(5, 40)),
        12,
        kind="wide",
    )


@pytest.mark.parametrize(
    ("bucket", "first", "fixed"),
    [(8, False, False), (32, False, False), (8, True, False), (8, False, True)],
)
def test_mixed_steps_replay_graphs_of_their_bucket(
    tmp_path: Path, bucket: int, first: bool, fixed: bool
) -> None:
    """A step of 6 decoding sequences and a new 7-token prompt (13 rows, 7 logit rows) runs
    as its bucket (:func:`~modelc.runtime.backends.cuda_step.run_shape`: 16 rows, its tiles
    padded with the padding row's; ``MODELC_CUDA_MIXED_BUCKET=32``: 32 rows, 32 logit rows):
    eagerly the first time that shape comes, captured the second, replayed the third; each
    step's logits as the unpadded eager step's (cuBLAS over the padded rows against 13:
    within 1e-4), greedy tokens equal; ``MODELC_CUDA_CAPTURE_FIRST=1``, once a cuBLAS step
    has been captured (``warm``'s 16-row bucket): each captured the first time it comes, the
    prefill's shape too, and no step eager; ``MODELC_CUDA_MIXED_KEY=rows``: 72 logit rows
    and tiles (run_shape's fixed), the same logits within 1e-2 (the head on cuBLAS)."""
    from modelc.runtime.backends.cuda_step import GRAPH_BUCKET, run_shape
    from modelc.runtime.model import SeqChunk

    ir = load_model(write_random_llama(tmp_path / "m.gguf", DType.Q4_0, SMALL, seed=5))
    rng = np.random.default_rng(10)
    prompts = [rng.integers(3, 500, int(rng.integers(3, 9))).tolist() for _ in range(6)]
    news = [rng.integers(3, 500, 7).tolist() for _ in range(3)]
    runs = []
    for pad in (False, True):
        model = q8_gpu(ir, gemv_max=None)
        model.pad_graphs, model.mixed_rows = pad, 256 if pad else 0
        model.mixed_bucket, model.capture_first, model.mixed_fixed = bucket, first, fixed
        if pad and first:
            model.warm(16, "f16")
        steps0, warmed = dict(model.graph_steps), set(model._graphs)
        caches = [model.new_cache("f16", max_tokens=32) for _ in prompts]
        logits = model.forward([SeqChunk(c, p) for c, p in zip(caches, prompts, strict=True)])
        last, out = np.argmax(logits, axis=1), []
        for new in news:
            fresh = model.new_cache("f16", max_tokens=32)
            batch = [SeqChunk(c, [int(t)]) for c, t in zip(caches, last, strict=True)]
            logits = model.forward([*batch, SeqChunk(fresh, new)])
            assert logits.shape == (7, SMALL.n_vocab)
            out.append(logits)
            last = np.argmax(logits[:6], axis=1)
            fresh.free()
        keys = [k for k in model._graphs if k not in warmed]  # the steps with prompt chunks
        if pad:  # the prefill's shape came once: not captured (unless at once)
            want = (run_shape(13, 7, 0, False, 256, bucket, fixed) or (0, 0, 0))[:2]
            assert len(keys) == 1 + first and keys[-1][:2] == want and want[0] in (16, 32), keys
            done = {k: model.graph_steps[k] - steps0.get(k, 0) for k in ("captured", "eager")}
            assert done == ({"captured": 2, "eager": 0} if first else {"captured": 1, "eager": 2})
        else:
            assert not keys, keys
        runs.append(np.stack(out))
        for c in caches:
            c.free()
    # cuBLAS's kernels for 32 rows sum otherwise than for 13 (4.0e-3 on an H100; 1e-4 with
    # every product on the GEMV, MODELC_CUDA_GEMV_MAX=64); 16 rows as 13; the fixed key's
    # 72 logit rows take the head to cuBLAS where 7 take the GEMV (4.0e-3 on an H100 too)
    assert rel(runs[1], runs[0]) < (1e-4 if bucket <= GRAPH_BUCKET and not fixed else 1e-2)
    assert (runs[1].argmax(axis=-1) == runs[0].argmax(axis=-1)).all()


def test_decode_steps_padded_to_graph_buckets(tmp_path: Path) -> None:
    """``MODELC_CUDA_GRAPH_BUCKETS=1`` (:func:`~modelc.runtime.backends.cuda_llama.graph_rows`):
    11 sequences' decode steps run as graphs of 16 rows, the 5 padding rows on the scratch
    cache; the 11 rows' logits and greedy tokens as the unpadded steps' (cuBLAS over 16 rows
    against 11: within 1e-4), the graph keyed by 16, and :meth:`CudaLlama.warm` captures every
    bucket up to 20 sequences (1..8, 16, 24) at once."""
    from modelc.runtime.backends.cuda_step import graph_rows
    from modelc.runtime.model import SeqChunk

    ir = load_model(write_random_llama(tmp_path / "m.gguf", DType.Q4_0, SMALL, seed=5))
    rng = np.random.default_rng(9)
    prompts = [rng.integers(3, 500, int(rng.integers(3, 9))).tolist() for _ in range(11)]
    runs = []
    for pad in (False, True):
        model = q8_gpu(ir, gemv_max=None)
        model.pad_graphs = pad
        caches = [model.new_cache("f16", max_tokens=32) for _ in prompts]
        logits = model.forward([SeqChunk(c, p) for c, p in zip(caches, prompts, strict=True)])
        out, last = [], np.argmax(logits, axis=1)
        for _ in range(4):  # the second step of a cuBLAS size is its capture
            logits = model.forward(
                [SeqChunk(c, [int(t)]) for c, t in zip(caches, last, strict=True)]
            )
            out.append(logits)
            last = np.argmax(logits, axis=1)
        assert logits.shape == (11, SMALL.n_vocab)
        keys = sorted(k[0] for k in model._graphs)
        assert keys == ([graph_rows(11)] if pad else [11]), keys
        runs.append(np.stack(out))
        if pad:
            model._graphs.clear()
            model.warm(20, "f16")
            assert sorted(k[0] for k in model._graphs) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 24]
        for c in caches:
            c.free()
    assert rel(runs[1], runs[0]) < 1e-4
    assert (runs[1].argmax(axis=-1) == runs[0].argmax(axis=-1)).all()
    restore(device())
