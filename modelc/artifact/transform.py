"""Pack-time weight transforms: dequantize to f32, prune, quantize, and size estimates.

Only *weight matrices* are transformed: 2-D float tensors (f32/f16/bf16/f64) that are
not norms or biases.  A matrix already stored quantized (GGML blocks, int8) is
*requantized*: dequantized to f32 and quantized again, as llama.cpp's
``llama-quantize --allow-requantize`` does; see :func:`requantize_target`.  1-D
tensors, norms, biases and integer tensors are never touched.
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from modelc.errors import UsageError
from modelc.formats.ir import BLOCK_SIZES, NUMPY_DTYPES, DType, nbytes

FLOAT_DTYPES = frozenset({DType.F32, DType.F16, DType.BF16, DType.F64})


# the quantized types modelc can write (formats.quants.quantize), so can requantize into
REQUANTIZABLE = frozenset(
    {DType.Q8_0, DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.Q4_K, DType.Q5_K}
    | {DType.Q6_K, DType.INT8}
)


def _is_matrix(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and "norm" not in name and not name.endswith(".bias") and min(shape) > 0


def is_weight_matrix(name: str, dtype: DType, shape: tuple[int, ...]) -> bool:
    """True for the float tensors ``--quantize`` and ``--prune`` apply to."""
    return dtype in FLOAT_DTYPES and _is_matrix(name, shape)


def is_quantized_matrix(name: str, dtype: DType, shape: tuple[int, ...]) -> bool:
    """True for an already-quantized weight matrix (requantized by ``--quantize``/``--prune``)."""
    return dtype.is_quantized and _is_matrix(name, shape)


def requantize_target(
    name: str, dtype: DType, shape: tuple[int, ...], quantize: str | None, prune: float | None
) -> DType | None:
    """The type an already-quantized matrix is requantized to, or None to keep its bytes.

    ``--quantize X`` requantizes every quantized matrix not already of type X; with
    ``--prune`` the values change, so a matrix is requantized even to its own type
    (its own type without ``--quantize``, which must then be one modelc can write).
    """
    if not is_quantized_matrix(name, dtype, shape):
        return None
    if quantize is not None:
        target = target_dtype(quantize)
        if can_store_as(target, shape) and (target is not dtype or prune):
            return target
        if target is dtype:
            return None
    if not prune:
        return None
    if dtype not in REQUANTIZABLE:
        writable = ", ".join(sorted(d.value for d in REQUANTIZABLE))
        raise UsageError(
            f"--prune must requantize tensor {name}, but modelc cannot write {dtype} "
            f"(only {writable}); add --quantize q8_0 (or another type) to prune it"
        )
    return dtype


def can_store_as(target: DType, shape: tuple[int, ...]) -> bool:
    """Whether a 2-D tensor of ``shape`` fits ``target``'s block size."""
    if target in BLOCK_SIZES:
        return shape[-1] % BLOCK_SIZES[target][0] == 0
    return True


def to_f32(
    data: np.ndarray[Any, Any], dtype: DType, shape: tuple[int, ...]
) -> np.ndarray[Any, Any]:
    """Any tensor's data as float32 of its logical shape (quantized and bf16 dequantized)."""
    if dtype is DType.F32:
        return data.reshape(shape)
    if dtype is DType.BF16:
        bits = np.ascontiguousarray(data).reshape(shape).astype(np.uint32) << 16
        return bits.view(np.float32)
    if dtype.is_quantized:
        from modelc.formats.quants import dequantize

        return dequantize(data, dtype, shape).reshape(shape)
    return np.asarray(data, dtype=np.float32).reshape(shape)


def prune(x: np.ndarray[Any, Any], threshold: float) -> tuple[np.ndarray[Any, Any], int]:
    """Zero the entries with ``|x| < threshold``; returns the new array and how many were zeroed."""
    mask = np.abs(x) < threshold
    n = int(np.count_nonzero(mask & (x != 0)))
    if not n:
        return x, 0
    out = np.array(x, copy=True)
    out[mask] = 0
    return out, n


