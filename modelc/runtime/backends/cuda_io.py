"""A CUDA step's traffic with the host inside its graph (``MODELC_CUDA_STEP_IO=graph``).

A replayed decode step still made several CUDA calls from Python besides the graph's
launch: the step's meta sent from a pageable numpy array, the sampler's calls (three for
a greedy step, a parameter upload, a launch and a copy for the one-launch sampler), the
tokens' copy back, the synchronization.  CuPy gives the GIL up around each, and in a
loaded server each take-back waits for the event loop (0.2-0.3 ms on average on an H100
host at 64 streams; a py-spy profile of the step thread: ~19 % of its time waiting so).
:class:`StepIO` moves the traffic into the step itself: the meta and the sampling
parameters (:func:`.cuda_sampler.params`, a row each, greedy ones past the batch's) are
written into page-locked host memory and copied to the device by the step's first
operations, and its last two are the one-launch sampler's kernel over the logit rows and
its picks' copy into page-locked memory.  A replayed step is then the graph's launch and
one synchronization.  The engine takes the picks where the kernel samples every row
(:func:`.cuda_sampler.fits`, nothing edited: bans, bias and penalties take the sampler's
other calls) and none was handed back; otherwise it samples the logits, still on the
device, as before.

Opt-in until a GPU run has checked it (its tokens against the batched sampler's, and a
server's speed).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from modelc.runtime.backends import cuda_sampler

PARAMS = 6  # cuda_sampler.params' columns: temperature, top_k, top_p, min_p, u, row


def enabled() -> bool:
    """Whether steps carry their own meta and sampling (``MODELC_CUDA_STEP_IO=graph``)."""
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
    int64 a step, sampling parameters of a row each) and their device copies."""

    def __init__(self, cp: Any, rows: int, meta_len: int) -> None:
        self.cp = cp
        self._meta_mem = cp.cuda.alloc_pinned_memory(8 * meta_len)
        self._prm_mem = cp.cuda.alloc_pinned_memory(8 * PARAMS * rows)
        self._tok_mem = cp.cuda.alloc_pinned_memory(8 * rows)
        self.meta: np.ndarray[Any, np.dtype[np.int64]] = np.frombuffer(
            self._meta_mem, np.int64, meta_len
        )
        self.params: np.ndarray[Any, np.dtype[np.float64]] = np.frombuffer(
            self._prm_mem, np.float64, PARAMS * rows
        ).reshape(rows, PARAMS)
        self.picks: np.ndarray[Any, np.dtype[np.int64]] = np.frombuffer(
            self._tok_mem, np.int64, rows
        )
        self.picks[:] = -1  # never a token: read before a step wrote them, handed back
        self._greedy = greedy_params(rows)
        self.params[:] = self._greedy
        self.prm = cp.zeros((rows, PARAMS), np.float64)

    def set_params(self, prm: np.ndarray[Any, Any] | None) -> None:
        """The next step samples row b as ``prm[b]`` (:func:`.cuda_sampler.params`), rows
        past them greedily (their picks unused); None: every row greedily."""
        b = 0 if prm is None else len(prm)
        if b:
            self.params[:b] = prm
        self.params[b:] = self._greedy[b:]

    def send(self, meta_dev: Any, stream: Any) -> None:
        """Queue the meta's copy to ``meta_dev`` and the parameters' on ``stream`` (captured:
        a graph's nodes).  Through the runtime's ``cudaMemcpyAsync`` itself: CuPy's
        ``copy_from_host_async`` refuses any copy from the host during a capture (pageable
        memory cannot be captured; this is page-locked, which can)."""
        rt = self.cp.cuda.runtime
        h2d = rt.memcpyHostToDevice
        rt.memcpyAsync(meta_dev.data.ptr, self._meta_mem.ptr, self.meta.nbytes, h2d, stream.ptr)
        rt.memcpyAsync(self.prm.data.ptr, self._prm_mem.ptr, self.params.nbytes, h2d, stream.ptr)

    def pick(self, dev: Any, logits: Any, r: int, tokens_dev: Any, stream: Any) -> None:
        """Queue the sampler's picks of ``r`` rows (row b as :attr:`params` row b says) of
        ``logits`` into ``tokens_dev`` and their copy to :attr:`picks` (a launch, a copy)."""
        if r <= 0:
            return
        cuda_sampler.launch(dev, logits, self.prm, tokens_dev, r)
        rt = self.cp.cuda.runtime
        rt.memcpyAsync(
            self._tok_mem.ptr, tokens_dev.data.ptr, 8 * r, rt.memcpyDeviceToHost, stream.ptr
        )
