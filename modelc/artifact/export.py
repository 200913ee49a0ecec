"""Export a model's weights to a ``.safetensors`` file that other tools can read.

Quantized tensors (GGML blocks, int8) are dequantized to F32; plain tensors keep
their dtype (bf16 as BF16).  The file is written by hand, tensor by tensor (the
format is an 8-byte header length, a JSON header, then the raw bytes) in row blocks
of about 4 MB, so memory stays small even for large tensors; output is atomic.

Tensor names stay canonical (GGUF-style) and the layouts stay the IR's, so the file
alone does not say how to run the model: ``__metadata__`` carries the rest as JSON
strings (``modelc.hparams``, ``modelc.tokenizer``, ``modelc.chat_template``,
``modelc.generation``, ``modelc.graph``, ``modelc.metadata``), and
:func:`modelc.formats.safetensors.load_safetensors` reads such a file back as the
same model: ``modelc pack`` of an export round-trips.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
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


def _json(value: Any) -> str | None:
    """``value`` as JSON text, or None if it holds something JSON cannot (it is left out)."""

    def hook(obj: Any) -> Any:
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            return obj.tolist()
        raise NotImplementedError(type(obj).__name__)

    try:
        return msgspec.json.encode(value, enc_hook=hook).decode()
    except (TypeError, NotImplementedError, msgspec.EncodeError):
        return None


def export_metadata(ir: ModelIR) -> dict[str, str]:
    """The ``__metadata__`` string map of an export: enough to read it back as ``ir``."""
    meta = {"format": "pt", "architecture": ir.architecture, "exported_by": "modelc"}
    fields: dict[str, Any] = {
        "modelc.hparams": ir.hparams,
        "modelc.tokenizer": ir.tokenizer,
        "modelc.generation": ir.generation or None,
        "modelc.graph": ir.graph,
    }
    for key, value in fields.items():
        text = _json(value) if value is not None else None
        if text is not None:
            meta[key] = text
    if ir.chat_template is not None:
        meta["modelc.chat_template"] = ir.chat_template
    kept = {k: v for k, v in ir.metadata.items() if _json(v) is not None}
    if kept:
        meta["modelc.metadata"] = _json(kept) or "{}"
    return meta


def export_safetensors(ir: ModelIR, out: str | Path) -> int:
    """Write all tensors of ``ir`` to ``out``; returns the number of tensors written."""
    out = Path(out)
    header: dict[str, Any] = {"__metadata__": export_metadata(ir)}
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
