"""Build the Cython kernels in ``cyx/`` into ``modelc._kernels``.

The kernels run on their own pthread pool (``cyx/mc_pool.h``); OpenMP is used
only for ``#pragma omp simd`` hints (``-fopenmp-simd``, no OpenMP runtime).  SIMD
paths (AVX2/FMA/F16C and AVX512-VNNI on x86-64, NEON on arm64) are compiled with
per-function target attributes and chosen at run time, so one build runs on any
CPU of its architecture.  ``-ffp-contract=off`` keeps every code path's float
arithmetic as written, so batched and single-row results are bit-identical.

How the C kernels are compiled (several units in parallel, ``-g0``, the flags) is
``cyx/mc_build.py``, shared with the projects ``modelc compile`` writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = Path(__file__).parent.resolve()
sys.path.insert(0, str(HERE / "cyx"))
from mc_build import SPLIT_MACROS, ParallelBuildExt, flags, units  # noqa: E402


def extensions() -> list[Extension]:
    cargs, largs = flags()
    exts = []
    for pyx in sorted((HERE / "cyx").glob("*.pyx")):
        exts.append(
            Extension(
                f"modelc._kernels.{pyx.stem}",
                [str(pyx.relative_to(HERE)), *units("cyx")],
                include_dirs=[np.get_include(), str(HERE / "cyx")],
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"), *SPLIT_MACROS],
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


setup(ext_modules=extensions(), cmdclass={"build_ext": ParallelBuildExt})
