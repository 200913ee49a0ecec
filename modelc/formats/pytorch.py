"""PyTorch zip checkpoints (``torch.save`` since 1.6), read without torch and without running pickled code.

A checkpoint is an uncompressed zip: ``<prefix>/data.pkl`` (the pickled object tree) and one
member ``<prefix>/data/<key>`` per storage.  The pickle is read by :class:`_SafeUnpickler`,
whose ``find_class`` admits only the handful of globals tensor rebuilding needs, all bound to
modelc's own harmless stand-ins; anything else (``os.system``, ``builtins.eval``...) raises
:class:`UnsafePickleError` before it could be called.  Storages are memory-mapped straight out
of the zip (members are stored, not deflated), so tensors sharing a storage (tied weights)
are views of the same bytes; a member its zip writer left at an offset its elements cannot
be read at (``torch.save`` pads to 64 bytes, other writers do not) is copied once instead.
"""

from __future__ import annotations

import io
import math
import pickle
import sys
import zipfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from modelc.errors import FormatError, UnsafePickleError, UnsupportedError
from modelc.formats.arch import build_model_ir, sibling_config
from modelc.formats.ir import NUMPY_DTYPES, DType, ModelIR, SourceInfo, Tensor, aligned

_STORAGES: dict[str, DType | None] = {
    "FloatStorage": DType.F32,
    "HalfStorage": DType.F16,
    "BFloat16Storage": DType.BF16,
    "DoubleStorage": DType.F64,
    "LongStorage": DType.I64,
    "IntStorage": DType.I32,
    "ShortStorage": DType.I16,
    "CharStorage": DType.I8,
    "ByteStorage": DType.U8,
    "BoolStorage": DType.BOOL,
    # valid torch storages modelc cannot use: admitted by the unpickler, refused when used
    "ComplexFloatStorage": None,
    "ComplexDoubleStorage": None,
    "QInt8Storage": None,
    "QUInt8Storage": None,
    "QInt32Storage": None,
}
_LEGACY_HINT = (
    "is not a zip-format PyTorch checkpoint (legacy pre-1.6 serialization or not PyTorch at all); "
    "re-save it with torch>=1.6: torch.save(torch.load(path), new_path), or convert it to safetensors"
)


# no tensor dimension, stride or offset is this large in a real checkpoint (2**40)
_MAX_DIM = 1 << 40
# what zipfile raises on a damaged archive (an unknown version or compression method is a
# NotImplementedError, a bad deflate stream a zlib.error)
_ZIP_ERRORS = (zipfile.BadZipFile, NotImplementedError, zlib.error, OSError, EOFError)


def _refuse_setstate(obj: object) -> None:
    raise UnsafePickleError(f"pickle tried to set the state of a {type(obj).__name__}; refused")


@dataclass(frozen=True, slots=True)
class _StorageType:
    """Stand-in for ``torch.FloatStorage`` etc.: carries the dtype, refuses to be called."""

    name: str
    dtype: DType | None

    def __setstate__(self, state: object) -> None:
        _refuse_setstate(self)

    def __call__(self, *args: object) -> None:
        raise UnsafePickleError(
            f"pickle tried to call torch.{self.name}; only tensor rebuilding is allowed"
        )


@dataclass(frozen=True, slots=True)
class _Storage:
    key: str
    dtype: DType
    numel: int
    reader: _ZipStorages = field(repr=False)

    def __setstate__(self, state: object) -> None:
        _refuse_setstate(self)

    def array(self) -> np.ndarray[Any, Any]:
        return self.reader.array(self)


@dataclass(frozen=True, slots=True)
class _TensorRef:
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    def __setstate__(self, state: object) -> None:
        _refuse_setstate(self)


def _rebuild_tensor_v2(
    storage: _Storage,
    storage_offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool = False,
    backward_hooks: object = None,
    metadata: object = None,
) -> _TensorRef:
    if not isinstance(storage, _Storage):
        raise UnsafePickleError("torch._utils._rebuild_tensor_v2 called without a storage")
    shape, strides = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    if len(shape) != len(strides) or min(shape, default=0) < 0:
        raise FormatError(f"tensor with size {shape} and stride {strides} is malformed")
    if max((*shape, *(abs(s) for s in strides), abs(int(storage_offset))), default=0) > _MAX_DIM:
        raise FormatError(
            f"tensor with size {shape} and stride {strides} is implausibly large "
            "(corrupt checkpoint)"
        )
    return _TensorRef(storage, int(storage_offset), shape, strides)


