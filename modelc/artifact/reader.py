"""Open a ``.modelc`` file: memory-map it, check its layout, hand out tensors.

Opening reads only the header and the manifest and checks that every tensor's
byte range lies inside the file; tensor bytes are not touched until a tensor is
loaded.  An uncompressed tensor is a zero-copy, read-only numpy view of the
mapping; a compressed one decompresses only its own zstd frame.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import mmap
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from modelc.artifact.format import HEADER_SIZE, Header, Manifest, TensorEntry, decode_manifest
from modelc.errors import FormatError, IntegrityError, UnsupportedError
from modelc.formats.ir import NUMPY_DTYPES, DType, ModelIR, Tensor, nbytes


@dataclass
class Artifact:
    """An open ``.modelc`` file."""

    path: Path
    header: Header
    manifest: Manifest
    size: int
    _mm: mmap.mmap | None = field(repr=False, default=None)

    # -- tensors ---------------------------------------------------------------
    def entry(self, name: str) -> TensorEntry:
        for e in self.manifest.tensors:
            if e.name == name:
                return e
        raise KeyError(name)

    def stored_bytes(self, e: TensorEntry) -> memoryview:
        """The tensor's bytes as stored in the file (compressed or not), zero-copy."""
        start = self.header.data_offset + e.offset
        if self._mm is None:
            return memoryview(b"")
        return memoryview(self._mm)[start : start + e.stored_nbytes]

    def load(self, e: TensorEntry) -> np.ndarray[Any, Any]:
        """One tensor's data, in the layout :meth:`Tensor.data` documents."""
        dtype = DType(e.dtype)
        shape = tuple(e.shape)
        raw: Any = self.stored_bytes(e)
        if e.compression == "zstd":
            try:
                raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=e.nbytes)
            except zstandard.ZstdError as err:
                raise IntegrityError(
                    f"tensor {e.name}: compressed data is corrupt ({err}); run `modelc verify`",
                    path=self.path,
                ) from err
            if len(raw) != e.nbytes:
                raise IntegrityError(
                    f"tensor {e.name}: decompressed to {len(raw)} bytes, expected {e.nbytes}",
                    path=self.path,
                )
        if dtype.is_quantized:
            rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
            return (
                np.frombuffer(raw, dtype=np.uint8).reshape(rows, -1)
                if e.nbytes
                else np.zeros((rows, 0), np.uint8)
            )
        return np.frombuffer(raw, dtype=NUMPY_DTYPES[dtype]).reshape(shape)

    def to_ir(self) -> ModelIR:
        """The model as a :class:`ModelIR` whose tensors load lazily from this file."""
        m = self.manifest

        def loader(e: TensorEntry) -> Any:
            return lambda: self.load(e)

        tensors = {
            e.name: Tensor(e.name, DType(e.dtype), tuple(e.shape), loader(e)) for e in m.tensors
        }
        return ModelIR(
            architecture=m.architecture,
            hparams=m.hparams,
            tensors=tensors,
            source=m.source,
            tokenizer=m.tokenizer,
            chat_template=m.chat_template,
            generation=dict(m.generation),
            graph=m.graph,
            metadata=dict(m.metadata),
        )

    # -- summary ---------------------------------------------------------------
    @property
    def n_params(self) -> int:
        return sum(
            int(np.prod(e.shape, dtype=np.int64)) if e.shape else 1 for e in self.manifest.tensors
        )

    def close(self) -> None:
        if self._mm is not None:
            # numpy views may still use it; the mapping then goes when they do
            with contextlib.suppress(BufferError):
                self._mm.close()
            self._mm = None


def open_artifact(path: str | Path) -> Artifact:
    """Open and structurally check a ``.modelc`` file (header, manifest, tensor ranges)."""
    p = Path(path)
    try:
        f = p.open("rb")
    except FileNotFoundError as e:
        raise FormatError("no such file", path=p) from e
    except OSError as e:
        raise FormatError(f"cannot open: {e.strerror}", path=p) from e
    with f:
        size = p.stat().st_size
        head = f.read(HEADER_SIZE)
        header = Header.unpack(head, path=str(p))
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
    assert mm is not None
    try:
        manifest = _read_manifest(p, header, mm, size)
        _check_tensors(p, header, manifest, size)
    except BaseException:
        mm.close()
        raise
    return Artifact(p, header, manifest, size, mm)


