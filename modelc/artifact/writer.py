"""Write a :class:`ModelIR` to a ``.modelc`` file, streaming one tensor at a time.

Peak memory stays far below the model size: each tensor is read from its (usually
memory-mapped) source in row blocks of about 4 MB, each block pruned, quantized,
checksummed, compressed (one zstd frame per tensor, fed block by block) and written,
and the source pages of a written block are handed back to the kernel.  Measured in
``bench/pack_memory.py`` / ``bench/RESULTS.md``.  The file is written to a temp file in the destination
directory, fsynced and renamed, so a failed or interrupted pack leaves nothing.
"""

from __future__ import annotations

import datetime
import hashlib
import mmap
import zlib
from collections.abc import Callable, Iterator
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
from modelc.artifact.mixes import MIXES, tensor_types
from modelc.artifact.transform import (
    can_store_as,
    is_weight_matrix,
    prune,
    quantize,
    requantize_target,
    target_dtype,
    to_f32,
)
from modelc.errors import FormatError, UsageError
from modelc.formats.imatrix import load_imatrix
from modelc.formats.ir import NUMPY_DTYPES, DType, ModelIR, Tensor, nbytes

# (bytes done, bytes total, tensor name)
ProgressFn = Callable[[int, int, str], None]


@dataclass(frozen=True, slots=True)
class PackOptions:
    """What ``modelc pack`` does to the weights on the way into the artifact."""

    compress: bool = False
    compression_level: int = 3  # zstandard level, 1..22 (3..19 sensible)
    quantize: str | None = (
        None  # a QUANT_METHODS key: fp16 | int8 | int4 | q8_0 | q4_0 | q4_k_m ...
    )
    prune: float | None = None  # zero |w| < prune in weight matrices, before quantizing
    imatrix: str | None = None  # llama.cpp importance-matrix file steering the quantizer

    def check(self) -> None:
        if self.quantize is not None and self.quantize not in QUANT_METHODS:
            raise UsageError(
                f"unknown quantization {self.quantize!r}; choose one of {', '.join(QUANT_METHODS)}"
            )
        if not 1 <= self.compression_level <= 22:
            raise UsageError(f"compression level must be 1..22, got {self.compression_level}")
        if self.imatrix is not None and self.quantize not in MIXES:
            raise UsageError(
                f"--imatrix steers llama-quantize's mixes only ({', '.join(MIXES)}); "
                "add --quantize q4_k_m (or another)"
            )
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


_CHUNK_BYTES = 1 << 22  # tensors are transformed and written in row blocks of about 4 MB


def _target(t: Tensor, opts: PackOptions, plan: dict[str, DType] | None) -> DType | None:
    """The dtype ``--quantize`` (or ``--prune``, on a quantized matrix) turns this tensor
    into, or None to keep its own.  ``plan``: a llama-quantize mix's types (artifact.mixes)."""
    if plan is not None:
        target = plan.get(t.name)
        if target is None or (target is t.dtype and not opts.prune):
            return None
        return target
    if t.dtype.is_quantized:
        return requantize_target(t.name, t.dtype, t.shape, opts.quantize, opts.prune)
    if not opts.quantize or not is_weight_matrix(t.name, t.dtype, t.shape):
        return None
    target = target_dtype(opts.quantize)
    if target is t.dtype or not can_store_as(target, t.shape):
        return None
    return target


def _plan(ir: ModelIR, opts: PackOptions) -> dict[str, DType] | None:
    """Each tensor's type under a llama-quantize mix (its rules), None for other methods."""
    if opts.quantize not in MIXES:
        return None
    shapes = ((t.name, t.shape) for t in ir.tensors.values())
    return tensor_types(
        shapes, opts.quantize, ir.architecture, ir.hparams, has_imatrix=opts.imatrix is not None
    )


def _imatrix_rows(
    t: Tensor, weights: dict[str, np.ndarray[Any, Any]] | None
) -> np.ndarray[Any, Any] | None:
    """This tensor's importance weights, (n_expert, cols), or None where the file has none
    (llama-quantize then quantizes without, as here)."""
    if weights is None or t.name not in weights:
        return None
    w = weights[t.name]
    experts = t.shape[0] if len(t.shape) == 3 else 1
    if w.size != experts * t.shape[-1]:
        if t.name in ("token_embd.weight", "per_layer_token_embd.weight"):
            return None
        raise UsageError(
            f"the importance matrix has {w.size} weights for {t.name}, which needs "
            f"{experts * t.shape[-1]}: it was computed for another model"
        )
    return w.reshape(experts, t.shape[-1])


def _quantize_block(
    t: Tensor, x: np.ndarray[Any, Any], target: DType, r0: int, im: np.ndarray[Any, Any] | None
) -> np.ndarray[Any, Any]:
    """Quantize rows r0.. of the tensor's (rows, -1) view: each expert of a 3-D tensor with
    its own importance weights."""
    cols = t.shape[-1]
    if im is None:
        return quantize(x.reshape(-1, cols), target).reshape(x.shape[0], -1)
    if len(t.shape) == 3:  # a row of the view is one expert
        parts = [quantize(x[i].reshape(-1, cols), target, im[r0 + i]) for i in range(len(x))]
        return np.stack(parts).reshape(x.shape[0], -1)
    return quantize(x.reshape(-1, cols), target, im[0])


