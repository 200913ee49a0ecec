"""The CPU backend's settings: the kernels' weight type codes, SIMD level, thread count
and matmul mode (:class:`modelc.runtime.backends.cpu.CpuBackend` takes them).

Environment:

* ``MODELC_THREADS``  threads for the kernels (default: every core this process may use).
  The kernels run on a small pthread pool (``cyx/mc_pool.h``) that hands out chunks of
  rows; on a machine busier than its cores this degrades to one thread's speed
  instead of stalling on a barrier as an OpenMP region would.
* ``MODELC_SIMD``     ``auto`` (default), ``scalar``, ``avx2``, ``avx512vnni`` or ``neon``:
  which code path the kernels take; ``scalar`` forces the portable C path.
* ``MODELC_MATMUL``   ``fast`` (default), ``balanced`` or ``exact``.  ``fast`` quantizes the
  activations to int8 blocks (32 elements, or 256 for K-quants) and takes integer dot
  products, as llama.cpp does: about 0.5-1% relative error on a matmul output, more
  where activations have outlier channels.  ``exact`` keeps the activations in float32
  and dequantizes the weights as it goes (in registers for one to three rows of x, into
  a row buffer reused by every row of a batch): the result is ``x @ dequant(W).T`` to
  float32 rounding (use it for parity with a float reference).  ``balanced`` takes the
  int8 path with outlier decomposition (up to 4 activations per row above 6x its RMS
  are kept out of the int8 blocks and added back in float, as LLM.int8() does); a row
  whose quantization is still estimated to add more than ``BALANCED_TOL`` relative RMS
  error takes the exact path (each row decides alone, so a batch gives every row the
  result it gets alone).  Accuracy on SmolLM2-135M Q4_1 (3 prompts, 24 greedy tokens):
  max top-10 log-prob error against ``exact`` 0.59 for fast, 0.11 for balanced.  Speed
  (same model, 2 threads, 2-core machine shared with other jobs, ``bench/bench_e2e.py``):
  prefill 512 tokens / decode batch 1 / batch 8 in tok/s: fast ~370 / ~90 / ~278,
  balanced ~147 / ~53 / ~124, exact ~94 / ~40 / ~71.  ``fast`` stays the default: balanced
  costs ~40% at batch 1 and over half the throughput in batches and prefill, where many
  rows of SmolLM2's activations carry outliers.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from modelc.errors import ConfigError
from modelc.formats.ir import DType

__all__ = [
    "BALANCED_TOL", "C_MATMUL_DTYPES", "MATMUL_TOLS", "SIMD_LEVELS", "TYPE_CODES",
    "available_simd", "default_threads", "matmul_tol", "simd_level",
]  # fmt: skip

_k: Any = importlib.import_module("modelc._kernels.kernels")

# DType -> type code of cyx/mc_common.h
TYPE_CODES: dict[DType, int] = {
    DType.F32: _k.F32,
    DType.F16: _k.F16,
    DType.Q4_0: _k.Q4_0,
    DType.Q4_1: _k.Q4_1,
    DType.Q5_0: _k.Q5_0,
    DType.Q8_0: _k.Q8_0,
    DType.Q4_K: _k.Q4_K,
    DType.Q6_K: _k.Q6_K,
    DType.INT8: _k.INT8,
    DType.Q5_1: _k.Q5_1,
    DType.Q2_K: _k.Q2_K,
    DType.Q3_K: _k.Q3_K,
    DType.Q5_K: _k.Q5_K,
    DType.BF16: _k.BF16,
    DType.IQ4_NL: _k.IQ4_NL,
    DType.IQ4_XS: _k.IQ4_XS,
    DType.MXFP4: _k.MXFP4,
}

# the weight dtypes whose matmuls run in C (every mode, every SIMD level)
C_MATMUL_DTYPES: frozenset[DType] = frozenset(TYPE_CODES)

SIMD_LEVELS = {
    "scalar": _k.SIMD_SCALAR,
    "avx2": _k.SIMD_AVX2,
    "neon": _k.SIMD_NEON,
    # AVX2 kernels with VNNI integer dot products; Q4_K / Q5_K / Q6_K GEMMs on 512-bit registers
    "avx512vnni": _k.SIMD_VNNI,
}


def available_simd() -> list[str]:
    """The code paths this CPU runs, fastest first (``scalar`` always)."""
    best = int(_k.simd_best())
    names = [n for n, v in SIMD_LEVELS.items() if v == best]
    if best == _k.SIMD_VNNI:
        names.append("avx2")
    return [*names, "scalar"] if best != _k.SIMD_SCALAR else ["scalar"]


def default_threads() -> int:
    """``MODELC_THREADS`` if set, else every core."""
    env = os.environ.get("MODELC_THREADS", "").strip()
    if env:
        try:
            n = int(env)
        except ValueError as e:
            raise ConfigError(
                f"MODELC_THREADS={env!r} is not a whole number; unset it or give e.g. 4"
            ) from e
        if n < 1:
            raise ConfigError(f"MODELC_THREADS={n} must be at least 1")
        return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def simd_level(name: str | None = None) -> int:
    """The SIMD code path for ``name`` (default ``MODELC_SIMD``, else ``auto``)."""
    name = (name or os.environ.get("MODELC_SIMD", "") or "auto").strip().lower()
    best = int(_k.simd_best())
    if name == "auto":
        return best
    if name not in SIMD_LEVELS:
        raise ConfigError(f"MODELC_SIMD={name!r}: choose one of auto, {', '.join(SIMD_LEVELS)}")
    if name not in available_simd():
        raise ConfigError(
            f"MODELC_SIMD={name!r}: this CPU runs only {', '.join(available_simd())}; use auto"
        )
    return int(SIMD_LEVELS[name])


BALANCED_TOL = 0.01  # relative RMS activation-quantization error "balanced" accepts
MATMUL_TOLS = {"fast": 1e38, "balanced": BALANCED_TOL, "exact": 0.0}


def matmul_tol(name: str | None = None) -> float:
    """The kernels' activation-quantization tolerance for a ``MODELC_MATMUL`` mode name."""
    name = (name or os.environ.get("MODELC_MATMUL", "") or "fast").strip().lower()
    if name not in MATMUL_TOLS:
        raise ConfigError(f"MODELC_MATMUL={name!r}: choose one of {', '.join(MATMUL_TOLS)}")
    return MATMUL_TOLS[name]
