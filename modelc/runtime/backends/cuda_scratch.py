"""Device scratch buffers by name, grown on demand and never shrunk (:class:`Scratch`).

A CUDA graph captured over a step holds the raw pointers it was captured with, so a buffer
a later, larger step outgrows is kept (``retired``), not freed, for as long as the owner
lives: a replay of an older graph still writes into it.  Buffers are made outside graph
capture: the steps that use them run eagerly once before any capture of their shape.
"""

from __future__ import annotations

from typing import Any


class Scratch:
    """Named 1-D device arrays of at least the size last asked for: grown to at least
    double (and ``least``), zeroed when made where ``zero`` (counters that the kernels
    using them leave at zero)."""

    def __init__(self, cp: Any) -> None:
        self.cp = cp
        self.bufs: dict[str, Any] = {}
        self.retired: list[Any] = []  # outgrown: captured graphs may still point at them

    def get(
        self, name: str, n: int, dtype: Any, zero: bool = False, least: int = 0, double: bool = True
    ) -> Any:
        """The whole buffer ``name`` (``dtype``, at least n values; ``double`` False: grown
        to n only, for large buffers asked for in few sizes)."""
        b = self.bufs.get(name)
        if b is None or b.size < n or b.dtype != dtype:
            if b is not None:
                self.retired.append(b)
            size = max(n, least, 2 * (0 if b is None or not double else b.size))
            b = self.bufs[name] = (self.cp.zeros if zero else self.cp.empty)(size, dtype)
        return b
