"""Build the Cython kernels in ``cyx/`` into ``modelc._kernels``.

OpenMP is used where the compiler has it (probed by compiling a tiny program);
without it the kernels build single-threaded.  SIMD paths (AVX2/FMA on x86-64,
NEON on arm64) are compiled with per-function target attributes and chosen at
run time, so one build runs on any CPU of its architecture.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = Path(__file__).parent.resolve()


def _compiler() -> str:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"


def _has_openmp() -> bool:
    if os.environ.get("MODELC_NO_OPENMP"):
        return False
    if sys.platform == "win32":
        return True
    src = "#include <omp.h>\nint main(void){return omp_get_max_threads() > 0 ? 0 : 1;}\n"
    with tempfile.TemporaryDirectory() as tmp:
        c = Path(tmp) / "t.c"
        c.write_text(src)
        try:
            r = subprocess.run(
                [_compiler(), "-fopenmp", str(c), "-o", str(Path(tmp) / "t")],
                capture_output=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return r.returncode == 0


def _flags() -> tuple[list[str], list[str]]:
    compile_args = ["-O3", "-fno-strict-aliasing", "-std=gnu11", "-ffp-contract=off"]
    link_args: list[str] = []
    if sys.platform == "win32":
        return ["/O2", "/openmp"], []
    if platform.machine().lower() in ("x86_64", "amd64"):
        # Baseline stays portable; AVX2/FMA code paths carry target attributes.
        compile_args += ["-msse3"]
    if sys.platform != "win32":
        compile_args.append("-pthread")  # the kernels' thread pool (cyx/mc_pool.h)
        link_args.append("-pthread")
    if _has_openmp():
        compile_args.append("-fopenmp")
        link_args.append("-fopenmp")
    else:
        print("modelc setup: OpenMP not available, kernels build single-threaded", file=sys.stderr)
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
