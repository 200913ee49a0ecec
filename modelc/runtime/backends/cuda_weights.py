"""Weights as the CUDA backend keeps them: :class:`DevWeight`, rows of one or more
:class:`DevPart` (each a run of one block type, uploaded once), and which host bytes go up
for a GGUF weight (``CODES``: the types kept in their blocks, by GGML's numbers)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelc.formats.ir import DType
from modelc.runtime.backend import Weight
from modelc.runtime.backends.numpy_ref import dequantize_weight

CODES: dict[DType, int] = {
    DType.F32: 0,
    DType.F16: 1,
    DType.BF16: 30,
    DType.Q4_0: 2,
    DType.Q4_1: 3,
    DType.Q8_0: 8,
    DType.Q4_K: 12,
    DType.Q6_K: 14,
    DType.Q5_0: 6,
    DType.Q5_1: 7,
    DType.Q2_K: 10,
    DType.Q3_K: 11,
    DType.Q5_K: 13,
    DType.IQ4_NL: 20,
    DType.IQ4_XS: 23,
    DType.MXFP4: 39,
}


@dataclass(slots=True)
class DevPart:
    """One uploaded block of weight rows of a single type."""

    data: Any  # cupy uint8 (rows, row_bytes)
    code: int  # CODES value
    rows: int
    cols: int
    row_bytes: int
    dense16: Any = None  # cupy f16 (rows, cols), kept for cuBLAS (MODELC_CUDA_F16_CACHE=1)
    layout: str = ""  # "" the GGUF blocks; "wide": repacked for cuda_gemvw (its own reads only)


@dataclass(slots=True)
class DevWeight:
    """A weight (or several stacked by rows: Q/K/V, gate/up) held on the device."""

    parts: list[DevPart]
    rows: int
    cols: int

    @property
    def nbytes(self) -> int:
        return sum(int(p.data.nbytes) for p in self.parts)

    def columns(self, y: Any) -> Iterator[tuple[DevPart, Any]]:
        """Each part with the view of ``y`` (rows of at least ``self.rows``) its rows fill:
        the columns from the part's first (a part's output rows follow the one before)."""
        col0 = 0
        for p in self.parts:
            yield p, (y[:, col0:] if col0 else y)
            col0 += p.rows


def host_part(w: Weight) -> tuple[np.ndarray[Any, Any], DType]:
    """The bytes to upload for ``w`` and the type they are in."""
    if w.dtype in CODES:
        return np.ascontiguousarray(w.data).view(np.uint8).reshape(w.shape[0], -1), w.dtype
    return dequantize_weight(w).astype(np.float16).view(np.uint8), DType.F16