# the GGML types the compiled quantizer (cyx/mc_quantize.h) writes, by GGML type id
GGML_IDS = {
    DType.Q4_0: 2, DType.Q4_1: 3, DType.Q5_0: 6, DType.Q5_1: 7, DType.Q8_0: 8,
    DType.Q2_K: 10, DType.Q3_K: 11, DType.Q4_K: 12, DType.Q5_K: 13, DType.Q6_K: 14,
    DType.IQ4_NL: 20, DType.IQ4_XS: 23,
}  # fmt: skip


def quantize(
    x: np.ndarray[Any, Any], target: DType, imatrix: np.ndarray[Any, Any] | None = None
) -> np.ndarray[Any, Any]:
    """Quantize a 2-D float array (any float dtype) to ``target``; f16 stays an f16 array.

    GGML block types are written by the compiled quantizer, bit for bit as llama.cpp's
    ``ggml_quantize_chunk``; ``imatrix`` (cols,) float32 importance weights steer it as
    ``llama-quantize --imatrix`` does.
    """
    if target is DType.F16:
        return np.asarray(x, dtype=np.float16)
    if target in GGML_IDS:
        import importlib

        k = importlib.import_module("modelc._kernels.kernels")
        x = np.ascontiguousarray(x, dtype=np.float32)
        x = x.reshape(-1, x.shape[-1])
        bs, ts = BLOCK_SIZES[target]
        if x.shape[1] % bs:
            raise UsageError(f"cannot store rows of {x.shape[1]} weights as {target}")
        out = np.empty((x.shape[0], x.shape[1] // bs * ts), dtype=np.uint8)
        im = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
        # rows are independent: a slice each on every CPU (the wrapper releases the GIL)
        n = min(int(k.num_procs()), max(1, x.size // (1 << 16)))
        cuts = np.linspace(0, x.shape[0], n + 1).astype(int)
        with ThreadPoolExecutor(n) as pool:
            for f in [
                pool.submit(k.quantize_chunk, GGML_IDS[target], x[a:b], out[a:b], im)
                for a, b in itertools.pairwise(cuts.tolist())
                if b > a
            ]:
                f.result()
        return out
    from modelc.formats.quants import quantize as q

    return q(np.ascontiguousarray(x, dtype=np.float32), target)


def target_dtype(method: str) -> DType:
    from modelc.artifact.format import QUANT_METHODS

    if method not in QUANT_METHODS:
        raise UsageError(
            f"unknown quantization {method!r}; choose one of {', '.join(QUANT_METHODS)}"
        )
    return DType(QUANT_METHODS[method])


SIZE_TABLE_TYPES = (DType.F32, DType.F16, DType.Q8_0, DType.INT8, DType.Q4_0, DType.Q4_1)


def estimated_size(tensors: list[tuple[str, DType, tuple[int, ...]]], target: DType) -> int:
    """Bytes of all tensors if the weight matrices were stored as ``target`` (others as f32).

    A tensor already block-quantized counts as a weight matrix; f32/f16 apply to every
    float tensor.  Integer tensors keep their own size.
    """
    total = 0
    for name, dtype, shape in tensors:
        plain_float = dtype in FLOAT_DTYPES or dtype.is_quantized
        if not plain_float:
            total += nbytes(dtype, shape)
            continue
        matrix = len(shape) == 2 and (dtype.is_quantized or is_weight_matrix(name, dtype, shape))
        if target in (DType.F32, DType.F16) or (matrix and can_store_as(target, shape)):
            total += nbytes(target, shape)
        else:
            total += nbytes(DType.F32, shape)
    return total


def bits_per_weight(target: DType) -> float:
    if target in BLOCK_SIZES:
        bs, ts = BLOCK_SIZES[target]
        return ts * 8 / bs
    if target is DType.INT8:
        return 8.0
    return NUMPY_DTYPES[target].itemsize * 8.0
