"""Export a model's weights to a ``.safetensors`` file that other tools can read.

Quantized tensors (GGML blocks, int8) are dequantized to F32; plain tensors keep
their dtype (bf16 as BF16).  The file is written by hand, tensor by tensor (the
format is an 8-byte header length, a JSON header, then the raw bytes), so memory
stays near one tensor; output is atomic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from modelc.artifact.atomic import atomic_output
from modelc.artifact.transform import to_f32
from modelc.formats.ir import DType, ModelIR, nbytes

_ST_DTYPES: dict[DType, str] = {
    DType.F32: "F32",
    DType.F16: "F16",
    DType.BF16: "BF16",
    DType.F64: "F64",
    DType.I8: "I8",
    DType.I16: "I16",
    DType.I32: "I32",
    DType.I64: "I64",
    DType.U8: "U8",
    DType.BOOL: "BOOL",
}


def _export_dtype(dtype: DType) -> DType:
    return DType.F32 if dtype.is_quantized else dtype


def export_safetensors(ir: ModelIR, out: str | Path) -> int:
    """Write all tensors of ``ir`` to ``out``; returns the number of tensors written."""
    out = Path(out)
    header: dict[str, Any] = {
        "__metadata__": {"format": "pt", "architecture": ir.architecture, "exported_by": "modelc"}
    }
    pos = 0
    for t in ir.tensors.values():
        dt = _export_dtype(t.dtype)
        n = nbytes(dt, t.shape)
        header[t.name] = {
            "dtype": _ST_DTYPES[dt],
            "shape": list(t.shape),
            "data_offsets": [pos, pos + n],
        }
        pos += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with atomic_output(out) as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for t in ir.tensors.values():
            data = t.data()
            if t.dtype.is_quantized:
                data = to_f32(data, t.dtype, t.shape)
            arr = np.ascontiguousarray(data)
            f.write(arr.reshape(-1).view(np.uint8).data)
            del data, arr
    return len(ir.tensors)
