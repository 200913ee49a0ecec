"""The recurrent layers' C kernels (``cyx/mc_recur.h``) against their numpy twins.

``causal_conv1d``, ``delta_scan`` (Gated DeltaNet) and ``ssm_scan`` (Mamba-2) on random
inputs of the released models' shapes: equal to the numpy reference to f32 rounding (the
element steps are the same; only the sums over a head's rows run in another order), on
every SIMD path the CPU has.  And what the engine relies on, bit for bit: one thread equals
several, every SIMD path gives the same bits (the scans; the convolution's silu takes a
vectorised exp on AVX2), and a sequence's tokens split into several calls (at checkpoints)
equal one call.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from modelc.runtime.backends.cpu import CpuBackend, available_simd
from modelc.runtime.backends.numpy_ref import NumpyBackend
from modelc.runtime.seq_state import SeqState

REF = NumpyBackend()
TOKENS = (1, 5, 40)  # a decode step, a draft being verified, a prefill

# (key heads, value heads, d_k, d_v): Qwen3.5-9B / Qwen3-Next's, Qwen3.5-27B's, the tiny's
DELTA_SHAPES = [(16, 32, 128, 128), (16, 48, 128, 128), (2, 4, 16, 16)]
# (heads, head size, state): Granite 4.0-H-Tiny's, the tiny's
SSM_SHAPES = [(48, 64, 128), (8, 16, 16)]
# (channels, width): Qwen3.5-9B's convolution, Granite 4.0-H-Tiny's, LFM2-1.2B's
CONV_SHAPES = [(8192, 4), (3328, 4), (2048, 3)]


def close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> bool:
    """Equal to f32 rounding: every element within 1e-5 of the largest."""
    scale = max(float(np.abs(want).max()), 1e-30)
    return float(np.abs(got.astype(np.float64) - want).max()) <= 1e-5 * scale


def _l2(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    out: np.ndarray[Any, Any] = x / np.sqrt((x * x).sum(-1, keepdims=True) + np.float32(1e-6))
    return out.astype(np.float32)


def delta_inputs(m: int, nv: int, dk: int, dv: int, seed: int) -> tuple[np.ndarray[Any, Any], ...]:
    """q, k, v, beta, decay and a state, as a Gated DeltaNet layer makes them."""
    rng = np.random.default_rng(seed)
    f = np.float32
    q = _l2(rng.standard_normal((m, nv, dk)).astype(f)) / f(np.sqrt(dk))
    k = _l2(rng.standard_normal((m, nv, dk)).astype(f))
    v = rng.standard_normal((m, nv, dv)).astype(f)
    beta = rng.uniform(0.05, 0.95, (m, nv)).astype(f)
    decay = rng.uniform(0.5, 1.0, (m, nv)).astype(f)
    s = (0.3 * rng.standard_normal((nv, dk, dv))).astype(f)
    return q, k, v, beta, decay, s


def ssm_inputs(m: int, nh: int, p: int, n: int, seed: int) -> tuple[np.ndarray[Any, Any], ...]:
    """x, B, C, dt, decay, D and a state, as a Mamba-2 layer makes them."""
    rng = np.random.default_rng(seed)
    f = np.float32
    x = rng.standard_normal((m, nh, p)).astype(f)
    b = rng.standard_normal((m, 1, n)).astype(f)[:, [0] * nh]  # one group: every head's
    c = rng.standard_normal((m, 1, n)).astype(f)[:, [0] * nh]
    dt = rng.uniform(0.001, 0.5, (m, nh)).astype(f)
    decay = np.exp(dt * -rng.uniform(0.5, 8.0, nh).astype(f)).astype(f)
    d_skip = rng.standard_normal(nh).astype(f)
    s = (0.3 * rng.standard_normal((nh, p, n))).astype(f)
    return x, b, c, dt, decay, d_skip, s


@pytest.mark.parametrize("simd", available_simd())
@pytest.mark.parametrize("shape", CONV_SHAPES, ids=str)
@pytest.mark.parametrize("m", TOKENS)
def test_causal_conv1d(simd: str, shape: tuple[int, int], m: int) -> None:
    ch, w = shape
    rng = np.random.default_rng(ch + m)
    x = rng.standard_normal((w - 1 + m, ch)).astype(np.float32)
    k = (0.4 * rng.standard_normal((ch, w))).astype(np.float32)
    bias = rng.standard_normal(ch).astype(np.float32)
    cpu = CpuBackend(simd=simd, threads=3)
    for b, silu in ((None, False), (None, True), (bias, True)):
        got, want = cpu.causal_conv1d(x, k, b, silu), REF.causal_conv1d(x, k, b, silu)
        assert got.shape == (m, ch)
        if not silu:  # the same products summed in the same order
            assert np.array_equal(got, want)
        assert close(got, want)


@pytest.mark.parametrize("simd", available_simd())
@pytest.mark.parametrize("shape", DELTA_SHAPES, ids=str)
@pytest.mark.parametrize("m", TOKENS)
def test_delta_scan(simd: str, shape: tuple[int, int, int, int], m: int) -> None:
    _, nv, dk, dv = shape
    q, k, v, beta, decay, s = delta_inputs(m, nv, dk, dv, seed=nv + m)
    s_ref, out_ref = s.copy(), np.empty((m, nv, dv), np.float32)
    REF.delta_scan(q, k, v, beta, decay, s_ref, out_ref)
    s_got, out_got = s.copy(), np.empty((m, nv, dv), np.float32)
    CpuBackend(simd=simd, threads=3).delta_scan(q, k, v, beta, decay, s_got, out_got)
    assert close(out_got, out_ref) and close(s_got, s_ref)


@pytest.mark.parametrize("simd", available_simd())
@pytest.mark.parametrize("shape", SSM_SHAPES, ids=str)
@pytest.mark.parametrize("m", TOKENS)
def test_ssm_scan(simd: str, shape: tuple[int, int, int], m: int) -> None:
    nh, p, n = shape
    x, b, c, dt, decay, d_skip, s = ssm_inputs(m, nh, p, n, seed=nh + m)
    s_ref, out_ref = s.copy(), np.empty((m, nh, p), np.float32)
    REF.ssm_scan(x, b, c, dt, decay, d_skip, s_ref, out_ref)
    s_got, out_got = s.copy(), np.empty((m, nh, p), np.float32)
    CpuBackend(simd=simd, threads=3).ssm_scan(x, b, c, dt, decay, d_skip, s_got, out_got)
    assert close(out_got, out_ref) and close(s_got, s_ref)


def _delta_runs(cpu: CpuBackend, splits: list[int]) -> tuple[np.ndarray[Any, Any], ...]:
    """Qwen3.5-9B's layer over 24 tokens in calls ending at ``splits``: (out, state)."""
    q, k, v, beta, decay, s = delta_inputs(24, 32, 128, 128, seed=7)
    out = np.empty((24, 32, 128), np.float32)
    t0 = 0
    for t1 in [*splits, 24]:
        sl = slice(t0, t1)
        cpu.delta_scan(q[sl], k[sl], v[sl], beta[sl], decay[sl], s, out[sl])
        t0 = t1
    return out, s


