"""A CUDA step's bookkeeping on the host: the int64 array a step sends the device
(:func:`step_meta`), the graph buckets steps are padded to (:func:`graph_rows`,
:func:`run_shape`, ``MODELC_CUDA_GRAPH_BUCKETS=1``) and the memory check before a model
is placed (:func:`check_fits`).  Pure numpy: tested without a GPU."""

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


# a step with prompt chunks of up to this many rows (its own and one padding row) replays a
# graph of its bucket (MODELC_CUDA_MIXED_GRAPH_ROWS; 0: such steps run eagerly): under a
# steady load nearly every step mixes the decoding sequences with a new prompt's chunk,
# and launching ~10 kernels a layer from Python costs more than the GPU's step.  The
# engine's step budget (EngineOptions.step_tokens, 512) and the padding row
MIXED_GRAPH_ROWS = 520
# MODELC_CUDA_MIXED_KEY=rows: a step with prompt chunks runs its logit rows as this many and
# its attention tiles as this many plus an eighth of its rows (more padding rows' logits
# and one-row tiles, cheap beside the chunk), so its graph is one a row bucket: few enough
# to capture them all when the model loads (CudaLlama.warm); a step needing more runs as
# run_shape's three buckets say
FIXED_LOGITS = 72  # 64 streams: 64 rows and a new prompt's (its last chunk), in 8s


def run_shape(
    n: int,
    r: int,
    t: int,
    decode: bool,
    mixed_rows: int,
    mixed_bucket: int = GRAPH_BUCKET,
    fixed: bool = False,
) -> tuple[int, int, int] | None:
    """The (rows, logit rows, attention tiles) a step of ``n`` rows, ``r`` logit rows and
    ``t`` tiles runs as when it replays a graph of its bucket, or None: run as it is.  A
    decode step: :func:`graph_rows` of ``n``, each padding row its logits (``t`` is 0).  A
    step with prompt chunks, up to ``mixed_rows`` rows with the padding row: one padding
    row at least (the padding tiles and logit rows read it), each count its
    :func:`graph_rows`, or with ``mixed_bucket`` past 8 the next multiple of it (fewer
    shapes, so fewer eager steps and captures on a cold server, for more padding; the
    rows never past ``mixed_rows``, the buffers' size, nor the other two past the rows);
    ``fixed``: the logit rows and tiles too as the rows say (:data:`FIXED_LOGITS`) where
    they fit there."""
    if decode:
        run = graph_rows(n)
        return run, r + run - n, t
    if n + 1 > mixed_rows:
        return None

    def up(x: int) -> int:
        return (
            graph_rows(x) if mixed_bucket <= GRAPH_BUCKET else -(-x // mixed_bucket) * mixed_bucket
        )

    run = up(n + 1)
    if run > mixed_rows:
        run = graph_rows(n + 1)
    r_fix, t_fix = min(FIXED_LOGITS, run), min(FIXED_LOGITS + run // 8, run)
    if fixed and r <= r_fix and t <= t_fix:
        return run, r_fix, t_fix
    return run, min(up(r), run), min(up(t), run)


def mixed_runs(mixed_rows: int, mixed_bucket: int, n_ctx: int) -> list[int]:
    """The rows of every graph bucket of a step with prompt chunks (:func:`run_shape`), up
    to ``mixed_rows`` and a prompt chunk within ``n_ctx``: what CudaLlama.warm captures
    with ``MODELC_CUDA_MIXED_KEY=rows``."""
    top = min(mixed_rows, n_ctx + 2)  # a decode row, a chunk of run - 2 >= 2, a padding row
    shapes = (run_shape(n, 1, 1, False, mixed_rows, mixed_bucket) for n in range(3, top))
    return sorted({s[0] for s in shapes if s is not None and s[0] <= top})


def pad_tiles(tiles: np.ndarray[Any, Any], to: int, row: int) -> np.ndarray[Any, Any]:
    """``tiles`` (t, 2) of (first row, rows), then ``to`` - t tiles of the one padding row
    ``row`` (each writes that row's attention: the same values, never a real row's)."""
    extra = np.tile(np.array([[row, 1]], np.int64), (to - len(tiles), 1))
    return np.concatenate([tiles.reshape(-1, 2), extra])


def step_meta(
    ids: np.ndarray[Any, Any],
    pos: np.ndarray[Any, Any],
    slices: Sequence[slice],
    caches: Sequence[tuple[int, int]],
    logit_rows: np.ndarray[Any, Any],
    m: int,
    pad_to: int = 0,
    pad_cache: tuple[int, int] = (0, 0),
    logits_to: int = 0,
) -> np.ndarray[Any, Any]:
    """The int64 array a step sends the device, 8 sections of ``m``: token ids, positions,
    each row's sequence, each sequence's cache (address, capacity), the rows whose logits
    are wanted, then the tiles (section 6, two long: filled by the caller).  Rows
    ``len(ids)`` .. ``pad_to`` - 1 (a decode step run as its graph bucket) read token 0 at
    position 0 of one more sequence, ``pad_cache`` (a one-position scratch cache: every
    padding row writes the same K/V there), and their logits are computed and unused:
    ``logits_to`` - ``len(logit_rows)`` padding logit rows (default: one a padding row),
    the padding rows in turn."""
    n, k, r = len(ids), len(caches), len(logit_rows)
    r_to = logits_to or r + max(pad_to - n, 0)
    if r_to > r and pad_to <= n:
        raise ValueError("padding logit rows need padding rows")
    if max(n, pad_to, r_to) > m or k + (pad_to > n) > m:
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
        host[5 * m + r : 5 * m + r_to] = n + np.arange(r_to - r) % (pad_to - n)
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
