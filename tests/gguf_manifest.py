"""A GGUF file's manifest: its metadata key/values and, per tensor, name, type, shape
and the sha256 of its bytes.

``scripts/make_tiny_<family>.py`` records the manifest of the GGUF that llama.cpp's own
``convert_hf_to_gguf.py`` writes for a tiny model's HF directory; the tests compare the
GGUF ``tests/gen_<family>.py`` writes for the same weights with it (:func:`differences`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import gguf

# long arrays (the vocabulary) are recorded as the sha256 of their JSON
_LONG = 16
# set by the writer, not by the model: the file's name, the converter's version stamp
IGNORED = frozenset({"general.name", "general.size_label", "general.quantization_version"})


def _value(field: gguf.ReaderField) -> Any:
    v = field.contents()
    if isinstance(v, list) and len(v) > _LONG:
        return "sha256:" + hashlib.sha256(json.dumps(v).encode()).hexdigest()
    if isinstance(v, float):
        return round(v, 7)
    return v


def manifest(path: Path) -> dict[str, Any]:
    r = gguf.GGUFReader(str(path))
    meta = {
        k: _value(f) for k, f in r.fields.items() if not k.startswith("GGUF.") and k not in IGNORED
    }
    tensors = [
        {
            "name": t.name,
            "type": t.tensor_type.name,
            "shape": [int(n) for n in reversed(t.shape)],  # rows last, as numpy
            "sha256": hashlib.sha256(bytes(t.data.tobytes())).hexdigest(),
        }
        for t in r.tensors
    ]
    return {"metadata": meta, "tensors": sorted(tensors, key=lambda t: t["name"])}


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
