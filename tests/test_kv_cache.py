"""KV cache storage modes, memory accounting, truncation and context shift."""

from __future__ import annotations

import numpy as np
import pytest

from modelc.errors import CapacityError, UsageError
from modelc.runtime.kv_cache import (
    BLOCK,
    KVBudget,
    KVCache,
    KVMode,
    KVShape,
    dequantize_int8,
    quantize_int8,
)

SHAPE = KVShape(n_layer=2, n_head_kv=3, head_dim=8)


def rand(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (n, 3, 8)).astype(np.float32)


def fill(cache: KVCache, k: np.ndarray, v: np.ndarray) -> None:
    cache.reserve(cache.n + len(k))
    for layer in range(SHAPE.n_layer):
        cache.write(layer, cache.n, k + layer, v - layer)
    cache.advance(len(k))


def test_int8_roundtrip_error_is_within_half_a_step() -> None:
    x = np.random.default_rng(5).normal(0, 1, (40, 3, 64)).astype(np.float32)
    x[:, :, 7] *= 30  # an outlier channel only spoils its own group of 32
    q, s = quantize_int8(x, 32)
    assert q.shape == x.shape and s.shape == (40, 3, 2)
    back = dequantize_int8(q, s, np.empty_like(x))
    step = np.repeat(s, 32, axis=-1)
    assert np.all(np.abs(back - x) <= step * 0.5 + 1e-6)
    assert np.abs(back - x)[:, :, 32:].max() < 0.5 * np.abs(x[:, :, 7]).max() / 127
    assert np.all(quantize_int8(np.zeros((2, 3, 8), np.float32), 8)[1] == 0)


@pytest.mark.parametrize("mode", list(KVMode))
def test_read_back_per_mode(mode: KVMode) -> None:
    c = KVCache(SHAPE, 1000, mode, hot_window=5)
    k, v = rand(30, 1), rand(30, 2)
    fill(c, k[:20], v[:20])  # a prefill chunk
    for i in range(20, 30):  # then decode steps
        fill(c, k[i : i + 1], v[i : i + 1])
    kk, vv = c.read(1, 30)
    assert kk.shape == (30, 3, 8)
    err = np.abs(kk - (k + 1))
    if mode is KVMode.F32:
        assert np.array_equal(kk, k + 1) and np.array_equal(vv, v - 1)
    else:
        assert 0 < err[:25].max() < 0.02  # int8: ~|x|max / 254
    if mode is KVMode.MIXED:
        assert np.array_equal(kk[25:], (k + 1)[25:])  # the hot window is exact
        assert np.array_equal(vv[25:], (v - 1)[25:])
    if mode is KVMode.INT8:
        assert err[25:].max() > 0


def test_memory_accounting_and_budget() -> None:
    b = KVBudget(10 * 1024 * 1024)
    c = KVCache(SHAPE, 4 * BLOCK, KVMode.F32, budget=b)
    assert c.nbytes == 0 and b.used == 0
    c.reserve(10)
    assert c.capacity == BLOCK
    assert c.nbytes == BLOCK * SHAPE.bytes_per_token(KVMode.F32) == b.used
    c.reserve(BLOCK + 1)
    assert c.capacity == 2 * BLOCK and b.used == c.nbytes
    i8 = KVCache(SHAPE, 4 * BLOCK, KVMode.INT8, budget=b)
    i8.reserve(1)
    # int8: head_dim bytes + one f32 scale per head, vs 4 * head_dim bytes
    assert SHAPE.bytes_per_token(KVMode.INT8) / SHAPE.bytes_per_token(KVMode.F32) == (8 + 4) / 32
    assert b.used == c.nbytes + i8.nbytes
    c.free()
    i8.free()
    assert b.used == 0
    small = KVBudget(1000)
    with pytest.raises(CapacityError, match="budget"):
        KVCache(SHAPE, 4 * BLOCK, budget=small).reserve(1)
    assert small.used == 0


def test_limits_and_truncate() -> None:
    c = KVCache(SHAPE, 16)
    with pytest.raises(UsageError, match="exceeds"):
        c.reserve(17)
    fill(c, rand(10), rand(10))
    c.truncate(4)
    assert c.n == 4
    with pytest.raises(UsageError):
        c.truncate(5)
    with pytest.raises(UsageError):
        KVCache(SHAPE, 0)


