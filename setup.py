"""Build the Cython kernels in ``cyx/`` into ``modelc._kernels``.

The kernels run on their own pthread pool (``cyx/mc_pool.h``); OpenMP is used
only for ``#pragma omp simd`` hints (``-fopenmp-simd``, no OpenMP runtime).  SIMD
paths (AVX2/FMA/F16C and AVX512-VNNI on x86-64, NEON on arm64) are compiled with
per-function target attributes and chosen at run time, so one build runs on any
CPU of its architecture.  ``-ffp-contract=off`` keeps every code path's float
arithmetic as written, so batched and single-row results are bit-identical.

The C kernels are compiled as several translation units (``cyx/mc_unit_*.c``, see
``cyx/mc_common.h``) beside the Cython wrapper, in parallel on every CPU this process
may use, one progress line per unit on the terminal (stderr where there is none).  Without
``--debug`` they carry no debug information (``-g0``: the same machine code, a third less
compile time); the wrapper, which holds no kernel, is compiled at ``-O2`` (a fifth less).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent.resolve()
# one unit per kernel family: the wrapper and the other units link against the core one
SPLIT = sys.platform != "win32"
# heaviest first, so that the last unit to start is a short one
UNITS = ["cyx/mc_unit_core.c", "cyx/mc_unit_zmm.c", "cyx/mc_unit_avx2.c", "cyx/mc_unit_vnni.c"]


def _flags() -> tuple[list[str], list[str]]:
    compile_args = ["-O3", "-fno-strict-aliasing", "-std=gnu11", "-ffp-contract=off"]
    link_args: list[str] = []
    if sys.platform == "win32":
        return ["/O2", "/openmp"], []
    if platform.machine().lower() in ("x86_64", "amd64"):
        # Baseline stays portable; AVX2/FMA code paths carry target attributes.
        compile_args += ["-msse3"]
    compile_args += ["-pthread", "-fopenmp-simd"]  # thread pool; omp simd hints only
    # each unit includes the headers of the others for their declarations and shared
    # helpers: the static functions a unit does not call are left out, not warned about
    compile_args += ["-Wno-unused-function"]
    link_args.append("-pthread")
    return compile_args, link_args


def _jobs() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


class ParallelBuildExt(build_ext):
    """``build_ext`` that compiles an extension's C sources in parallel (one compiler
    process per source, as many at once as there are CPUs, or ``--parallel N``) and
    prints one progress line per source (``_say``)."""

    def build_extension(self, ext: Extension) -> None:
        if not SPLIT:  # one unit (MSVC): setuptools' own compile
            super().build_extension(ext)
            return
        cc: Any = self.compiler
        jobs = self.parallel if isinstance(self.parallel, int) and self.parallel > 0 else _jobs()

        def compile_all(
            sources: list[str],
            output_dir: str | None = None,
            macros: Any = None,
            include_dirs: Any = None,
            debug: int = 0,
            extra_preargs: list[str] | None = None,
            extra_postargs: list[str] | None = None,
            depends: list[str] | None = None,
        ) -> list[str]:
            macros, objects, extra, pp_opts, build = cc._setup_compile(
                output_dir, macros, include_dirs, sources, depends, extra_postargs
            )
            cc_args = cc._get_cc_args(pp_opts, debug, extra_preargs)
            extra = [*extra, *([] if self.debug else ["-g0"])]
            # the units in UNITS' order, then the wrapper
            todo = sorted(
                ((obj, *build[obj]) for obj in objects if obj in build),
                key=lambda item: UNITS.index(item[1]) if item[1] in UNITS else len(UNITS),
            )
            start = time.monotonic()
            _say(f"modelc: compiling {len(todo)} C units, {min(jobs, len(todo))} at a time")

            def one(item: tuple[str, str, str]) -> None:
                obj, src, src_ext = item
                t0 = time.monotonic()
                cc._compile(
                    obj, src, src_ext, cc_args, extra + ([] if src in UNITS else ["-O2"]), pp_opts
                )
                took, total = time.monotonic() - t0, time.monotonic() - start
                _say(f"modelc:   {Path(src).name} compiled in {took:.0f} s ({total:.0f} s so far)")

            with ThreadPoolExecutor(max(1, min(jobs, len(todo)))) as pool:
                for _ in pool.map(one, todo):
                    pass
            return list(objects)

        cc.compile = compile_all
        super().build_extension(ext)


def _say(line: str) -> None:
    """A progress line on the terminal: pip hides a build's output unless -v, so where there
    is one the line goes to it directly (once, -v or not); elsewhere (CI) to stderr."""
    try:
        with open("/dev/tty", "w") as tty:
            print(line, file=tty, flush=True)
    except OSError:
        print(line, file=sys.stderr, flush=True)


def extensions() -> list[Extension]:
    cargs, largs = _flags()
    exts = []
    for pyx in sorted((HERE / "cyx").glob("*.pyx")):
        exts.append(
            Extension(
                f"modelc._kernels.{pyx.stem}",
                [str(pyx.relative_to(HERE)), *(UNITS if SPLIT else [])],
                include_dirs=[np.get_include(), str(HERE / "cyx")],
                define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
                + ([("MC_SPLIT", "1")] if SPLIT else []),
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
