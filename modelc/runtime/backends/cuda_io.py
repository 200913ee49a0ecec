"""A CUDA step's traffic with the host inside its graph (``MODELC_CUDA_STEP_IO=graph``).

A replayed decode step still made several CUDA calls from Python besides the graph's
launch: the step's meta sent from a pageable numpy array, the argmax (or the batched
sampler's calls), the tokens' copy back, the synchronization.  CuPy gives the GIL up
around each, and in a loaded server each take-back waits for the event loop (0.2-0.3 ms
on average on an H100 host at 64 streams; a py-spy profile of the step thread: ~19 % of
its time waiting so).  :class:`StepIO` moves the traffic into the step itself: the meta is
written into page-locked host memory and copied to the device by the step's first
operation, and its last two are a greedy pick of every logit row (the one-launch
sampler's kernel with greedy parameters: the largest logit's first index, -1 for a row
with a NaN or an infinite maximum) and the picks' copy into page-locked memory.  A
replayed step is then the graph's launch and one synchronization; the engine takes the
picks where every row of the step is greedy with nothing edited and no log-probabilities
asked (:func:`.cuda_sampler.argmax_only`), and samples the logits, still on the device,
as before otherwise (a row handed back included).

Opt-in until a GPU run has checked it (its greedy tokens against the batched sampler's,
and a server's speed).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

PARAMS = 6  # cuda_sampler.params' columns: temperature, top_k, top_p, min_p, u, row


def enabled() -> bool:
    """Whether steps carry their own meta and greedy picks (``MODELC_CUDA_STEP_IO=graph``)."""
    return os.environ.get("MODELC_CUDA_STEP_IO", "host") == "graph"


def greedy_params(rows: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    """:func:`.cuda_sampler.params` of ``rows`` greedy rows, row i picking from logit row
    i: temperature 0 (the kernel's argmax), top-k 0, top-p 1, min-p 0, u 0."""
    prm = np.zeros((rows, PARAMS), np.float64)
    prm[:, 2] = 1.0
    prm[:, 5] = np.arange(rows)
    return prm


class StepIO:
    """The page-locked buffers of a model's steps of up to ``rows`` rows (meta of ``meta_len``
    int64 a step), and the greedy parameters on the device."""

    def __init__(self, cp: Any, rows: int, meta_len: int) -> None:
        self.cp = cp
        self._meta_mem = cp.cuda.alloc_pinned_memory(8 * meta_len)
        self._tok_mem = cp.cuda.alloc_pinned_memory(8 * rows)
        self.meta: np.ndarray[Any, np.dtype[np.int64]] = np.frombuffer(
            self._meta_mem, np.int64, meta_len
        )
        self.picks: np.ndarray[Any, np.dtype[np.int64]] = np.frombuffer(
            self._tok_mem, np.int64, rows
        )
        self.prm = cp.asarray(greedy_params(rows))

    def send(self, meta_dev: Any, stream: Any) -> None:
        """Queue the meta's copy to ``meta_dev`` on ``stream`` (captured: a graph's node)."""
        meta_dev.data.copy_from_host_async(
            ctypes.c_void_p(self._meta_mem.ptr), self.meta.nbytes, stream
        )

    def pick(self, dev: Any, logits: Any, r: int, tokens_dev: Any, stream: Any) -> None:
        """Queue the greedy pick of ``logits``' first ``r`` rows into ``tokens_dev`` and its
        copy to :attr:`picks` (one launch, one copy)."""
        if r <= 0:
            return
        v = np.int32(logits.shape[1])
        dev.fn["sample_rows"]((r,), (1024,), (logits, v, self.prm, tokens_dev))
        tokens_dev.data.copy_to_host_async(ctypes.c_void_p(self._tok_mem.ptr), 8 * r, stream)
