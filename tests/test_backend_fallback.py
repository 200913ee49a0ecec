"""One fallback style: every accelerated backend is a NumpyFallback, and an op a backend
does not define gives the numpy reference's result."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from modelc.formats.ir import DType
from modelc.runtime.backend import Backend, Weight
from modelc.runtime.backends.cuda_backend import CudaBackend
from modelc.runtime.backends.fallback import NumpyFallback
from modelc.runtime.backends.numpy_ref import NumpyBackend
from modelc.runtime.backends.webgpu import WebGPUBackend

OPS = sorted(
    name
    for name, member in vars(Backend).items()
    if inspect.isfunction(member) and not name.startswith("_")
)


def test_every_backend_falls_back_the_same_way() -> None:
    from modelc.runtime.backends.cpu import CpuBackend

    for cls in (CpuBackend, CudaBackend, WebGPUBackend):
        assert issubclass(cls, NumpyFallback), cls
        assert not issubclass(cls, NumpyBackend), f"{cls.__name__} subclasses the reference"
    # its own ops, and the batched ones as loops over them (numpy_ref.PerSequence)
    defined = {name for c in NumpyFallback.__mro__ if c is not object for name in vars(c)}
    assert len(OPS) == 17 and set(OPS) <= defined


class _AttentionOnly(NumpyFallback):
    """A backend with its own attention only (as CUDA has); counts its calls."""

    name = "attention-only"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def attention(self, *args: Any, **kw: Any) -> Any:
        self.calls += 1
        return self._fallback.attention(*args, **kw)


def test_the_fallback_equals_the_reference() -> None:
    rng = np.random.default_rng(0)
    ref, be = NumpyBackend(), _AttentionOnly()
    w = Weight(DType.F32, (6, 8), rng.standard_normal((6, 8)).astype(np.float32))
    x = rng.standard_normal((3, 8)).astype(np.float32)
    assert np.array_equal(be.matmul(w, x), ref.matmul(w, x))
    for got, want in zip(be.matmul_many([w, w], x), ref.matmul_many([w, w], x), strict=True):
        assert np.array_equal(got, want)
    assert np.array_equal(be.get_rows(w, np.array([4, 1])), ref.get_rows(w, np.array([4, 1])))
    assert np.array_equal(be.gelu_erf(x.copy()), ref.gelu_erf(x.copy()))

    # attention_append: the new rows stored, then the backend's own attention per sequence
    q = rng.standard_normal((5, 4, 8)).astype(np.float32)  # (rows, n_head, hd)
    kv_new = rng.standard_normal((2, 5, 2, 8)).astype(np.float32)  # (k|v, rows, n_kv, hd)
    stores = [np.zeros((2, 16, 2, 8), np.float16) for _ in range(2)]  # per sequence
    for s in stores:
        s[:, :3] = rng.standard_normal((2, 3, 2, 8))
    ref_stores = [s.copy() for s in stores]
    args: tuple[Any, ...] = ([3, 0], [2, 3], 0.35)
    got = be.attention_append(
        q, kv_new[0], kv_new[1], [s[0] for s in stores], [s[1] for s in stores], *args,
        out=np.empty_like(q),
    )  # fmt: skip
    want = ref.attention_append(
        q, kv_new[0], kv_new[1], [s[0] for s in ref_stores], [s[1] for s in ref_stores], *args,
        out=np.empty_like(q),
    )  # fmt: skip
    assert np.array_equal(got, want) and be.calls == 2
    assert all(np.array_equal(a, b) for a, b in zip(stores, ref_stores, strict=True))

    # with sinks (gpt-oss) too: they reach the backend's attention through both helpers
    sinks = np.array([0.5, -1.0, 2.0, -np.inf], np.float32)
    kw: dict[str, Any] = {"out": np.empty_like(q), "sinks": sinks}
    got = be.attention_append(
        q, kv_new[0], kv_new[1], [s[0] for s in stores], [s[1] for s in stores], *args, **kw
    )
    kw["out"] = np.empty_like(q)
    want = ref.attention_append(
        q, kv_new[0], kv_new[1], [s[0] for s in ref_stores], [s[1] for s in ref_stores], *args, **kw
    )
    assert np.array_equal(got, want) and be.calls == 4
    plain = ref.attention(q[:2], ref_stores[0][0][:5], ref_stores[0][1][:5], 3, 0.35)
    assert not np.allclose(want[:2], plain) and np.array_equal(want[:2, 3], plain[:, 3])
    batch = be.attention_batch(
        [q[:2]], [stores[0][0][:5]], [stores[0][1][:5]], [3], 0.35, sinks=sinks
    )
    assert np.array_equal(batch[0], want[:2]) and be.calls == 5
