"""gpt-oss's kernels on its real shapes: MXFP4 weights repacked 8 rows to a group (the
VNNI / AVX2 GEMM, mc_gemm_vnni.h, and the zmm pairs of groups, mc_gemm_zmm41.h) against
the row kernels on the weights as stored and the numpy reference; attention with a sink
logit per head (mc_ops.h's mc_att_inv in every attention kernel) against numpy's and a
known answer.  About 10 s."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from modelc.formats.ir import DType
from modelc.runtime.backend import Weight
from modelc.runtime.backends.cpu import SIMD_LEVELS, CpuBackend, available_simd
from tests.test_kernels import REF, quantized_activations, rel_err

D = 2880  # gpt-oss-20b's width and expert width: every expert matrix is D x D
N_HEAD, N_HEAD_KV, HD, WINDOW = 64, 8, 64, 128  # its attention: every other layer windowed
REPACK_LEVELS = [s for s in ("avx512vnni", "avx2") if s in available_simd()]
needs_repack = pytest.mark.skipif(not REPACK_LEVELS, reason="the repacked kernels need AVX2")


def mxfp4_rows(
    rows: int, cols: int, scales: np.ndarray[Any, Any], rng: np.random.Generator
) -> np.ndarray[Any, Any]:
    """(rows, cols / 32 * 17) MXFP4 blocks: random nibbles, the E8M0 bytes ``scales``
    (broadcast to (rows, cols / 32))."""
    blocks = rng.integers(0, 256, (rows, cols // 32, 17), dtype=np.uint8)
    blocks[:, :, 0] = np.broadcast_to(scales, (rows, cols // 32))
    return np.ascontiguousarray(blocks.reshape(rows, -1))


def stored_and_repacked(
    raw: np.ndarray[Any, Any], K: int, x: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], dict[str, np.ndarray[Any, Any]]]:
    """The scalar row kernel's x @ W^T one x row at a time, and the repacked kernels' per
    SIMD level (2 threads, all rows at once)."""
    from modelc._kernels import kernels as kk

    n, M = x.shape[0], raw.shape[0]
    aux = kk.repack(kk.MXFP4, raw, K)
    want = np.empty((n, M), np.float32)
    for i in range(n):
        kk.matmul(
            kk.MXFP4, raw, K, x[i : i + 1], want[i : i + 1], SIMD_LEVELS["scalar"], 1, 1e38, None
        )
    got: dict[str, np.ndarray[Any, Any]] = {}
    for level in REPACK_LEVELS:
        out = np.empty((n, M), np.float32)
        kk.matmul(kk.MXFP4, raw, K, x, out, SIMD_LEVELS[level], 2, 1e38, aux)
        got[level] = out
    return want, got


@needs_repack
@pytest.mark.parametrize("n", [1, 4, 8, 13, 32])
def test_repacked_mxfp4_on_gptoss_shapes(n: int) -> None:
    """A 2880 x 2880 expert matrix (90 blocks a row, 360 groups of 8 rows: pairs of groups
    on zmm) against 1 (decode), a few (an expert's share of a batch) and 32 (prefill) x
    rows: every repacked path equals the scalar row kernel bit for bit, and numpy's
    product of the dequantized weights and quantized activations."""
    rng = np.random.default_rng(34)
    scales = rng.integers(118, 128, (D, D // 32), dtype=np.uint8)  # gpt-oss's range
    raw = mxfp4_rows(D, D, scales, rng)
    x = rng.standard_normal((n, D)).astype(np.float32)
    want, got = stored_and_repacked(raw, D, x)
    for level, out in got.items():
        np.testing.assert_array_equal(out, want, err_msg=f"{level}, {n} x rows")
    ref = REF.matmul(Weight(DType.MXFP4, (D, D), raw), quantized_activations(x, DType.MXFP4))
    assert rel_err(want, ref) <= 1e-5


@needs_repack
def test_repacked_mxfp4_every_scale_byte() -> None:
    """Every E8M0 byte (0 and 1 below float's normal range, 254 and 255 near its top) in
    every lane of a group: the vector conversions of the repacked kernels give the scalar
    kernel's 2^(e - 128), so the results agree bit for bit (overflows to inf included)."""
    rng = np.random.default_rng(35)
    rows, K = 24, 32 * 256  # 3 groups: a zmm pair and a lone group
    scales = (np.arange(K // 32)[None, :] + 37 * np.arange(rows)[:, None]) % 256
    raw = mxfp4_rows(rows, K, scales.astype(np.uint8), rng)
    x = (rng.standard_normal((9, K)) * 1e-3).astype(np.float32)
    want, got = stored_and_repacked(raw, K, x)
    assert np.isinf(want).any() or np.abs(want).max() > 1e30  # the top scales were met
    for level, out in got.items():
        np.testing.assert_array_equal(out, want, err_msg=level)


def sink_answer(
    q: np.ndarray[Any, Any],
    k: np.ndarray[Any, Any],
    v: np.ndarray[Any, Any],
    q_pos0: int,
    scale: float,
    window: int,
    sinks: np.ndarray[Any, Any],
) -> np.ndarray[Any, Any]:
    """The known answer in float64: plain attention times sigmoid(lse - sink) per query and
    head (transformers' eager GptOssAttention: the sink a softmax column then dropped)."""
    n_q, g = q.shape[0], N_HEAD // N_HEAD_KV
    kk, vv = np.repeat(k.astype(np.float64), g, axis=1), np.repeat(v.astype(np.float64), g, axis=1)
    s = np.einsum("qhd,khd->hqk", q.astype(np.float64), kk) * scale  # (head, n_q, n_kv)
    qpos, kpos = q_pos0 + np.arange(n_q)[:, None], np.arange(k.shape[0])[None, :]
    seen = (kpos <= qpos) & ((kpos > qpos - window) if window else True)
    s = np.where(seen, s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    e = np.exp(s - top)
    lse = top[..., 0] + np.log(e.sum(axis=-1))  # (head, n_q)
    plain = np.einsum("hqk,khd->qhd", e / e.sum(axis=-1, keepdims=True), vv)
    factor = 1.0 / (1.0 + np.exp(sinks[:, None] - lse))  # (head, n_q)
    return plain * factor.T[..., None]


@pytest.mark.parametrize("simd", available_simd())
@pytest.mark.parametrize("kv", [np.float32, np.float16])
def test_attention_sinks_on_gptoss_heads(simd: str, kv: type) -> None:
    """64 query heads over 8 KV heads of 64, full and windowed (128) layers, decode rows and
    prefill tiles, sinks from far below to far above the scores (the sink then the
    softmax's max): every kernel (portable, f16, AVX2 and zmm tiles) matches numpy's
    attention with the sink as a softmax column, and both the float64 known answer."""
    rng = np.random.default_rng(36)
    cpu = CpuBackend(simd=simd, threads=2)
    scale = 1.0 / np.sqrt(HD)
    sinks = rng.uniform(-4.0, 4.0, N_HEAD).astype(np.float32)
    sinks[:4] = (-60.0, 60.0, 0.0, -np.inf)  # no weight, all the weight, even, none at all
    for n_q, q_pos0, window in [
        (1, 0, 0),
        (1, 299, 0),
        (1, 299, WINDOW),
        (70, 0, WINDOW),
        (33, 200, 0),
    ]:
        n_kv = q_pos0 + n_q
        q = rng.standard_normal((n_q, N_HEAD, HD)).astype(np.float32)
        k = rng.standard_normal((n_kv, N_HEAD_KV, HD)).astype(kv)
        v = rng.standard_normal((n_kv, N_HEAD_KV, HD)).astype(kv)
        args = (q, k, v, q_pos0, scale)
        want = REF.attention(*args, window=window, sinks=sinks)
        got = cpu.attention(*args, window=window, sinks=sinks)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{n_q} from {q_pos0}")
        known = sink_answer(q, k, v, q_pos0, scale, window, sinks)
        np.testing.assert_allclose(want, known, rtol=1e-4, atol=1e-6)
        assert np.abs(got[:, 1]).max() < 1e-20  # the sink took (nearly) every weight
        np.testing.assert_array_equal(  # a sink of -inf is no sink
            got[:, 3], cpu.attention(*args, window=window)[:, 3]
        )


def test_attention_sinks_batch_and_append_equal_per_sequence() -> None:
    """Sinks through attention_batch and attention_append (the decoder's path: a decode step
    of sequences of different lengths, one of them prefilling) give each sequence's own
    attention, bit for bit."""
    rng = np.random.default_rng(37)
    cpu = CpuBackend(threads=2)
    scale = 1.0 / np.sqrt(HD)
    sinks = rng.uniform(-2.0, 2.0, N_HEAD).astype(np.float32)
    starts, counts = [40, 0, 7], [1, 9, 1]
    stores = [np.zeros((64, N_HEAD_KV, HD), np.float32) for _ in range(6)]
    for st, n in zip(
        stores[::2], [s + c for s, c in zip(starts, counts, strict=True)], strict=True
    ):
        st[:n] = rng.standard_normal((n, N_HEAD_KV, HD))
    for st, n in zip(
        stores[1::2], [s + c for s, c in zip(starts, counts, strict=True)], strict=True
    ):
        st[:n] = rng.standard_normal((n, N_HEAD_KV, HD))
    rows = sum(counts)
    q = rng.standard_normal((rows, N_HEAD, HD)).astype(np.float32)
    k_new = np.concatenate(
        [stores[2 * i][s : s + c] for i, (s, c) in enumerate(zip(starts, counts, strict=True))]
    )
    v_new = np.concatenate(
        [stores[2 * i + 1][s : s + c] for i, (s, c) in enumerate(zip(starts, counts, strict=True))]
    )
    out = np.empty_like(q)
    cpu.attention_append(
        q,
        k_new,
        v_new,
        stores[::2],
        stores[1::2],
        starts,
        counts,
        scale,
        out,
        window=WINDOW,
        sinks=sinks,
    )
    qs, ks, vs = [], [], []
    r = 0
    for i, (s, c) in enumerate(zip(starts, counts, strict=True)):
        qs.append(np.ascontiguousarray(q[r : r + c]))
        ks.append(stores[2 * i][: s + c])
        vs.append(stores[2 * i + 1][: s + c])
        one = cpu.attention(qs[-1], ks[-1], vs[-1], s, scale, window=WINDOW, sinks=sinks)
        np.testing.assert_array_equal(out[r : r + c], one, err_msg=f"sequence {i}")
        r += c
    batch = cpu.attention_batch(qs, ks, vs, starts, scale, window=WINDOW, sinks=sinks)
    np.testing.assert_array_equal(np.concatenate(batch), out)
    with pytest.raises(ValueError, match="sinks for"):
        cpu.attention(qs[0], ks[0], vs[0], starts[0], scale, sinks=sinks[:8])
