"""Safetensors reader: header parsed and validated here, tensor data memory-mapped (zero copy).

File layout: ``u64 little-endian N`` | ``N bytes of JSON header`` | data section.
The header maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}``
(offsets relative to the data section) plus an optional ``"__metadata__"`` string map.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import numpy as np

from modelc.errors import FormatError, UnsupportedError
from modelc.formats.arch import build_model_ir, check_canonical, sibling_config
from modelc.formats.ir import (
    NUMPY_DTYPES,
    DType,
    HParams,
    ModelIR,
    SourceInfo,
    Tensor,
    TokenizerSpec,
    aligned,
)

T = TypeVar("T")

DTYPES: dict[str, DType] = {
    "F32": DType.F32,
    "F16": DType.F16,
    "BF16": DType.BF16,
    "F64": DType.F64,
    "I8": DType.I8,
    "I16": DType.I16,
    "I32": DType.I32,
    "I64": DType.I64,
    "U8": DType.U8,
    "BOOL": DType.BOOL,
}
MAX_HEADER = 100 * 1024 * 1024

assert sys.byteorder == "little", "modelc reads little-endian tensor data in place"


class _Mapped:
    """Memory-maps the data section once, on first use, and hands out views."""

    def __init__(self, path: Path, offset: int, size: int) -> None:
        self.path, self.offset, self.size = path, offset, size
        self._mm: np.memmap[Any, np.dtype[np.uint8]] | None = None

    def view(
        self, begin: int, end: int, dtype: np.dtype[Any], shape: tuple[int, ...]
    ) -> np.ndarray[Any, Any]:
        if end == begin:
            return np.zeros(shape, dtype)
        if self._mm is None:
            self._mm = np.memmap(
                self.path, dtype=np.uint8, mode="r", offset=self.offset, shape=(self.size,)
            )
        return aligned(self._mm[begin:end].view(dtype).reshape(shape))


def read_header(path: Path) -> tuple[dict[str, Any], int, int]:
    """Return (header dict, data section offset, data section size); raise FormatError if malformed."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise FormatError(
                    f"safetensors file is truncated ({size} bytes, no header length)", path=path
                )
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER or 8 + n > size:
                raise FormatError(
                    f"safetensors header length {n} does not fit in the {size}-byte file "
                    "(truncated or not a safetensors file)",
                    path=path,
                )
            raw = f.read(n)
    except OSError as e:
        raise FormatError(f"cannot read safetensors file: {e.strerror}", path=path) from e
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"safetensors header is not valid JSON ({e})", path=path) from e
    if not isinstance(header, dict):
        raise FormatError("safetensors header is not a JSON object", path=path)
    return header, 8 + n, size - 8 - n


def read_safetensors(path: str | Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Read one ``.safetensors`` file into lazy, memory-mapped tensors (source names) and its metadata."""
    path = Path(path)
    header, data_off, data_size = read_header(path)
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise FormatError("safetensors __metadata__ is not a string map", path=path)
    mapped = _Mapped(path, data_off, data_size)
    tensors: dict[str, Tensor] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        dtype, shape, begin, end = _check_entry(path, name, info, data_size)
        spans.append((begin, end, name))
        tensors[name] = Tensor(name, dtype, shape, _loader(mapped, begin, end, dtype, shape))
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in itertools.pairwise(spans):
        if b1 < e0 and e1 > b1 and e0 > b0:
            raise FormatError(
                f"tensors {n0!r} and {n1!r} overlap in the data section (corrupt offsets)",
                path=path,
            )
    return tensors, {str(k): str(v) for k, v in meta.items()}


def _check_entry(
    path: Path, name: str, info: Any, data_size: int
) -> tuple[DType, tuple[int, ...], int, int]:
    if not isinstance(info, dict):
        raise FormatError(f"tensor {name!r}: header entry is not an object", path=path)
    dt = info.get("dtype")
    if dt not in DTYPES:
        if isinstance(dt, str):
            raise UnsupportedError(
                f"tensor {name!r} has dtype {dt}, which modelc does not read ({', '.join(DTYPES)})",
                path=path,
            )
        raise FormatError(f"tensor {name!r}: missing or invalid dtype", path=path)
    shape = info.get("shape")
    offsets = info.get("data_offsets")
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise FormatError(
            f"tensor {name!r}: shape {shape!r} is not a list of non-negative ints", path=path
        )
    if not (
        isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
    ):
        raise FormatError(
            f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end]", path=path
        )
    begin, end = offsets
    dtype = DTYPES[dt]
    want = math.prod(shape) * NUMPY_DTYPES[dtype].itemsize
    if not 0 <= begin <= end <= data_size:
        raise FormatError(
            f"tensor {name!r}: data_offsets [{begin}, {end}] lie outside the {data_size}-byte data section "
            "(file truncated or header corrupt)",
            path=path,
        )
    if end - begin != want:
        raise FormatError(
            f"tensor {name!r}: {end - begin} bytes in the file but dtype {dt} x shape {shape} needs {want}",
            path=path,
        )
    return dtype, tuple(shape), begin, end


def _loader(mapped: _Mapped, begin: int, end: int, dtype: DType, shape: tuple[int, ...]) -> Any:
    np_dtype = NUMPY_DTYPES[dtype]

    def load() -> np.ndarray[Any, Any]:
        return mapped.view(begin, end, np_dtype, shape)

    return load


def is_modelc_export(meta: dict[str, str]) -> bool:
    return meta.get("exported_by") == "modelc" and "modelc.hparams" in meta


def _export_field(meta: dict[str, str], key: str, type_: type[T], path: Path) -> T | None:
    if key not in meta:
        return None
    try:
        return msgspec.json.decode(meta[key], type=type_)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise FormatError(
            f"__metadata__ {key!r} of this modelc export is corrupt ({e}); export the model again",
            path=path,
        ) from e


def _load_modelc_export(
    path: Path, raw: dict[str, Tensor], meta: dict[str, str], source: SourceInfo
) -> ModelIR:
    """A file ``modelc export`` wrote: canonical names and layouts, the rest in ``__metadata__``."""
    hparams = _export_field(meta, "modelc.hparams", HParams, path)
    assert hparams is not None
    graph = _export_field(meta, "modelc.graph", dict[str, Any], path)
    ir = ModelIR(
        architecture=meta.get("architecture", ""),
        hparams=hparams,
        tensors=raw,
        source=source,
        tokenizer=_export_field(meta, "modelc.tokenizer", TokenizerSpec, path),
        chat_template=meta.get("modelc.chat_template"),
        generation=_export_field(meta, "modelc.generation", dict[str, Any], path) or {},
        graph=graph,
        metadata=_export_field(meta, "modelc.metadata", dict[str, Any], path) or {},
    )
    check_canonical(ir.architecture, ir.hparams, ir.tensors, has_graph=graph is not None)
    return ir


def load_safetensors(path: str | Path) -> ModelIR:
    """Read a single ``.safetensors`` file (with a ``config.json`` beside it, if any, for hyper-parameters).

    A file written by ``modelc export`` is read back as the model it was exported from.
    """
    path = Path(path)
    raw, meta = read_safetensors(path)
    source = SourceInfo(path=str(path), format="safetensors", size=path.stat().st_size)
    if is_modelc_export(meta):
        return _load_modelc_export(path, raw, meta, source)
    return build_model_ir(
        raw, sibling_config(path), source, metadata={"safetensors_metadata": meta} if meta else None
    )
