"""MLP: a chain of linear layers (or an ONNX execution plan), recognised by
:mod:`modelc.formats.arch` from its names and shapes; the forward is
:class:`modelc.runtime.arch.mlp.MLP`."""

from __future__ import annotations

from modelc.families.contract import Family

FAMILY = Family(name="mlp", kind="tensor", runtime="modelc.runtime.arch.mlp:MLP")
