"""How many device calls the batched sampler makes a step, counted on the CPU.

    .venv/bin/python -m bench.sampler_calls [--rows 64] [--vocab 32000]

Runs :func:`~modelc.runtime.batch_sampler.sample_batch` on its CuPy branches with numpy
standing in for CuPy, counting each array function, ufunc, indexing, ``astype`` and
``copy`` it calls: on a GPU each is at least one kernel launch or copy, and in a loaded
server each gives the GIL up and waits for the event loop to hand it back.
"""

from __future__ import annotations

import argparse
import types
from typing import Any

import numpy as np

from modelc.runtime.batch_sampler import BatchParams, sample_batch
from modelc.runtime.sampling import Sampler, SamplingParams

CALLS = [0]


def _plain(a: Any) -> Any:
    return a.view(np.ndarray) if isinstance(a, Counted) else a


def _counted(r: Any) -> Any:
    return r.view(Counted) if isinstance(r, np.ndarray) else r


class Counted(np.ndarray):  # type: ignore[type-arg]
    """An array whose ufuncs, indexing, ``astype`` and ``copy`` each count one call."""

    def __array_ufunc__(self, uf: Any, method: str, *inputs: Any, **kw: Any) -> Any:
        CALLS[0] += 1
        if "out" in kw:
            kw["out"] = tuple(_plain(o) for o in kw["out"])
        return _counted(getattr(uf, method)(*(_plain(i) for i in inputs), **kw))

    def __getitem__(self, k: Any) -> Any:
        CALLS[0] += 1
        return super().__getitem__(k)

    def __setitem__(self, k: Any, v: Any) -> None:
        CALLS[0] += 1
        super().__setitem__(k, v)

    def astype(self, *a: Any, **k: Any) -> Any:
        CALLS[0] += 1
        return super().astype(*a, **k)

    def copy(self, *a: Any, **k: Any) -> Any:
        CALLS[0] += 1
        return super().copy(*a, **k)


class CountingXp(types.ModuleType):
    """numpy as an array namespace that is not numpy (so the CuPy branches run)."""

    def __getattr__(self, name: str) -> Any:
        f = np.asarray if name == "asnumpy" else getattr(np, name)
        if not callable(f) or isinstance(f, type):
            return f

        def call(*a: Any, **k: Any) -> Any:
            CALLS[0] += 1
            return _counted(f(*(_plain(x) for x in a), **k))

        return call


SETTINGS = {
    "greedy": {"temperature": 0.0},
    "Ollama's defaults (T 0.8, top-k 40, top-p 0.9)": {"temperature": 0.8, "top_k": 40, "top_p": 0.9},
    "llama-server's (T 0.8, top-k 40, top-p 0.95, min-p 0.05)": {
        "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
    },
}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=32000)
    a = ap.parse_args()
    xp = CountingXp("xp")
    logits = np.random.default_rng(0).standard_normal((a.rows, a.vocab)).astype(np.float32)
    for label, kw in SETTINGS.items():
        samplers = [Sampler(SamplingParams(seed=i, **kw), a.vocab) for i in range(a.rows)]
        bp = BatchParams.gather(samplers)
        CALLS[0] = 0
        sample_batch(xp, logits.view(Counted), bp)
        print(f"{label}: {CALLS[0]} device calls a step of {a.rows} rows")


if __name__ == "__main__":
    main()