def _ssm_runs(cpu: CpuBackend, splits: list[int]) -> tuple[np.ndarray[Any, Any], ...]:
    """Granite 4.0-H-Tiny's layer over 24 tokens in calls ending at ``splits``."""
    x, b, c, dt, decay, d_skip, s = ssm_inputs(24, 48, 64, 128, seed=8)
    out = np.empty((24, 48, 64), np.float32)
    t0 = 0
    for t1 in [*splits, 24]:
        sl = slice(t0, t1)
        cpu.ssm_scan(x[sl], b[sl], c[sl], dt[sl], decay[sl], d_skip, s, out[sl])
        t0 = t1
    return out, s


@pytest.mark.parametrize("runs", [_delta_runs, _ssm_runs], ids=["delta", "ssm"])
def test_scans_are_bit_identical_however_run(runs: Any) -> None:
    """One thread or several, any SIMD path, one call or a call per checkpoint piece: the
    same bits (batched equals alone, a prefix-cache hit equals a cold prefill)."""
    base = runs(CpuBackend(simd="scalar", threads=1), [])
    for simd in available_simd():
        for threads, splits in ((1, []), (3, []), (3, [1, 2, 10, 23]), (2, [16])):
            got = runs(CpuBackend(simd=simd, threads=threads), splits)
            for a, b in zip(got, base, strict=True):
                assert np.array_equal(a, b), (simd, threads, splits)


def test_conv_is_bit_identical_however_run() -> None:
    """One thread or several, all rows at once or a row a call (decode steps): the same bits
    on each SIMD path (their silu's exp differs by an ulp or two)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3 + 70, 8192)).astype(np.float32)
    k = rng.standard_normal((8192, 4)).astype(np.float32)
    bias = rng.standard_normal(8192).astype(np.float32)
    for simd in available_simd():
        base = CpuBackend(simd=simd, threads=1).causal_conv1d(x, k, bias, True)
        got = CpuBackend(simd=simd, threads=3).causal_conv1d(x, k, bias, True)
        assert np.array_equal(got, base), simd
        one = CpuBackend(simd=simd, threads=3)
        rows = [one.causal_conv1d(x[t : t + 4], k, bias, True) for t in range(70)]
        assert np.array_equal(np.concatenate(rows), base), simd


@pytest.mark.parametrize("boundary", [0, 1, 4, 7])
def test_save_points_are_where_the_state_saves(boundary: int) -> None:
    """The pieces a scan runs in end exactly where :meth:`SeqState.saves` asks for a
    checkpoint, token by token."""
    state = SeqState({0: {"conv": (3, 2)}})
    state.boundary = boundary
    for n0, m, draft in itertools.product(range(9), range(1, 13), (False, True)):
        state.n = n0
        want = [e for e in range(1, m + 1) if state.saves(n0 + e, draft and e < m)]
        assert state.save_points(m, draft) == want, (n0, m, draft)