def _read_manifest(p: Path, h: Header, mm: mmap.mmap, size: int) -> Manifest:
    end = h.manifest_offset + h.manifest_length
    if h.manifest_offset < HEADER_SIZE or end > size:
        raise FormatError(
            f"truncated .modelc file: the manifest should end at byte {end} but the file has {size} bytes",
            path=p,
        )
    raw = mm[h.manifest_offset : end]
    if zlib.crc32(raw) != h.manifest_crc32:
        raise IntegrityError(
            "corrupt .modelc manifest (checksum mismatch); re-pack the model", path=p
        )
    m = decode_manifest(raw, path=str(p))
    if m.format_version != h.format_version:
        raise FormatError(
            f"manifest says format version {m.format_version}, header says {h.format_version}",
            path=p,
        )
    return m


def _check_tensors(p: Path, h: Header, m: Manifest, size: int) -> None:
    data_end = h.data_offset + h.data_length
    if h.data_offset < HEADER_SIZE or data_end > size:
        raise FormatError(
            f"truncated .modelc file: the tensor data should end at byte {data_end} but the file has "
            f"{size} bytes",
            path=p,
        )
    for e in m.tensors:
        try:
            dtype = DType(e.dtype)
        except ValueError as err:
            raise UnsupportedError(f"tensor {e.name}: unknown dtype {e.dtype!r}", path=p) from err
        if math.prod(e.shape) > 2**48:
            raise FormatError(f"tensor {e.name}: implausible shape {e.shape}", path=p)
        try:
            want = nbytes(dtype, tuple(e.shape))
        except ValueError as err:
            raise FormatError(f"tensor {e.name}: {err}", path=p) from err
        if e.nbytes != want:
            raise FormatError(
                f"tensor {e.name}: table says {e.nbytes} bytes, {e.dtype} {e.shape} needs {want}",
                path=p,
            )
        if e.compression not in ("none", "zstd"):
            raise UnsupportedError(
                f"tensor {e.name}: unknown compression {e.compression!r}", path=p
            )
        if e.compression == "none" and e.stored_nbytes != e.nbytes:
            raise FormatError(f"tensor {e.name}: stored size differs from its size", path=p)
        if e.offset < 0 or e.offset + e.stored_nbytes > h.data_length:
            raise FormatError(
                f"tensor {e.name}: its bytes {e.offset}..{e.offset + e.stored_nbytes} lie outside the "
                f"data area (0..{h.data_length}); the file is truncated or corrupt",
                path=p,
            )
    spans = sorted((e.offset, e.offset + e.stored_nbytes, e.name) for e in m.tensors)
    for (_, end, a), (start, _, b) in itertools.pairwise(spans):
        if start < end:  # a writer never shares bytes between tensors: a crafted file
            raise FormatError(
                f"tensors {a} and {b} overlap in the data area; the file is corrupt", path=p
            )


def load_artifact(path: str | Path) -> ModelIR:
    """Open a ``.modelc`` file and return its model (tensors memory-mapped, loaded lazily)."""
    return open_artifact(path).to_ir()


@dataclass(frozen=True, slots=True)
class VerifyReport:
    path: Path
    tensors: int
    bytes_checked: int


def verify_artifact(path: str | Path) -> VerifyReport:
    """Check header, manifest, tensor ranges and every tensor checksum; raise IntegrityError naming the tensor."""
    art = open_artifact(path)
    try:
        checked = 0
        bad: list[str] = []
        for e in art.manifest.tensors:
            digest = hashlib.blake2b(art.stored_bytes(e), digest_size=16).hexdigest()
            checked += e.stored_nbytes
            if digest != e.checksum:
                bad.append(e.name)
        if bad:
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            raise IntegrityError(
                f"checksum mismatch in tensor {', '.join(bad[:3])}{more}; the file is corrupt, "
                "re-pack or re-pull the model",
                path=art.path,
            )
        return VerifyReport(art.path, len(art.manifest.tensors), checked)
    finally:
        art.close()
