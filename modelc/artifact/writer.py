"""Write a :class:`ModelIR` to a ``.modelc`` file, streaming one tensor at a time.

Peak memory stays near the largest tensor (times a small factor while it is being
pruned, quantized or compressed), never the model size: each tensor is loaded from
its (usually memory-mapped) source, transformed, checksummed, written and dropped
before the next one.  The file is written to a temp file in the destination
directory, fsynced and renamed, so a failed or interrupted pack leaves nothing.
"""

from __future__ import annotations

import datetime
import hashlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import zstandard

import modelc
from modelc.artifact.atomic import atomic_output
from modelc.artifact.format import (
    ALIGNMENT,
    FLAG_COMPRESSED,
    FORMAT_VERSION,
    HEADER_SIZE,
    QUANT_METHODS,
    Header,
    Manifest,
    PackInfo,
    TensorEntry,
    align,
    encode_manifest,
)
from modelc.artifact.transform import (
    can_store_as,
    is_weight_matrix,
    prune,
    quantize,
    target_dtype,
    to_f32,
)
from modelc.errors import FormatError, UsageError
from modelc.formats.ir import NUMPY_DTYPES, DType, ModelIR, Tensor, nbytes

# (bytes done, bytes total, tensor name)
ProgressFn = Callable[[int, int, str], None]


@dataclass(frozen=True, slots=True)
class PackOptions:
    """What ``modelc pack`` does to the weights on the way into the artifact."""

    compress: bool = False
    compression_level: int = 3  # zstandard level, 1..22 (3..19 sensible)
    quantize: str | None = None  # a QUANT_METHODS key: fp16 | int8 | int4 | q8_0 | q4_0
    prune: float | None = None  # zero |w| < prune in weight matrices, before quantizing

    def check(self) -> None:
        if self.quantize is not None and self.quantize not in QUANT_METHODS:
            raise UsageError(
                f"unknown quantization {self.quantize!r}; choose one of {', '.join(QUANT_METHODS)}"
            )
        if not 1 <= self.compression_level <= 22:
            raise UsageError(f"compression level must be 1..22, got {self.compression_level}")
        if self.prune is not None and not (self.prune >= 0 and np.isfinite(self.prune)):
            raise UsageError(f"prune threshold must be a finite number >= 0, got {self.prune}")


def _checked_data(t: Tensor, source: str) -> np.ndarray[Any, Any]:
    """Load a tensor and check that its bytes match its declared dtype and shape."""
    data = t.data()
    want = nbytes(t.dtype, t.shape)
    if (
        t.dtype in NUMPY_DTYPES
        and data.dtype != NUMPY_DTYPES[t.dtype]
        and t.dtype is not DType.BF16
    ):
        raise FormatError(f"tensor {t.name}: data is {data.dtype}, expected {t.dtype}", path=source)
    if data.nbytes != want:
        raise FormatError(
            f"tensor {t.name}: has {data.nbytes} bytes, expected {want} for {t.dtype} {list(t.shape)}; "
            "the file is truncated or its tensor table is wrong",
            path=source,
        )
    return data


def _transform(
    t: Tensor, data: np.ndarray[Any, Any], opts: PackOptions, info: PackInfo
) -> tuple[DType, np.ndarray[Any, Any]]:
    """Apply prune and quantize to one tensor; return its stored dtype and data."""
    if not is_weight_matrix(t.name, t.dtype, t.shape):
        return t.dtype, data
    dtype = t.dtype
    target = target_dtype(opts.quantize) if opts.quantize else None
    if target is not None and (target is dtype or not can_store_as(target, t.shape)):
        target = None
    if not opts.prune and target is None:
        return dtype, data
    if dtype is DType.BF16:
        data = to_f32(data, dtype, t.shape)
    if opts.prune:
        data, n = prune(data, opts.prune)
        info.pruned_weights += n
    if target is not None:
        info.quantized_tensors += 1
        return target, quantize(data, target)
    if dtype is DType.BF16:  # pruned only: back to bf16 bits, exact since values came from bf16
        data = (np.ascontiguousarray(data, dtype=np.float32).view(np.uint32) >> 16).astype(
            np.uint16
        )
    return dtype, data