def _rebuild_parameter(
    data: _TensorRef, requires_grad: bool = False, backward_hooks: object = None
) -> _TensorRef:
    return data


def _rebuild_parameter_with_state(
    data: _TensorRef, requires_grad: bool, backward_hooks: object, state: object
) -> _TensorRef:
    return data


_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter_with_state,
    **{("torch", name): _StorageType(name, dt) for name, dt in _STORAGES.items()},
}


class _SafeUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, storages: _ZipStorages) -> None:
        super().__init__(io.BytesIO(data))
        self.storages = storages

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"refusing to load: the pickle references {module}.{name}, which is not needed to "
                "rebuild tensors (a malicious or non-weights checkpoint); nothing was executed. "
                "Use a safetensors file or a plain state_dict checkpoint",
                path=self.storages.path,
            ) from None

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise FormatError(
                f"unexpected persistent id {str(pid)[:80]!r} in data.pkl", path=self.storages.path
            )
        _, stype, key, _location, numel = pid
        if not isinstance(stype, _StorageType):
            raise UnsafePickleError(
                f"storage type {stype!r} is not a torch storage class", path=self.storages.path
            )
        if stype.dtype is None:
            raise UnsupportedError(
                f"tensor storage torch.{stype.name} is not supported", path=self.storages.path
            )
        return self.storages.get(str(key), stype.dtype, int(numel))


class _ZipStorages:
    """Storages of one checkpoint, memory-mapped from the zip members on first use."""

    def __init__(self, path: Path, zf: zipfile.ZipFile, prefix: str) -> None:
        self.path, self.prefix = path, prefix
        self.infos = {i.filename: i for i in zf.infolist()}
        self.cache: dict[str, _Storage] = {}
        self.arrays: dict[str, np.ndarray[Any, Any]] = {}

    def get(self, key: str, dtype: DType, numel: int) -> _Storage:
        if key not in self.cache:
            name = f"{self.prefix}data/{key}"
            info = self.infos.get(name)
            if info is None:
                raise FormatError(
                    f"storage member {name!r} is missing from the zip", path=self.path
                )
            need = numel * NUMPY_DTYPES[dtype].itemsize
            if info.file_size < need:
                raise FormatError(
                    f"storage {name!r} has {info.file_size} bytes, fewer than its {numel} elements need",
                    path=self.path,
                )
            self.cache[key] = _Storage(key, dtype, numel, self)
        return self.cache[key]

    def array(self, st: _Storage) -> np.ndarray[Any, Any]:
        if st.key in self.arrays:
            return self.arrays[st.key]
        info = self.infos[f"{self.prefix}data/{st.key}"]
        dtype = NUMPY_DTYPES[st.dtype]
        nbytes = st.numel * dtype.itemsize
        if info.compress_type == zipfile.ZIP_STORED:
            with self.path.open("rb") as f:
                f.seek(info.header_offset)
                local = f.read(30)
            if local[:4] != b"PK\x03\x04":
                raise FormatError(f"corrupt zip local header for {info.filename!r}", path=self.path)
            start = info.header_offset + 30 + int.from_bytes(local[26:28], "little")
            start += int.from_bytes(local[28:30], "little")
            if start + nbytes > self.path.stat().st_size:
                raise FormatError(
                    f"storage {info.filename!r} runs past the end of the file (corrupt zip)",
                    path=self.path,
                )
            if nbytes == 0:
                arr: np.ndarray[Any, Any] = np.zeros(0, dtype)
            else:
                # mapped in place, unless the zip writer left it misaligned (not torch.save)
                arr = aligned(
                    np.memmap(self.path, dtype=dtype, mode="r", offset=start, shape=(st.numel,))
                )
        else:  # a re-zipped checkpoint: read the member
            try:
                with zipfile.ZipFile(self.path) as zf:
                    arr = aligned(np.frombuffer(zf.read(info)[:nbytes], dtype=dtype))
            except (*_ZIP_ERRORS, ValueError) as e:
                raise FormatError(
                    f"cannot read storage {info.filename!r}: {e}", path=self.path
                ) from e
        self.arrays[st.key] = arr
        return arr


