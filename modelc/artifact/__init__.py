"""The ``.modelc`` artifact: one file holding a packed model (see :mod:`modelc.artifact.format`).

* :func:`write_artifact` / :func:`pack_file`  stream a model into a ``.modelc`` file
* :func:`open_artifact` / :func:`load_artifact`  memory-map one and get a :class:`ModelIR`
* :func:`verify_artifact`  check every checksum
* :func:`export_safetensors`  write the weights back out (dequantized)
"""

from __future__ import annotations

from modelc.artifact.export import export_safetensors
from modelc.artifact.format import MAGIC, QUANT_METHODS, Manifest, PackInfo, TensorEntry
from modelc.artifact.reader import (
    Artifact,
    VerifyReport,
    load_artifact,
    open_artifact,
    verify_artifact,
)
from modelc.artifact.writer import PackOptions, pack_file, write_artifact

__all__ = [
    "MAGIC",
    "QUANT_METHODS",
    "Artifact",
    "Manifest",
    "PackInfo",
    "PackOptions",
    "TensorEntry",
    "VerifyReport",
    "export_safetensors",
    "load_artifact",
    "open_artifact",
    "pack_file",
    "verify_artifact",
    "write_artifact",
]


def is_artifact(path: object) -> bool:
    """True if ``path`` is a file starting with the .modelc magic bytes."""
    from pathlib import Path

    p = Path(str(path))
    try:
        with p.open("rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False
