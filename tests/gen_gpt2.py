"""A small randomly initialised GPT-2 (real 50257-token vocabulary), made with numpy only.

The weights are a pure function of ``SEED``, so the tests (no torch) and the golden
script (``scripts/make_goldens.py``, which loads the very same files into
transformers' ``GPT2LMHeadModel``) see identical numbers.  The directory is a Hugging
Face model directory (``config.json`` + ``model.safetensors`` with the tensor names
``save_pretrained`` writes), kept in the test-asset cache, never in the repository.

Run ``python -m tests.gen_gpt2`` to (re)create it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from tests.assets import assets_dir

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


def ensure_gpt2_random() -> Path:
    """Create the model directory if it is missing; return it."""
    from safetensors.numpy import save_file

    dest = gpt2_random_dir()
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
