"""Format readers: each turns one kind of model file into a :class:`~modelc.formats.ir.ModelIR`.

``load_model(path)`` sniffs the file (magic bytes, not the extension) and dispatches.
"""

from __future__ import annotations

from pathlib import Path

from modelc.errors import FormatError
from modelc.formats.ir import ModelIR

__all__ = ["ModelIR", "detect_format", "load_model"]


def detect_format(path: Path) -> str:
    """Return ``gguf``, ``safetensors``, ``pytorch``, ``onnx`` or ``hf-dir`` for ``path``."""
    if path.is_dir():
        return "hf-dir"
    if not path.exists():
        raise FormatError("no such file or directory", path=path)
    with path.open("rb") as f:
        head = f.read(16)
    if len(head) < 8:
        raise FormatError(f"file is too short ({len(head)} bytes) to be a model", path=path)
    if head[:4] == b"GGUF":
        return "gguf"
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":
        # zip checkpoints; a bare pickle (legacy torch.save) goes there too for its re-save hint
        return "pytorch"
    if head[:8] == b"MODELC\x00\x01":
        return "modelc"
    header_len = int.from_bytes(head[:8], "little")
    if 2 <= header_len < 100_000_000 and head[8:9] == b"{":
        return "safetensors"
    if path.suffix == ".onnx" or head[:1] in (b"\x08",):
        return "onnx"
    raise FormatError(
        "not a recognised model file (expected GGUF, safetensors, a PyTorch zip checkpoint, "
        "ONNX, or a Hugging Face model directory)",
        path=path,
    )


def load_model(path: str | Path) -> ModelIR:
    """Read any supported model file or Hugging Face directory into the IR."""
    p = Path(path)
    fmt = detect_format(p)
    if fmt == "gguf":
        from modelc.formats.gguf import load_gguf

        return load_gguf(p)
    if fmt == "safetensors":
        from modelc.formats.safetensors import load_safetensors

        return load_safetensors(p)
    if fmt == "pytorch":
        from modelc.formats.pytorch import load_pytorch

        return load_pytorch(p)
    if fmt == "onnx":
        from modelc.formats.onnx import load_onnx

        return load_onnx(p)
    if fmt == "hf-dir":
        from modelc.formats.hf import load_hf_dir

        return load_hf_dir(p)
    raise FormatError(f"{fmt} files are opened with modelc.artifact, not read as a source", path=p)
