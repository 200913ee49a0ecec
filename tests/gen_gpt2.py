"""A small randomly initialised GPT-2 (real 50257-token vocabulary), made with numpy only.

The weights are a pure function of ``SEED``, so the tests (no torch) and the golden
script (``scripts/make_goldens.py``, which loads the very same files into
transformers' ``GPT2LMHeadModel``) see identical numbers.  The directory is a Hugging
Face model directory (``config.json`` + ``model.safetensors`` with the tensor names
``save_pretrained`` writes), kept in the test-asset cache, never in the repository.

A copy as a PyTorch ``pytorch_model.bin`` (the zip format of ``torch.save``) is written
beside it, also without torch (:func:`write_torch_zip`); the golden script checks that
``torch.load`` reads it back bit for bit.

Run ``python -m tests.gen_gpt2`` to (re)create them.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from tests.assets import assets_dir, cache_lock

SEED = 20261129
CONFIG: dict[str, Any] = {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "vocab_size": 50257,
    "n_positions": 256,
    "n_embd": 64,
    "n_layer": 3,
    "n_head": 4,
    "n_inner": None,
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
    "tie_word_embeddings": True,
}


def gpt2_random_dir() -> Path:
    return assets_dir() / "gpt2-random"


def make_weights() -> dict[str, np.ndarray[Any, Any]]:
    """GPT-2 state dict (HF names, Conv1D weights stored (in, out)), float32."""
    rng = np.random.default_rng(SEED)
    d = int(CONFIG["n_embd"])
    ff = 4 * d

    def normal(shape: tuple[int, ...], std: float, mean: float = 0.0) -> np.ndarray[Any, Any]:
        return (mean + std * rng.standard_normal(shape)).astype(np.float32)

    w: dict[str, np.ndarray[Any, Any]] = {
        "transformer.wte.weight": normal((int(CONFIG["vocab_size"]), d), 0.3),
        "transformer.wpe.weight": normal((int(CONFIG["n_positions"]), d), 0.1),
    }
    for i in range(int(CONFIG["n_layer"])):
        p = f"transformer.h.{i}."
        w[p + "ln_1.weight"] = normal((d,), 0.1, 1.0)
        w[p + "ln_1.bias"] = normal((d,), 0.05)
        w[p + "attn.c_attn.weight"] = normal((d, 3 * d), 0.2)
        w[p + "attn.c_attn.bias"] = normal((3 * d,), 0.05)
        w[p + "attn.c_proj.weight"] = normal((d, d), 0.1)
        w[p + "attn.c_proj.bias"] = normal((d,), 0.05)
        w[p + "ln_2.weight"] = normal((d,), 0.1, 1.0)
        w[p + "ln_2.bias"] = normal((d,), 0.05)
        w[p + "mlp.c_fc.weight"] = normal((d, ff), 0.1)
        w[p + "mlp.c_fc.bias"] = normal((ff,), 0.05)
        w[p + "mlp.c_proj.weight"] = normal((ff, d), 0.1)
        w[p + "mlp.c_proj.bias"] = normal((d,), 0.05)
    w["transformer.ln_f.weight"] = normal((d,), 0.1, 1.0)
    w["transformer.ln_f.bias"] = normal((d,), 0.05)
    return w


def gpt2_random_bin_dir() -> Path:
    return assets_dir() / "gpt2-random-bin"


def _pickle_str(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b  # BINUNICODE


def _pickle_int(i: int) -> bytes:
    return b"J" + struct.pack("<i", i)  # BININT


def _pickle_int_tuple(xs: tuple[int, ...]) -> bytes:
    return b"(" + b"".join(_pickle_int(x) for x in xs) + b"t"  # MARK ... TUPLE


def write_torch_zip(tensors: dict[str, np.ndarray[Any, Any]], path: Path) -> None:
    """Write float32 tensors as ``torch.save(OrderedDict)`` does (zip, pickle protocol 2).

    The pickle is written opcode by opcode: each tensor is
    ``torch._utils._rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict())``
    with its storage a persistent id ``("storage", torch.FloatStorage, key, "cpu", numel)``
    whose bytes are ``archive/data/<key>``.  Unlike ``torch.save``, which pads each member
    to 64 bytes, the members follow their zip headers unpadded, mostly at offsets no
    float32 can be read at in place (tests/test_formats_layout.py holds the readers to it).
    """
    ordered_dict = b"ccollections\nOrderedDict\n)R"  # GLOBAL, EMPTY_TUPLE, REDUCE
    pk = [b"\x80\x02", ordered_dict, b"("]  # PROTO 2, the dict, MARK
    for key, (name, arr) in enumerate(tensors.items()):
        arr = np.ascontiguousarray(arr, dtype="<f4")
        stride = tuple(int(s) // 4 for s in arr.strides) if arr.ndim else ()
        pk += [
            _pickle_str(name),
            b"ctorch._utils\n_rebuild_tensor_v2\n(",
            b"(" + _pickle_str("storage") + b"ctorch\nFloatStorage\n",
            _pickle_str(str(key)) + _pickle_str("cpu") + _pickle_int(arr.size) + b"tQ",  # BINPERSID
            _pickle_int(0),
            _pickle_int_tuple(tuple(int(d) for d in arr.shape)),
            _pickle_int_tuple(stride),
            b"\x89",  # NEWFALSE (requires_grad)
            ordered_dict,  # backward hooks
            b"tR",  # TUPLE, REDUCE
        ]
    pk.append(b"u.")  # SETITEMS, STOP
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"".join(pk))
        z.writestr("archive/byteorder", "little")
        for key, arr in enumerate(tensors.values()):
            z.writestr(f"archive/data/{key}", np.ascontiguousarray(arr, dtype="<f4").tobytes())
        z.writestr("archive/version", "3\n")
    os.replace(tmp, path)


def ensure_gpt2_random_bin() -> Path:
    """The same model as a ``pytorch_model.bin`` directory; created if missing."""
    dest = gpt2_random_bin_dir()
    with cache_lock(dest.name):
        if (dest / "pytorch_model.bin").exists() and (dest / "config.json").exists():
            return dest
        dest.mkdir(parents=True, exist_ok=True)
        write_torch_zip(make_weights(), dest / "pytorch_model.bin")
        (dest / "config.json").write_text(json.dumps(CONFIG, indent=2))
    return dest


def ensure_gpt2_random() -> Path:
    """Create the model directory if it is missing; return it."""
    from safetensors.numpy import save_file

    dest = gpt2_random_dir()
    with cache_lock(dest.name):
        if (dest / "model.safetensors").exists() and (dest / "config.json").exists():
            return dest
        dest.mkdir(parents=True, exist_ok=True)
        tmp = dest / "model.safetensors.tmp"
        save_file(make_weights(), str(tmp), metadata={"format": "pt"})
        (dest / "config.json").write_text(json.dumps(CONFIG, indent=2))
        os.replace(tmp, dest / "model.safetensors")
    return dest


if __name__ == "__main__":
    print(ensure_gpt2_random())
    print(ensure_gpt2_random_bin())
