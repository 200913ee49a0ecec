"""How the C kernels are built, shared by modelc's ``setup.py`` and the ``setup.py`` of every
project ``modelc compile`` writes (copied beside the kernel sources there).

The C kernels are compiled as several translation units (``mc_unit_*.c``, see
``mc_common.h``) beside the Cython wrapper, in parallel on every CPU this process may use, one
progress line per unit on the terminal (stderr where there is none).  Without ``--debug`` they
carry no debug information (``-g0``: the same machine code, a third less compile time); the
wrapper, which holds no kernel, is compiled at ``-O2`` (a fifth less).  ``-ffp-contract=off``
keeps every code path's float arithmetic as written, so batched and single-row results are
bit-identical, and a compiled program's equal ``modelc run``'s.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from setuptools.command.build_ext import build_ext

# one unit per kernel family: the wrapper and the other units link against the core one
SPLIT = sys.platform != "win32"
# heaviest first, so that the last unit to start is a short one
UNITS = ["mc_unit_core.c", "mc_unit_zmm.c", "mc_unit_avx2.c", "mc_unit_vnni.c"]
# the macros of a split build
SPLIT_MACROS = [("MC_SPLIT", "1")] if SPLIT else []


def units(kernel_dir: str) -> list[str]:
    """The unit sources under ``kernel_dir`` (relative to the build's root), in UNITS' order;
    none where the build is one unit (MSVC)."""
    return [f"{kernel_dir}/{u}" for u in UNITS] if SPLIT else []


def flags() -> tuple[list[str], list[str]]:
    """The compile and link arguments of every kernel build."""
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


def _unit_rank(src: str) -> int:
    """A source's place in the build: the units in UNITS' order, then everything else."""
    name = Path(src).name
    return UNITS.index(name) if name in UNITS else len(UNITS)


class ParallelBuildExt(build_ext):
    """``build_ext`` that compiles an extension's C sources in parallel (one compiler
    process per source, as many at once as there are CPUs, or ``--parallel N``) and
    prints one progress line per source (:func:`say`).  A source that is not a kernel
    unit (a Cython wrapper, a compiled forward) is compiled at ``-O2`` when ``wrapper_o2``."""

    wrapper_o2 = True

    def build_extension(self, ext: Any) -> None:
        if not SPLIT:  # one unit (MSVC): setuptools' own compile
            super().build_extension(ext)
            return
        cc: Any = self.compiler
        jobs = self.parallel if isinstance(self.parallel, int) and self.parallel > 0 else _jobs()
        no_debug = [] if self.debug else ["-g0"]
        light = self.wrapper_o2 and any(_unit_rank(s) < len(UNITS) for s in ext.sources)

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
            extra = [*extra, *no_debug]
            todo = sorted(
                ((obj, *build[obj]) for obj in objects if obj in build),
                key=lambda item: _unit_rank(item[1]),
            )
            start = time.monotonic()
            say(f"modelc: compiling {len(todo)} C units, {min(jobs, len(todo))} at a time")

            def one(item: tuple[str, str, str]) -> None:
                obj, src, src_ext = item
                t0 = time.monotonic()
                o2 = light and _unit_rank(src) == len(UNITS)
                cc._compile(obj, src, src_ext, cc_args, extra + (["-O2"] if o2 else []), pp_opts)
                took, total = time.monotonic() - t0, time.monotonic() - start
                say(f"modelc:   {Path(src).name} compiled in {took:.0f} s ({total:.0f} s so far)")

            with ThreadPoolExecutor(max(1, min(jobs, len(todo)))) as pool:
                for _ in pool.map(one, todo):
                    pass
            return list(objects)

        cc.compile = compile_all
        super().build_extension(ext)


def say(line: str) -> None:
    """A progress line on the terminal: pip hides a build's output unless -v, so where there
    is one the line goes to it directly (once, -v or not); elsewhere (CI) to stderr."""
    try:
        with open("/dev/tty", "w") as tty:
            print(line, file=tty, flush=True)
    except OSError:
        print(line, file=sys.stderr, flush=True)
