"""Every GGUF weight type runs its matmuls in C, never in the numpy fallback.

The list of types is the GGUF reader's (``GGML_TO_DTYPE``): a type the reader keeps as a
matrix (quantized, or F32/F16/BF16) that loses its kernel in the C dispatch, or that the
reader gains without one, fails here.  ``CpuBackend.kernel_for`` asks the C dispatch
itself (``mc_pick_dot``), and the matmuls below run with the fallback replaced by a stub
that raises, so the answer is checked against what actually serves the call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from modelc.formats import quants
from modelc.formats.gguf import GGML_TO_DTYPE
from modelc.formats.gguf import _tensor as gguf_tensor
from modelc.formats.ir import DType
from modelc.runtime.backend import Weight
from modelc.runtime.backends import numpy_ref
from modelc.runtime.backends.cpu import C_MATMUL_DTYPES, CpuBackend, available_simd
from tests.gguf_support import gguf_file
from tests.test_kernels import REF, cols_for, make_weight, rel_err

# every type a GGUF file's matrices may hold, as the reader maps them
GGUF_WEIGHT_TYPES = sorted(
    {d for d in GGML_TO_DTYPE.values() if d.is_quantized or d in (DType.F32, DType.F16, DType.BF16)}
)
# the ones issue 13 names: the reader's list must keep them all
NAMED = {
    DType.F32,
    DType.F16,
    DType.BF16,
    DType.Q4_0,
    DType.Q4_1,
    DType.Q5_0,
    DType.Q5_1,
    DType.Q8_0,
    DType.Q2_K,
    DType.Q3_K,
    DType.Q4_K,
    DType.Q5_K,
    DType.Q6_K,
    DType.IQ4_NL,
    DType.IQ4_XS,
}


class _NoFallback:
    """Stands in for CpuBackend's numpy fallback: any call is a test failure."""

    def __getattr__(self, name: str) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"numpy fallback {name} called")

        return refuse


def _c_only(simd: str, matmul: str = "fast") -> CpuBackend:
    cpu = CpuBackend(simd=simd, matmul=matmul)
    cpu._fallback = _NoFallback()  # type: ignore[assignment]
    return cpu


def test_reader_types_include_the_named_ones() -> None:
    assert set(GGUF_WEIGHT_TYPES) >= NAMED
    assert set(GGUF_WEIGHT_TYPES) <= C_MATMUL_DTYPES


@pytest.mark.parametrize("simd", available_simd())
@pytest.mark.parametrize("dtype", GGUF_WEIGHT_TYPES, ids=str)
def test_every_gguf_type_is_served_in_c(dtype: DType, simd: str) -> None:
    cpu = _c_only(simd)
    assert cpu.kernel_for(dtype) == "c", f"{dtype} falls back to numpy on {simd}"
    rng = np.random.default_rng(list(DType).index(dtype))
    w = make_weight(dtype, 24, cols_for(dtype), rng)
    for n in (1, 8):
        x = rng.standard_normal((n, w.shape[1])).astype(np.float32)
        got = cpu.matmul(w, x)
        assert rel_err(got, REF.matmul(w, x)) <= 1.2e-2, (dtype, n)
        for g, o in zip(cpu.matmul_many([w, w], x), [got, got], strict=True):
            np.testing.assert_array_equal(g, o)
    np.testing.assert_array_equal(
        cpu.get_rows(w, np.array([3, 0])), REF.get_rows(w, np.array([3, 0]))
    )


def test_mixed_type_model_runs_without_per_call_conversion(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Q4_K_M file's layer mixes Q4_K, Q5_0, Q6_K and Q8_0 (Q3_K_M / Q5_K_M: Q3_K, Q5_K):
    each matmul goes straight to its own C kernel; nothing is dequantized, copied or
    repacked per call (the per-weight row views are made once and kept)."""

    def no_dequant(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a weight was dequantized in a matmul")

    monkeypatch.setattr(quants, "dequantize", no_dequant)
    monkeypatch.setattr(numpy_ref, "dequantize_rows", no_dequant)
    rng = np.random.default_rng(11)
    k = 512
    layer = {  # name: (dtype, rows)
        "attn_q": (DType.Q4_K, 64),
        "attn_k": (DType.Q4_K, 16),
        "attn_v": (DType.Q6_K, 16),
        "attn_output": (DType.Q5_0, 64),
        "ffn_gate": (DType.Q3_K, 128),
        "ffn_up": (DType.Q5_K, 128),
        "ffn_down": (DType.Q8_0, 64),
        "output": (DType.Q6_K, 96),
    }
    ws = {name: make_weight(dt, rows, k, rng) for name, (dt, rows) in layer.items()}
    for simd in available_simd():
        cpu = _c_only(simd)
        x = rng.standard_normal((3, k)).astype(np.float32)
        first = {name: cpu.matmul(w, x) for name, w in ws.items()}
        cached = dict(cpu._raw)
        for _ in range(3):
            q, kk, v = cpu.matmul_many([ws["attn_q"], ws["attn_k"], ws["attn_v"]], x)
            np.testing.assert_array_equal(q, first["attn_q"])
            np.testing.assert_array_equal(kk, first["attn_k"])
            np.testing.assert_array_equal(v, first["attn_v"])
            for name, w in ws.items():
                np.testing.assert_array_equal(cpu.matmul(w, x), first[name])
        # one row view per weight, made on the first call and reused since
        assert cpu._raw.keys() == cached.keys() and len(cached) == len(ws)
        assert all(cpu._raw[i][1] is cached[i][1] for i in cached)
        for name, w in ws.items():
            assert np.shares_memory(cpu._rows(w), w.data), name  # no copy of the weight


@pytest.mark.parametrize(
    "dtype",
    [DType.Q5_1, DType.Q2_K, DType.Q3_K, DType.Q5_K, DType.BF16, DType.IQ4_NL, DType.IQ4_XS],
    ids=str,
)
def test_gguf_tensor_of_each_new_type_runs_in_c(tmp_path: Path, dtype: DType) -> None:
    """A GGUF file's tensor of each type issue 13 moved into C: the reader keeps its blocks
    (bf16 bits) as they are, and the C kernels read them to gguf-py's values."""
    rng = np.random.default_rng(21)
    w = make_weight(dtype, 6, 512, rng)
    raw = np.ascontiguousarray(w.data).view(np.uint8)  # (6, row bytes)
    qtype = gguf.GGMLQuantizationType[dtype.name]
    path = tmp_path / "t.gguf"
    with gguf_file(path, "llama") as wr:
        wr.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=qtype)
    reader_tensor = next(t for t in gguf.GGUFReader(path).tensors)
    t = gguf_tensor(reader_tensor, path)
    assert t.dtype is dtype and t.shape == (6, 512)
    loaded = Weight(dtype, (6, 512), np.ascontiguousarray(t.data()))
    want = gguf.quants.dequantize(raw, qtype).reshape(6, 512)
    cpu = _c_only(available_simd()[0])
    np.testing.assert_array_equal(cpu.get_rows(loaded, np.arange(6)), want)
    x = rng.standard_normal((2, 512)).astype(np.float32)
    assert rel_err(cpu.matmul(loaded, x), x.astype(np.float64) @ want.T.astype(np.float64)) < 1.2e-2
