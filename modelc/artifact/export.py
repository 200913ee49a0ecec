"""Export a model's weights to a ``.safetensors`` file that other tools can read.

Quantized tensors (GGML blocks, int8) are dequantized to F32; plain tensors keep
their dtype (bf16 as BF16).  The file is written by hand, tensor by tensor (the
format is an 8-byte header length, a JSON header, then the raw bytes) in row blocks
of about 4 MB, so memory stays small even for large tensors; output is atomic.
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


_CHUNK_BYTES = 1 << 22


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
            if data.size == 0:
                continue
            rows = data.reshape(data.shape[0], -1) if data.ndim >= 2 else data.reshape(1, -1)
            step = max(1, _CHUNK_BYTES // max(1, rows.shape[1] * 4))
            for r0 in range(0, rows.shape[0], step):
                block = rows[r0 : r0 + step]
                if t.dtype.is_quantized:  # row blocks: never the whole tensor in f32
                    block = to_f32(block, t.dtype, (block.shape[0], t.shape[-1]))
                f.write(np.ascontiguousarray(block).reshape(-1).view(np.uint8).data)
            del data, rows
    return len(ir.tensors)
