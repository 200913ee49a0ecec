"""A CUDA step's bookkeeping on the host: the int64 array a step sends the device
(:func:`step_meta`), the graph buckets decode steps are padded to (:func:`graph_rows`,
``MODELC_CUDA_GRAPH_BUCKETS=1``) and the memory check before a model is placed
(:func:`check_fits`).  Pure numpy: tested without a GPU."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from modelc.errors import CapacityError

GiB = float(1 << 30)


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


GRAPH_BUCKET = 8  # past this many sequences a decode step pads to a multiple of it


def graph_rows(n: int) -> int:
    """The rows a decode step of ``n`` sequences runs as when steps are padded to graph
    buckets: ``n`` up to :data:`GRAPH_BUCKET` (each a GEMV row count of its own), past it
    the next multiple of :data:`GRAPH_BUCKET`."""
    return n if n <= GRAPH_BUCKET else -(-n // GRAPH_BUCKET) * GRAPH_BUCKET


def step_meta(
    ids: np.ndarray[Any, Any],
    pos: np.ndarray[Any, Any],
    slices: Sequence[slice],
    caches: Sequence[tuple[int, int]],
    logit_rows: np.ndarray[Any, Any],
    m: int,
    pad_to: int = 0,
    pad_cache: tuple[int, int] = (0, 0),
) -> np.ndarray[Any, Any]:
    """The int64 array a step sends the device, 8 sections of ``m``: token ids, positions,
    each row's sequence, each sequence's cache (address, capacity), the rows whose logits
    are wanted, then the tiles (section 6, two long: filled by the caller).  Rows
    ``len(ids)`` .. ``pad_to`` - 1 (a decode step run as its graph bucket) read token 0 at
    position 0 of one more sequence, ``pad_cache`` (a one-position scratch cache: every
    padding row writes the same K/V there), and their logits are computed and unused."""
    n, k, r = len(ids), len(caches), len(logit_rows)
    if max(n, pad_to, r + max(pad_to - n, 0)) > m or k + (pad_to > n) > m:
        raise ValueError(f"a step of {max(n, pad_to)} rows does not fit meta of {m}")
    host = np.zeros(8 * m, np.int64)
    host[:n], host[m : m + n] = ids, pos
    for s, sl in enumerate(slices):
        host[2 * m + sl.start : 2 * m + sl.stop] = s
    for s, (base, cap) in enumerate(caches):
        host[3 * m + s], host[4 * m + s] = base, cap
    host[5 * m : 5 * m + r] = logit_rows
    if pad_to > n:
        host[2 * m + n : 2 * m + pad_to] = k
        host[3 * m + k], host[4 * m + k] = pad_cache
        host[5 * m + r : 5 * m + r + pad_to - n] = np.arange(n, pad_to)
    return host


def check_fits(weights: int, kv_per_seq: int, n_seqs: int, free: int, what: str) -> None:
    """CapacityError naming what would fit when weights + n_seqs caches exceed ``free``."""
    need = weights + kv_per_seq * n_seqs
    if need <= free:
        return
    fit = max(0, (free - weights) // max(kv_per_seq, 1))
    hint = (
        f"at most {fit} sequence(s) of that context fit: lower --max-concurrent or --max-context"
        if fit
        else "the weights alone do not fit; use a smaller quantization or --device cpu"
    )
    raise CapacityError(
        f"{what} needs {_gib(weights)} of weights + {n_seqs} x {_gib(kv_per_seq)} of KV cache "
        f"= {_gib(need)}, but the GPU has {_gib(free)} free; {hint}"
    )
