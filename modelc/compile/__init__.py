"""``modelc compile``: a model as its own program (see :mod:`modelc.compile.project`).

:func:`compile_model` writes a standalone Python project whose forward pass is generated
Cython specialised to the model (:mod:`modelc.compile.spec` reads the constants, the
templates under ``templates/`` hold the code), with a private copy of modelc's runtime
and server (:mod:`modelc.compile.vendor`) and the artifact as package data.
"""

from __future__ import annotations

from modelc.compile.project import Compiled, Names, compile_model

__all__ = ["Compiled", "Names", "compile_model"]