@pytest.mark.parametrize("mode", list(KVMode))
def test_shift_keeps_anchors_and_moves_tail(mode: KVMode) -> None:
    c = KVCache(SHAPE, 64, mode, hot_window=6)
    k, v = rand(20, 3), rand(20, 4)
    fill(c, k, v)
    before_k, before_v = (a.copy() for a in c.read(0, 20))
    c.shift(n_keep=3, n_discard=7)
    assert c.n == 13
    kk, vv = c.read(0, 13)
    keep = np.r_[0:3, 10:20]
    np.testing.assert_array_equal(kk, before_k[keep])
    np.testing.assert_array_equal(vv, before_v[keep])
    with pytest.raises(UsageError):
        c.shift(3, 20)


def test_update_keys_applies_in_place_every_layer() -> None:
    for mode in KVMode:
        c = KVCache(SHAPE, 64, mode, hot_window=4)
        k = rand(10)
        fill(c, k, rand(10, 1))
        before = [c.read(layer, 10)[0].copy() for layer in range(2)]

        def neg(x: np.ndarray) -> None:
            x *= -1

        c.update_keys(6, neg)
        for layer in range(2):
            after = c.read(layer, 10)[0]
            np.testing.assert_array_equal(after[:6], before[layer][:6])
            np.testing.assert_allclose(after[6:], -before[layer][6:], atol=0.02)


def test_mixed_truncate_then_rewrite_reads_the_new_values() -> None:
    c = KVCache(SHAPE, 64, KVMode.MIXED, hot_window=6)
    fill(c, rand(20, 1), rand(20, 2))
    c.truncate(5)
    k2, v2 = rand(20, 3), rand(20, 4)
    fill(c, k2, v2)  # one chunk longer than the hot window
    kk, _ = c.read(0, 25)
    np.testing.assert_allclose(kk[5:], k2, atol=0.05)  # no stale exact rows from before
    np.testing.assert_array_equal(kk[19:], k2[14:])  # the hot window is exact


def test_f16_stores_half_precision_and_reads_the_storage_itself() -> None:
    c = KVCache(SHAPE, 1000, KVMode.F16)
    k, v = rand(30, 1) * 10, rand(30, 2)
    fill(c, k, v)
    kk, vv = c.read(1, 30)
    assert kk.dtype == vv.dtype == np.float16 == c.dtype
    # written rounded to nearest (numpy's f32 -> f16 cast), read back as is
    assert np.array_equal(kk, (k + 1).astype(np.float16))
    assert np.array_equal(vv, (v - 1).astype(np.float16))
    assert np.abs(kk.astype(np.float32) - (k + 1)).max() <= np.abs(k + 1).max() * 2.0**-11
    # a view of the storage, not a copy: a later write shows through an earlier read
    c.reserve(31)
    c.write(1, 30, np.full((1, 3, 8), 7, np.float32), np.zeros((1, 3, 8), np.float32))
    assert np.shares_memory(c.read(1, 31)[0], kk)
    assert c.read(1, 31)[0][30, 0, 0] == 7
    # f16 values read back from a cache (the prefix cache) are written unchanged
    d = KVCache(SHAPE, 1000, KVMode.F16)
    d.reserve(30)
    d.write(1, 0, kk, vv)
    assert np.array_equal(d.read(1, 30)[0], kk)
    assert KVCache(SHAPE, 10, KVMode.F32).dtype == KVCache(SHAPE, 10, KVMode.INT8).dtype


def test_f16_memory_is_half_of_f32_with_no_scratch() -> None:
    assert SHAPE.bytes_per_token(KVMode.F16) * 2 == SHAPE.bytes_per_token(KVMode.F32)
    assert SHAPE.bytes_per_token(KVMode.F16) == 2 * SHAPE.n_layer * 3 * 8 * 2
    b = KVBudget(10 * 1024 * 1024)
    c = KVCache(SHAPE, 4 * BLOCK, KVMode.F16, budget=b)
    c.reserve(BLOCK + 1)
    assert c.capacity == 2 * BLOCK
    assert c.nbytes == 2 * BLOCK * SHAPE.bytes_per_token(KVMode.F16) == b.used
    c.free()
    assert b.used == 0


def test_f16_update_keys_and_truncate() -> None:
    c = KVCache(SHAPE, 64, KVMode.F16)
    fill(c, rand(10), rand(10, 1))
    before = c.read(0, 10)[0].astype(np.float32)

    def scale(x: np.ndarray) -> None:
        assert x.dtype == np.float32  # the function sees f32
        x *= 1.5

    c.update_keys(4, scale)
    after = c.read(0, 10)[0]
    assert after.dtype == np.float16
    assert np.array_equal(after[:4], before[:4].astype(np.float16))
    assert np.array_equal(after[4:], (before[4:] * 1.5).astype(np.float16))
    c.truncate(6)
    fill(c, rand(3, 5), rand(3, 6))
    assert c.n == 9
    assert np.array_equal(c.read(0, 9)[0][6:], (rand(3, 5) + 0).astype(np.float16))
