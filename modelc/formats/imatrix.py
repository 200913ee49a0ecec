"""llama.cpp importance-matrix files (``llama-imatrix`` output) -> per-tensor weights.

Two formats, both read as ``llama-quantize --imatrix`` reads them (tools/quantize):

* GGUF (``general.type = imatrix``): per weight matrix ``NAME.in_sum2`` (f32, one row of
  column sums of squared activations per expert) and ``NAME.counts`` (f32, the tokens
  each row saw); the weights are ``in_sum2 / round(count)``, or 1 where a count is 0.
* legacy ``.dat``: int32 entry count, then per entry int32 name length, the name, int32
  ``ncall``, int32 ``nval`` and ``nval`` f32 sums; the weights are ``sums / ncall``.

Either way the result maps a tensor name (``blk.0.attn_q.weight``) to float32
``(n_expert, n_per_row)`` weights, one row per expert (one row for a dense matrix).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from modelc.errors import FormatError

__all__ = ["load_imatrix"]

Array = np.ndarray[Any, Any]


def load_imatrix(path: str | Path) -> dict[str, Array]:
    """The importance weights in ``path`` by tensor name, as llama-quantize computes them."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise FormatError(f"cannot read the importance matrix: {e}", path=str(p)) from e
    return _load_gguf(p) if magic == b"GGUF" else _load_legacy(p)


def _load_gguf(p: Path) -> dict[str, Array]:
    from gguf import GGMLQuantizationType, GGUFReader

    try:
        r = GGUFReader(p)
    except (ValueError, OSError) as e:
        raise FormatError(f"not a readable imatrix GGUF: {e}", path=str(p)) from e
    sums: dict[str, Array] = {}
    counts: dict[str, Array] = {}
    for t in r.tensors:
        if t.tensor_type != GGMLQuantizationType.F32:
            raise FormatError(f"imatrix tensor {t.name} is not f32", path=str(p))
        data = np.asarray(t.data, dtype=np.float32)
        if t.name.endswith(".in_sum2"):
            ne0 = int(t.shape[0])  # GGML order: ne0 = the row length
            sums[t.name[: -len(".in_sum2")]] = data.reshape(-1, ne0)
        elif t.name.endswith(".counts"):
            counts[t.name[: -len(".counts")]] = data.reshape(-1)
    out: dict[str, Array] = {}
    for name, s in sums.items():
        if name not in counts or counts[name].size != s.shape[0]:
            raise FormatError(f"imatrix sums and counts of {name} do not match", path=str(p))
        c = np.floor(counts[name] + np.float32(0.5))  # lround of a count >= 0
        w = np.ones_like(s)
        seen = c > 0
        w[seen] = s[seen] / c[seen, None]
        out[name] = w
    if not out:
        raise FormatError("the imatrix GGUF holds no *.in_sum2 tensors", path=str(p))
    return out


def _load_legacy(p: Path) -> dict[str, Array]:
    buf = p.read_bytes()
    out: dict[str, Array] = {}
    try:
        (n,) = struct.unpack_from("<i", buf, 0)
        pos = 4
        if n < 1:
            raise ValueError("no entries")
        for _ in range(n):
            (ln,) = struct.unpack_from("<i", buf, pos)
            name = buf[pos + 4 : pos + 4 + ln].decode()
            pos += 4 + ln
            ncall, nval = struct.unpack_from("<ii", buf, pos)
            pos += 8
            if nval < 1 or pos + 4 * nval > len(buf):
                raise ValueError(f"bad value count for {name}")
            sums = np.frombuffer(buf, np.float32, nval, pos).copy()
            pos += 4 * nval
            out[name] = (sums / np.float32(ncall) if ncall > 0 else sums).reshape(1, -1)
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise FormatError(f"not a llama.cpp imatrix file (GGUF or .dat): {e}", path=str(p)) from e
    return out
