"""Build the Cython kernels in ``cyx/`` into ``modelc._kernels``.

The kernels run on their own pthread pool (``cyx/mc_pool.h``); OpenMP is used
only for ``#pragma omp simd`` hints (``-fopenmp-simd``, no OpenMP runtime).  SIMD
paths (AVX2/FMA/F16C and AVX512-VNNI on x86-64, NEON on arm64) are compiled with
per-function target attributes and chosen at run time, so one build runs on any
CPU of its architecture.  ``-ffp-contract=off`` keeps every code path's float
arithmetic as written, so batched and single-row results are bit-identical.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = Path(__file__).parent.resolve()


def _flags() -> tuple[list[str], list[str]]:
    compile_args = ["-O3", "-fno-strict-aliasing", "-std=gnu11", "-ffp-contract=off"]
    link_args: list[str] = []
    if sys.platform == "win32":
        return ["/O2", "/openmp"], []
    if platform.machine().lower() in ("x86_64", "amd64"):
        # Baseline stays portable; AVX2/FMA code paths carry target attributes.
        compile_args += ["-msse3"]
    compile_args += ["-pthread", "-fopenmp-simd"]  # thread pool; omp simd hints only
    link_args.append("-pthread")
    return compile_args, link_args


def extensions() -> list[Extension]:
    cargs, largs = _flags()
    exts = []
    for pyx in sorted((HERE / "cyx").glob("*.pyx")):
        exts.append(
            Extension(
                f"modelc._kernels.{pyx.stem}",
                [str(pyx.relative_to(HERE))],
                include_dirs=[np.get_include(), str(HERE / "cyx")],
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                extra_compile_args=cargs,
                extra_link_args=largs,
                # the C kernels live in headers: any change rebuilds the extension
                depends=[str(p.relative_to(HERE)) for p in sorted((HERE / "cyx").glob("*.h"))],
            )
        )
    return cythonize(
        exts,
        compiler_directives={
            "language_level": 3,
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
        quiet=True,
    )


setup(ext_modules=extensions())