def _materialize(ref: _TensorRef, path: Path, name: str) -> np.ndarray[Any, Any]:
    base = ref.storage.array()
    n = math.prod(ref.size)  # Python ints: exact, never wraps around
    if n == 0:
        return np.zeros(ref.size, base.dtype)
    last = ref.offset + sum((d - 1) * s for d, s in zip(ref.size, ref.stride, strict=True))
    if ref.offset < 0 or min(ref.stride, default=0) < 0 or last >= base.shape[0]:
        raise FormatError(
            f"tensor {name!r} reaches outside its storage (corrupt checkpoint)", path=path
        )
    contiguous = tuple(math.prod(ref.size[i + 1 :]) for i in range(len(ref.size)))
    if ref.stride == contiguous:
        return base[ref.offset : ref.offset + n].reshape(ref.size)
    view = np.lib.stride_tricks.as_strided(
        base[ref.offset :],
        shape=ref.size,
        strides=[s * base.itemsize for s in ref.stride],
        writeable=False,
    )
    return np.ascontiguousarray(view)


def _flatten(obj: Any, prefix: str, out: dict[str, _TensorRef]) -> None:
    if isinstance(obj, _TensorRef):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)


def read_pytorch(path: str | Path) -> dict[str, Tensor]:
    """Read a zip-format ``torch.save`` checkpoint into lazy tensors keyed by their state_dict names."""
    path = Path(path)
    if not path.exists():
        raise FormatError("no such file", path=path)
    try:
        is_zip = zipfile.is_zipfile(path)
    except _ZIP_ERRORS as e:  # is_zipfile itself gives up on some damaged directories
        raise FormatError(f"cannot read PyTorch checkpoint: {e}", path=path) from e
    if not is_zip:
        raise FormatError(_LEGACY_HINT, path=path)
    try:
        with zipfile.ZipFile(path) as zf:
            obj = _unpickle(path, zf)
    except FormatError as e:
        if e.path is None:  # raised inside the unpickler, which does not know the file
            raise type(e)(str(e), path=path) from e
        raise
    except _ZIP_ERRORS as e:
        raise FormatError(f"cannot read PyTorch checkpoint: {e}", path=path) from e
    except (pickle.UnpicklingError, ValueError, TypeError, AttributeError, IndexError) as e:
        raise FormatError(f"data.pkl is not a valid checkpoint pickle ({e})", path=path) from e
    for wrapper in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(wrapper), dict):
            obj = obj[wrapper]
            break
    refs: dict[str, _TensorRef] = {}
    _flatten(obj, "", refs)
    if not refs:
        raise FormatError("checkpoint holds no tensors", path=path)
    return {name: _tensor(name, ref, path) for name, ref in refs.items()}


def _unpickle(path: Path, zf: zipfile.ZipFile) -> Any:
    """Run the restricted unpickler over ``<prefix>/data.pkl``."""
    names = zf.namelist()
    pkls = [n for n in names if n.endswith("data.pkl") and n.count("/") == 1]
    if not pkls:
        raise FormatError("zip has no <name>/data.pkl member; " + _LEGACY_HINT, path=path)
    prefix = pkls[0][: -len("data.pkl")]
    if prefix + "byteorder" in names and zf.read(prefix + "byteorder").strip() != b"little":
        raise UnsupportedError("big-endian PyTorch checkpoints are not supported", path=path)
    storages = _ZipStorages(path, zf, prefix)
    return _SafeUnpickler(zf.read(pkls[0]), storages).load()


def _tensor(name: str, ref: _TensorRef, path: Path) -> Tensor:
    def load() -> np.ndarray[Any, Any]:
        return _materialize(ref, path, name)

    return Tensor(name, ref.storage.dtype, ref.size, load)


def load_pytorch(path: str | Path) -> ModelIR:
    """Read a single zip-format PyTorch checkpoint (with a ``config.json`` beside it, if any)."""
    path = Path(path)
    raw = read_pytorch(path)
    source = SourceInfo(path=str(path), format="pytorch", size=path.stat().st_size)
    return build_model_ir(raw, sibling_config(path), source)


assert sys.byteorder == "little", "modelc reads little-endian tensor data in place"
