"""Copy the modelc runtime and server into a generated project under a private name.

A compiled program must run where modelc is not installed, so the packages it serves
with (runtime, engine, server, artifact, formats, and what they import) are copied
into ``<package>/_rt/`` and every reference to a modelc module is rewritten to the
private name: ``from modelc.runtime.model import X`` becomes
``from <package>._rt.runtime.model import X``, and so do module paths in strings
(``importlib.import_module("modelc._kernels.kernels")``,
``resources.files("modelc.server")``).  Only names of real modelc modules are
rewritten: metadata keys such as ``"modelc.hparams"`` stay as they are.  The command
line (``cli*.py``), the benchmark package and this compiler are left out; the Cython
kernels are copied as sources (``_kernels/``) and built by the project's own setup.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import modelc

# modelc modules a served program never imports (checked by the compile test, which
# runs the program with modelc uninstalled)
_SKIP_FILES = re.compile(r"^cli(_.*)?\.py$")
_SKIP_DIRS = {"bench", "compile", "_kernels", "__pycache__"}
_SKIP_SUFFIXES = {".so", ".pyd", ".pyc", ".c"}


def source_root() -> Path:
    """The installed modelc package directory."""
    return Path(modelc.__file__).resolve().parent


def repo_kernels_dir() -> Path:
    """``cyx/`` beside the package: the kernel sources (a checkout or an sdist)."""
    cyx = source_root().parent / "cyx"
    if not (cyx / "kernels.pyx").is_file():
        from modelc.errors import UnsupportedError

        raise UnsupportedError(
            f"modelc compile needs the kernel sources (cyx/kernels.pyx), not found at {cyx}; "
            "run it from a modelc checkout (pip install -e .)"
        )
    return cyx


def module_names(root: Path) -> list[str]:
    """modelc's top-level modules and subpackages (what a reference may name)."""
    names = {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    names.add("_kernels")
    return sorted(names, key=len, reverse=True)


def rewriter(private: str, names: list[str]) -> re.Pattern[str]:
    """The pattern :func:`rewrite` substitutes; ``private`` is e.g. ``smol_app._rt``."""
    del private
    alt = "|".join(re.escape(n) for n in names)
    return re.compile(rf"\bmodelc(?=\.(?:{alt})\b)|(?<=\bfrom )modelc(?= import\b)")


def rewrite(text: str, private: str, pattern: re.Pattern[str]) -> str:
    """``text`` with every reference to a modelc module pointing at ``private``."""
    text = pattern.sub(private, text)
    # ``import modelc`` (for ``modelc.__version__``): the private package, same local name
    return re.sub(r"(?m)^(\s*)import modelc\s*$", rf"\1import {private} as modelc", text)


def vendor(dest: Path, private: str) -> list[Path]:
    """Copy modelc's serving packages into ``dest`` (the ``_rt`` directory) with their
    references rewritten to ``private``; the files written."""
    root = source_root()
    pattern = rewriter(private, module_names(root))
    written: list[Path] = []
    for src in sorted(root.rglob("*")):
        rel = src.relative_to(root)
        if not src.is_file() or any(part in _SKIP_DIRS for part in rel.parts[:-1]):
            continue
        if len(rel.parts) == 1 and _SKIP_FILES.match(rel.name):
            continue
        if src.suffix in _SKIP_SUFFIXES or rel.parts[0] in _SKIP_DIRS:
            continue
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix == ".py":
            out.write_text(rewrite(src.read_text(), private, pattern))
        else:
            shutil.copyfile(src, out)
        written.append(out)
    return written


def vendor_kernels(dest: Path, api: str, pxd: str, private: str) -> None:
    """The kernel sources into ``dest`` (``_rt/_kernels``): ``kernels.pyx`` as modelc has
    it plus ``api`` (``cdef`` entry points a generated forward ``cimport``\\ s, declared in
    ``pxd``), and every C header."""
    cyx = repo_kernels_dir()
    dest.mkdir(parents=True, exist_ok=True)
    init = source_root() / "_kernels" / "__init__.py"
    pattern = rewriter(private, module_names(source_root()))
    (dest / "__init__.py").write_text(rewrite(init.read_text(), private, pattern))
    # the headers, the C units of a split build and how to build them (cyx/mc_build.py)
    for src in sorted([*cyx.glob("*.h"), *cyx.glob("mc_unit_*.c"), cyx / "mc_build.py"]):
        shutil.copyfile(src, dest / src.name)
    (dest / "kernels.pyx").write_text((cyx / "kernels.pyx").read_text() + "\n\n" + api)
    (dest / "kernels.pxd").write_text(pxd)