def _chunks(
    t: Tensor,
    data: np.ndarray[Any, Any],
    target: DType | None,
    opts: PackOptions,
    info: PackInfo,
    im: np.ndarray[Any, Any] | None = None,
) -> Iterator[np.ndarray[Any, Any]]:
    """The tensor's stored bytes as row blocks, pruned and quantized block by block.

    Working on ~4 MB of rows at a time keeps the transform's temporaries small: peak
    memory is one block, not a multiple of the tensor.  Untransformed tensors are
    yielded as views of the (memory-mapped) source.  A quantized source (uint8 rows of
    blocks) is dequantized to f32 block by block before it is pruned and requantized.
    """
    if data.size == 0:
        return
    rows_view = data.reshape(data.shape[0], -1) if data.ndim >= 2 else data.reshape(1, -1)
    transform = target is not None or (opts.prune and is_weight_matrix(t.name, t.dtype, t.shape))
    row_nbytes = max(1, t.shape[-1] * 4 if transform else rows_view.shape[1] * rows_view.itemsize)
    step = max(1, _CHUNK_BYTES // row_nbytes)
    for r0 in range(0, rows_view.shape[0], step):
        src = x = rows_view[r0 : r0 + step]
        if not transform:
            yield x
            _drop_source_pages(src)
            continue
        if t.dtype is DType.BF16 or t.dtype.is_quantized:
            x = to_f32(x, t.dtype, (x.shape[0], t.shape[-1]))
        if opts.prune:
            x, n = prune(x, opts.prune)
            info.pruned_weights += n
        if target is not None:
            yield _quantize_block(t, x, target, r0, im)
        elif t.dtype is DType.BF16:  # pruned only: back to bf16 bits, exact (values came from bf16)
            yield (np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(
                np.uint16
            )
        else:
            yield x
        _drop_source_pages(src)


def _drop_source_pages(data: np.ndarray[Any, Any]) -> None:
    """Let the kernel unmap a written tensor's pages from a memory-mapped source.

    Pages of a read-only file mapping count as resident once touched, so without this
    packing a memory-mapped model would look like it needs the model's size in RAM.
    ``MADV_DONTNEED`` on a file mapping only drops this process's page-table entries
    (the data is re-read from the page cache if touched again); best effort.
    """
    base: Any = data
    while base is not None and not isinstance(base, mmap.mmap):
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    if base is None or not hasattr(mmap, "MADV_DONTNEED") or len(base) == 0 or data.nbytes == 0:
        return
    try:
        origin = np.frombuffer(base, np.uint8, count=1).ctypes.data
        offset = data.ctypes.data - origin
        start = offset // mmap.PAGESIZE * mmap.PAGESIZE
        end = min(len(base), offset + data.nbytes)
        if 0 <= start < end:
            base.madvise(mmap.MADV_DONTNEED, start, end - start)
    except (ValueError, OSError, BufferError):
        pass


def _as_bytes(data: np.ndarray[Any, Any]) -> memoryview:
    arr = np.ascontiguousarray(data)
    return arr.reshape(-1).view(np.uint8).data


def _write_tensor(
    f: BinaryIO,
    t: Tensor,
    chunks: Iterator[np.ndarray[Any, Any]],
    n: int,
    compressor: zstandard.ZstdCompressor | None,
) -> tuple[int, str]:
    """Stream one tensor's chunks to ``f`` (one zstd frame if compressing); return (stored bytes, checksum)."""
    h = hashlib.blake2b(digest_size=16)
    cobj = compressor.compressobj(size=n) if compressor is not None and n else None
    stored = raw = 0
    for chunk in chunks:
        b = _as_bytes(chunk)
        raw += b.nbytes
        out: bytes | memoryview = cobj.compress(b) if cobj is not None else b
        if len(out):
            f.write(out)
            h.update(out)
            stored += len(out) if isinstance(out, bytes) else out.nbytes
    if cobj is not None:
        tail = cobj.flush()
        f.write(tail)
        h.update(tail)
        stored += len(tail)
    assert raw == n, (t.name, raw, n)
    return stored, h.hexdigest()


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
    # every tensor's fate first, so a refusal (UsageError) comes before any writing
    plan = _plan(ir, opts)
    targets = {t.name: _target(t, opts, plan) for t in ir.tensors.values()}
    weights = load_imatrix(opts.imatrix) if opts.imatrix is not None else None
    with atomic_output(dest) as f:
        f.write(b"\x00" * HEADER_SIZE)
        pos = 0  # relative to the data area
        for t in ir.tensors.values():
            data = _checked_data(t, ir.source.path)
            target = targets[t.name]
            dtype = target or t.dtype
            if target is not None and opts.quantize:
                info.quantized_tensors += 1
            if target is not None and t.dtype.is_quantized:
                info.requantized_tensors += 1
                if t.dtype.value not in info.requantized_from:
                    info.requantized_from.append(t.dtype.value)
            n = nbytes(dtype, t.shape)
            im = _imatrix_rows(t, weights) if target is not None else None
            comp = compressor if opts.compress and n else None
            size, digest = _write_tensor(f, t, _chunks(t, data, target, opts, info, im), n, comp)
            entries.append(
                TensorEntry(
                    name=t.name,
                    dtype=dtype.value,
                    shape=list(t.shape),
                    offset=pos,
                    nbytes=n,
                    stored_nbytes=size,
                    checksum=digest,
                    compression="zstd" if comp is not None else "none",
                )
            )
            pos = _pad(f, pos + size)
            del data
            done += t.nbytes
            if progress:
                progress(done, total, t.name)
        info.requantized_from.sort()
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
