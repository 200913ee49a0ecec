"""A GGUF file's manifest: its metadata key/values and, per tensor, name, type, shape
and the sha256 of its bytes.

``scripts/make_tiny_<family>.py`` records the manifest of the GGUF that llama.cpp's own
``convert_hf_to_gguf.py`` writes for a tiny model's HF directory; the tests compare the
GGUF ``tests/gen_<family>.py`` writes for the same weights with it (:func:`differences`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

# long arrays (the vocabulary) are recorded as the sha256 of their JSON
_LONG = 16
# set by the writer, not by the model: the file's name, the converter's version stamp
IGNORED = frozenset({"general.name", "general.size_label", "general.quantization_version"})


@dataclass(frozen=True)
class Tensor:
    name: str
    type: str  # the GGML type's name
    shape: list[int]  # as GGUF stores it (rows last: reversed, numpy's order)
    sha256: str  # of its bytes


def read(
    path: Path, keep: Callable[[str], bool], digits: int | None = 7, prefix: str = "sha256:"
) -> tuple[dict[str, Any], list[Tensor]]:
    """A GGUF's metadata (the keys ``keep`` accepts; long arrays as ``prefix`` and the
    sha256 of their JSON, floats rounded to ``digits``) and its tensors: what every
    goldens' manifest below is a view of."""
    r = gguf.GGUFReader(str(path))
    meta: dict[str, Any] = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or not keep(k):
            continue
        v = f.contents()
        if isinstance(v, list) and len(v) > _LONG:
            v = prefix + hashlib.sha256(json.dumps(v).encode()).hexdigest()
        elif isinstance(v, float) and digits is not None:
            v = round(v, digits)
        meta[k] = v
    tensors = [
        Tensor(
            t.name,
            t.tensor_type.name,
            [int(n) for n in t.shape],
            hashlib.sha256(t.data.tobytes()).hexdigest(),
        )
        for t in r.tensors
    ]
    return meta, tensors


def manifest(path: Path) -> dict[str, Any]:
    """The manifest ``scripts/make_tiny_<family>.py`` records: tensors sorted by name,
    shapes in numpy's order."""
    meta, tensors = read(path, lambda k: k not in IGNORED)
    rows = [
        {"name": t.name, "type": t.type, "shape": t.shape[::-1], "sha256": t.sha256}
        for t in sorted(tensors, key=lambda t: t.name)
    ]
    return {"metadata": meta, "tensors": rows}


def differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """What differs between two manifests, one line each (empty: the same file content)."""
    out = []
    a, b = ours["metadata"], theirs["metadata"]
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            out.append(f"{k}: ours {a.get(k)!r}, converter {b.get(k)!r}")
    ta = {t["name"]: t for t in ours["tensors"]}
    tb = {t["name"]: t for t in theirs["tensors"]}
    for n in sorted(set(ta) | set(tb)):
        if ta.get(n) != tb.get(n):
            out.append(f"tensor {n}: ours {ta.get(n)}, converter {tb.get(n)}")
    return out
