"""The ``.modelc`` file layout: one file, a fixed header, tensor data, then a manifest.

::

    offset 0   header (64 bytes, little-endian)
                 magic            8s   b"MODELC\\x00\\x01"
                 format_version   u32  FORMAT_VERSION
                 flags            u32  bit 0: at least one tensor is zstd-compressed
                 manifest_offset  u64  absolute offset of the manifest
                 manifest_length  u64  its length in bytes
                 data_offset      u64  absolute offset of the tensor data area (64)
                 data_length      u64  bytes of the data area (padding included)
                 manifest_crc32   u32  zlib.crc32 of the manifest bytes
                 header_crc32     u32  zlib.crc32 of the 52 header bytes before it
                 reserved         8 zero bytes
    offset 64  tensor data: each tensor's stored bytes start on a 64-byte boundary
               (an uncompressed tensor is the raw array, C order; a compressed one is
               one zstd frame, so one tensor can be loaded without touching the others)
    then       the manifest: a msgpack-encoded :class:`Manifest` (msgspec)

The manifest is written last because the tensor table (offsets, checksums) is only
known once the data has been streamed out; the header is then rewritten in place.
Tensor offsets in the table are relative to ``data_offset``.  Each tensor's
``checksum`` is the hex blake2b-128 digest of its *stored* bytes, so ``verify`` never
needs to decompress.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import numpy as np

from modelc.errors import FormatError, UnsupportedError
from modelc.formats.ir import HParams, SourceInfo, TokenizerSpec

MAGIC = b"MODELC\x00\x01"
FORMAT_VERSION = 1
HEADER_SIZE = 64
ALIGNMENT = 64
FLAG_COMPRESSED = 1

_HEADER = struct.Struct("<8sIIQQQQI")  # everything the header crc covers (52 bytes)
_CRC = struct.Struct("<I")

# pack-time quantization methods (``--quantize``) -> stored dtype name
QUANT_METHODS: dict[str, str] = {
    "fp16": "f16",
    "int8": "int8",
    "int4": "q4_1",  # int4 = 4-bit with a per-block scale and minimum: stored as GGML Q4_1 blocks
    # llama-quantize's mixes (artifact.mixes): the default type; some tensors get others
    "q8_0": "q8_0",
    "q4_0": "q4_0",
    "q4_1": "q4_1",
    "q5_0": "q5_0",
    "q5_1": "q5_1",
    "q2_k": "q2_k",
    "q3_k_s": "q3_k",
    "q3_k_m": "q3_k",
    "q3_k_l": "q3_k",
    "q4_k_s": "q4_k",
    "q4_k_m": "q4_k",
    "q5_k_s": "q5_k",
    "q5_k_m": "q5_k",
    "q6_k": "q6_k",
    "iq4_nl": "iq4_nl",
    "iq4_xs": "iq4_xs",
}


@dataclass(frozen=True, slots=True)
class Header:
    format_version: int
    flags: int
    manifest_offset: int
    manifest_length: int
    data_offset: int
    data_length: int
    manifest_crc32: int

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_COMPRESSED)

    def pack(self) -> bytes:
        body = _HEADER.pack(
            MAGIC,
            self.format_version,
            self.flags,
            self.manifest_offset,
            self.manifest_length,
            self.data_offset,
            self.data_length,
            self.manifest_crc32,
        )
        out = body + _CRC.pack(zlib.crc32(body))
        return out + b"\x00" * (HEADER_SIZE - len(out))

    @classmethod
    def unpack(cls, raw: bytes, *, path: str) -> Header:
        """Parse and check the header bytes (magic, version, crc); raise FormatError naming the problem."""
        if len(raw) < HEADER_SIZE:
            raise FormatError(
                f"truncated .modelc file: {len(raw)} bytes, shorter than the {HEADER_SIZE}-byte header",
                path=path,
            )
        if raw[:8] != MAGIC:
            raise FormatError("not a .modelc artifact (bad magic bytes)", path=path)
        body = raw[: _HEADER.size]
        (crc,) = _CRC.unpack_from(raw, _HEADER.size)
        _, version, flags, m_off, m_len, d_off, d_len, m_crc = _HEADER.unpack(body)
        if version > FORMAT_VERSION or version < 1:
            raise UnsupportedError(
                f".modelc format version {version} is not supported by this modelc "
                f"(reads version {FORMAT_VERSION}); upgrade modelc or re-pack the model",
                path=path,
            )
        if zlib.crc32(body) != crc:
            raise FormatError(
                "corrupt .modelc header (header checksum mismatch); re-pack the model", path=path
            )
        return cls(version, flags, m_off, m_len, d_off, d_len, m_crc)


NonNegative = Annotated[int, msgspec.Meta(ge=0, le=2**62)]


class TensorEntry(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One row of the tensor table."""

    name: str
    dtype: str  # a DType value
    shape: list[NonNegative]
    offset: NonNegative  # relative to the header's data_offset, a multiple of ALIGNMENT
    nbytes: NonNegative  # bytes of the tensor in memory (uncompressed)
    stored_nbytes: NonNegative  # bytes in the file (== nbytes unless compressed)
    checksum: str  # blake2b-128 hex of the stored bytes
    compression: str = "none"  # "none" | "zstd"


class PackInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What ``modelc pack`` did to the source weights."""

    quantize: str | None = None  # a QUANT_METHODS key
    quantized_tensors: int = 0  # tensors stored in --quantize's type by this pack
    # already-quantized tensors dequantized to f32 and quantized again (by --quantize to
    # another type, or by --prune to their own), and the source types they had
    requantized_tensors: int = 0
    requantized_from: list[str] = msgspec.field(default_factory=list)
    prune_threshold: float | None = None
    pruned_weights: int = 0  # number of weights set to zero by pruning
    compression: str = "none"  # "none" | "zstd"
    compression_level: int = 0


class Manifest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Everything in a .modelc file except the tensor bytes."""

    format_version: int
    architecture: str
    hparams: HParams
    source: SourceInfo
    created: str  # ISO 8601 UTC
    modelc_version: str
    tensors: list[TensorEntry]
    pack: PackInfo = msgspec.field(default_factory=PackInfo)
    tokenizer: TokenizerSpec | None = None
    chat_template: str | None = None
    generation: dict[str, Any] = msgspec.field(default_factory=dict)
    graph: dict[str, Any] | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


def _enc_hook(obj: Any) -> Any:
    """Let numpy scalars and arrays from a reader's metadata into the manifest."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise NotImplementedError(f"cannot store a {type(obj).__name__} in a .modelc manifest")


_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_decoder = msgspec.msgpack.Decoder(Manifest)


def encode_manifest(m: Manifest) -> bytes:
    return _encoder.encode(m)


def decode_manifest(raw: bytes | memoryview, *, path: str) -> Manifest:
    try:
        return _decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise FormatError(f"corrupt .modelc manifest ({e}); re-pack the model", path=path) from e


def align(n: int) -> int:
    """Round ``n`` up to the next multiple of :data:`ALIGNMENT`."""
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
