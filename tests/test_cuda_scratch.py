"""The CUDA backend's scratch buffers (:mod:`modelc.runtime.backends.cuda_scratch`), with numpy
standing in for CuPy: runs without a GPU."""

from __future__ import annotations

import numpy as np

from modelc.runtime.backends.cuda_scratch import Scratch


def test_the_scratch_grows_and_keeps_what_graphs_point_at() -> None:
    """``cuda_scratch.Scratch`` (numpy standing in for CuPy): a buffer is handed back whole
    while it is big enough, grown to at least double (or exactly, ``double=False``) and
    its outgrown self kept; a counter made zeroed; another dtype a new buffer."""
    s = Scratch(np)
    a = s.get("x", 10, np.float32, least=16)
    assert a.size == 16 and s.get("x", 16, np.float32) is a
    b = s.get("x", 17, np.float32)
    assert b.size == 32 and len(s.retired) == 1 and s.retired[0] is a
    c = s.get("c", 5, np.uint32, zero=True)
    assert c.size == 5 and not c.any()
    d = s.get("d", 100, np.uint8, double=False)
    assert s.get("d", 101, np.uint8, double=False).size == 101 and s.retired[-1] is d
    assert s.get("x", 4, np.int8).dtype == np.int8 and s.retired[-1] is b
