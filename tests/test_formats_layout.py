"""Every reader hands out tensors that numpy's BLAS and the kernels read in place: aligned
to their element size, C-contiguous, of the dtype and shape the IR names.

A GPT-2 read from a ``pytorch_model.bin`` whose zip writer did not pad its members (as
``torch.save`` does, to 64 bytes) decoded 30 times slower than from safetensors: its tied
head, a view of the file at an odd offset, was misaligned, and numpy copies a misaligned
array whole before every ``@``.  The readers now copy such a view once, when it is loaded
(:func:`modelc.formats.ir.aligned`), and leave an aligned one memory-mapped.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelc.formats import load_model
from modelc.formats.ir import NUMPY_DTYPES
from modelc.formats.pytorch import read_pytorch
from modelc.formats.safetensors import read_safetensors
from tests.assets import smollm2_gguf
from tests.gen_gpt2 import ensure_gpt2_random, ensure_gpt2_random_bin, write_torch_zip

FIX = Path(__file__).parent / "fixtures" / "formats"

SOURCES: dict[str, Callable[[], Path]] = {
    "safetensors": lambda: FIX / "mlp.safetensors",
    "pytorch": lambda: FIX / "mlp.bin",
    "onnx": lambda: FIX / "mlp.onnx",
    "onnx-external-data": lambda: FIX / "mlp_ext.onnx",
    "hf-dir-bin": lambda: FIX / "gpt2-bin",
    "hf-dir-bin-shards": lambda: FIX / "llama-bin",
    "hf-dir-safetensors-shards": lambda: FIX / "llama-st",
    "gguf": smollm2_gguf,
    "gpt2-random-safetensors": ensure_gpt2_random,
    "gpt2-random-bin-unpadded-zip": ensure_gpt2_random_bin,
}


def _mapped(a: np.ndarray[Any, Any]) -> bool:
    base: Any = a
    while base is not None and not isinstance(base, np.memmap):
        base = base.base
    return base is not None


@pytest.mark.parametrize("name", SOURCES)
def test_every_tensor_is_laid_out_for_reading_in_place(name: str) -> None:
    ir = load_model(SOURCES[name]())
    for t in ir.tensors.values():
        a = t.data()
        assert a.flags.aligned, f"{t.name} is misaligned: every matmul would copy it"
        assert a.flags.c_contiguous, t.name
        if not t.dtype.is_quantized:
            assert (a.dtype, a.shape) == (NUMPY_DTYPES[t.dtype], t.shape), t.name


def _local_data_offsets(path: Path) -> dict[str, int]:
    """Where each zip member's bytes start in the file (after its local header)."""
    out = {}
    with zipfile.ZipFile(path) as zf, path.open("rb") as f:
        for info in zf.infolist():
            f.seek(info.header_offset)
            local = f.read(30)
            n, extra = (
                int.from_bytes(local[26:28], "little"),
                int.from_bytes(local[28:30], "little"),
            )
            out[info.filename] = info.header_offset + 30 + n + extra
    return out


def test_unpadded_torch_zip_is_copied_once_aligned(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    want = {f"w{i}": rng.standard_normal((3, 5)).astype(np.float32) for i in range(4)}
    path = tmp_path / "model.bin"
    write_torch_zip(want, path)
    starts = _local_data_offsets(path)
    odd = [k for k, v in starts.items() if "/data/" in k and v % 4]
    assert odd, starts  # the case in question: members at offsets no float32 can be read at
    raw = read_pytorch(path)
    for name, w in want.items():
        a = raw[name].data()
        assert a.flags.aligned and a.flags.c_contiguous
        np.testing.assert_array_equal(a, w)
        assert a is raw[name].data() or np.shares_memory(a, raw[name].data())  # copied once
    aligned_keys = [k for k, v in starts.items() if "/data/" in k and v % 4 == 0]
    for k in aligned_keys:  # members that happen to be aligned stay mapped from the file
        name = f"w{k.rsplit('/', 1)[1]}"
        assert _mapped(raw[name].data()), name


@pytest.mark.parametrize("pad", range(8))
def test_safetensors_at_any_header_length(tmp_path: Path, pad: int) -> None:
    """The data section starts at 8 + header length; the reference writer pads the header
    to a multiple of 8, others need not."""
    w = np.arange(24, dtype=np.float32).reshape(4, 6)
    head = json.dumps(
        {"w": {"dtype": "F32", "shape": [4, 6], "data_offsets": [0, w.nbytes]}}
    ).encode()
    head += b" " * pad
    path = tmp_path / "m.safetensors"
    path.write_bytes(len(head).to_bytes(8, "little") + head + w.tobytes())
    a = read_safetensors(path)[0]["w"].data()
    assert a.flags.aligned and a.flags.c_contiguous
    np.testing.assert_array_equal(a, w)
    assert _mapped(a) == ((8 + len(head)) % 4 == 0)  # copied only when it must be