def _as_bytes(data: np.ndarray[Any, Any]) -> memoryview:
    arr = np.ascontiguousarray(data)
    return arr.reshape(-1).view(np.uint8).data


def write_artifact(
    ir: ModelIR,
    dest: str | Path,
    opts: PackOptions | None = None,
    *,
    progress: ProgressFn | None = None,
) -> Manifest:
    """Write ``ir`` to ``dest`` (atomically) and return the manifest written."""
    opts = opts or PackOptions()
    opts.check()
    dest = Path(dest)
    info = PackInfo(
        quantize=opts.quantize,
        prune_threshold=opts.prune,
        compression="zstd" if opts.compress else "none",
        compression_level=opts.compression_level if opts.compress else 0,
    )
    total = sum(t.nbytes for t in ir.tensors.values())
    done = 0
    entries: list[TensorEntry] = []
    compressor = zstandard.ZstdCompressor(level=opts.compression_level, write_checksum=True)
    with atomic_output(dest) as f:
        f.write(b"\x00" * HEADER_SIZE)
        pos = 0  # relative to the data area
        for t in ir.tensors.values():
            data = _checked_data(t, ir.source.path)
            dtype, data = _transform(t, data, opts, info)
            raw = _as_bytes(data)
            n = raw.nbytes
            stored: bytes | memoryview = raw
            if opts.compress and n:
                stored = compressor.compress(raw)
            digest = hashlib.blake2b(stored, digest_size=16).hexdigest()
            f.write(stored)
            size = len(stored) if isinstance(stored, bytes) else stored.nbytes
            entries.append(
                TensorEntry(
                    name=t.name,
                    dtype=dtype.value,
                    shape=list(t.shape),
                    offset=pos,
                    nbytes=n,
                    stored_nbytes=size,
                    checksum=digest,
                    compression="zstd" if opts.compress and n else "none",
                )
            )
            pos = _pad(f, pos + size)
            del data, raw, stored
            done += t.nbytes
            if progress:
                progress(done, total, t.name)
        manifest = Manifest(
            format_version=FORMAT_VERSION,
            architecture=ir.architecture,
            hparams=ir.hparams,
            source=ir.source,
            created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            modelc_version=modelc.__version__,
            tensors=entries,
            pack=info,
            tokenizer=ir.tokenizer,
            chat_template=ir.chat_template,
            generation=dict(ir.generation),
            graph=ir.graph,
            metadata=dict(ir.metadata),
        )
        try:
            blob = encode_manifest(manifest)
        except (TypeError, NotImplementedError) as e:
            raise FormatError(f"model metadata cannot be stored: {e}", path=ir.source.path) from e
        header = Header(
            format_version=FORMAT_VERSION,
            flags=FLAG_COMPRESSED if opts.compress else 0,
            manifest_offset=HEADER_SIZE + pos,
            manifest_length=len(blob),
            data_offset=HEADER_SIZE,
            data_length=pos,
            manifest_crc32=_crc32(blob),
        )
        f.write(blob)
        f.seek(0)
        f.write(header.pack())
    return manifest


def _pad(f: BinaryIO, pos: int) -> int:
    padded = align(pos)
    if padded > pos:
        f.write(b"\x00" * (padded - pos))
    assert padded % ALIGNMENT == 0
    return padded


def _crc32(b: bytes) -> int:
    return zlib.crc32(b)


def pack_file(
    src: str | Path,
    dest: str | Path,
    opts: PackOptions | None = None,
    *,
    progress: ProgressFn | None = None,
) -> Manifest:
    """Read any supported model file or directory and write it as a ``.modelc`` file."""
    from modelc.formats import load_model

    return write_artifact(load_model(src), dest, opts, progress=progress)
