"""Writing GGUF files for the tests (and ``bench/``): the one place gguf-py's writer is driven.

:func:`gguf_file` opens a ``gguf.GGUFWriter``; the caller adds metadata and tensors in the
block, and leaving it writes the header, the key-values and the tensors, in that order,
and closes the file (``atomic=True``: under ``NAME.PID.tmp``, renamed once complete, so a
cached model is never seen half-written, even by a parallel worker).  :func:`add_matrix` stores a float matrix in a
GGUF type, :func:`add_llama_shape` the llama-style hyper-parameters (:func:`hf_gguf`: from an HF config), and :func:`write_gguf`
a whole file from plain dicts; :func:`manifest` what a GGUF holds, to compare two writers.  The bytes are exactly what the same gguf-py calls made by
hand give (the goldens of the generated models do not move).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gguf
import gguf.quants
import numpy as np

from tests.gguf_manifest import read

G = gguf.GGMLQuantizationType


@contextmanager
def gguf_file(path: Path, arch: str, *, atomic: bool = False) -> Iterator[gguf.GGUFWriter]:
    """A writer for ``path`` (architecture ``arch``); the file is written when the block ends."""
    dest = path.with_name(f"{path.name}.{os.getpid()}.tmp") if atomic else path
    w = gguf.GGUFWriter(str(dest), arch)
    try:
        yield w
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    if atomic:
        os.replace(dest, path)


def add_matrix(
    w: gguf.GGUFWriter, name: str, data: np.ndarray[Any, Any], qtype: G | None = None
) -> None:
    """``data`` (float32) stored as ``qtype``: F32 (or None) as it is, F16 as float16, any
    other type as gguf-py's quantized blocks."""
    if qtype is None or qtype == G.F32:
        w.add_tensor(name, data)
    elif qtype == G.F16:
        w.add_tensor(name, data.astype(np.float16))
    else:
        w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


def add_llama_shape(
    w: gguf.GGUFWriter,
    *,
    n_layer: int,
    n_ctx: int,
    d: int,
    ff: int,
    n_head: int,
    n_head_kv: int,
    rope_base: float,
    rms_eps: float,
) -> None:
    """The llama-style hyper-parameters, in the order ``convert_hf_to_gguf`` writes them."""
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(rms_eps)


@contextmanager
def hf_gguf(
    path: Path,
    arch: str,
    name: str,
    cfg: Mapping[str, Any],
    *,
    ff: int | None = None,
    rope_base: float | None = None,
) -> Iterator[gguf.GGUFWriter]:
    """:func:`gguf_file` (atomic) of an f32 model begun as ``convert_hf_to_gguf`` begins one
    from its HF ``config.json`` ``cfg``: type, ``name``, file type, then the llama-style
    hyper-parameters (``ff`` and ``rope_base`` where the config names them otherwise)."""
    with gguf_file(path, arch, atomic=True) as w:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(name)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        add_llama_shape(
            w,
            n_layer=cfg["num_hidden_layers"],
            n_ctx=cfg["max_position_embeddings"],
            d=cfg["hidden_size"],
            ff=cfg["intermediate_size"] if ff is None else ff,
            n_head=cfg["num_attention_heads"],
            n_head_kv=cfg["num_key_value_heads"],
            rope_base=cfg["rope_theta"] if rope_base is None else rope_base,
            rms_eps=cfg["rms_norm_eps"],
        )
        yield w


def write_gguf(
    path: Path,
    arch: str,
    kv: Mapping[str, Any],
    tensors: Mapping[str, tuple[np.ndarray[Any, Any], G | None]],
) -> Path:
    """A GGUF of plain values: ``kv`` typed by value (bool, int as uint32, float as float32,
    str, list as an array), ``tensors`` as ``name: (array, raw type or None)``."""
    with gguf_file(path, arch) as w:
        for k, v in kv.items():
            if isinstance(v, bool):
                w.add_bool(k, v)
            elif isinstance(v, int):
                w.add_uint32(k, v)
            elif isinstance(v, float):
                w.add_float32(k, v)
            elif isinstance(v, str):
                w.add_string(k, v)
            else:
                w.add_array(k, v)
        for name, (arr, raw) in tensors.items():
            w.add_tensor(name, arr, raw_dtype=raw)
    return path


def tiny_llama(path: Path) -> Path:
    """A one-layer random llama (d 64, GQA 4/2, linear rope scaling, a 3-token gpt2 vocabulary,
    one Q8_0 matrix): the GGUF reader's and the fuzzers' seed file."""
    rng = np.random.default_rng(0)
    return write_gguf(
        path,
        "llama",
        {
            "llama.block_count": 1,
            "llama.context_length": 128,
            "llama.embedding_length": 64,
            "llama.feed_forward_length": 96,
            "llama.attention.head_count": 4,
            "llama.attention.head_count_kv": 2,
            "llama.rope.freq_base": 5e5,
            "llama.attention.layer_norm_rms_epsilon": 1e-6,
            "llama.rope.scaling.type": "linear",
            "llama.rope.scaling.factor": 2.0,
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.tokens": ["a", "b", "<s>"],
            "tokenizer.ggml.token_type": [1, 1, 3],
            "tokenizer.ggml.merges": ["a b"],
            "tokenizer.ggml.bos_token_id": 2,
            "tokenizer.chat_template": "{{ messages }}",
        },
        {
            "token_embd.weight": (rng.standard_normal((3, 64)).astype(np.float32), None),
            "blk.0.attn_q.weight": (
                gguf.quants.quantize(rng.standard_normal((64, 64)).astype(np.float32), G.Q8_0),
                G.Q8_0,
            ),
            "output_norm.weight": (np.ones(64, np.float32), None),
        },
    )


NAMING = ("general.name", "general.size_label", "general.basename", "general.finetune")


def unnamed(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A manifest's metadata without the naming keys (the converter names a model after
    its directory)."""
    return {k: v for k, v in metadata.items() if k not in NAMING}


def manifest(path: Path) -> dict[str, Any]:
    """A GGUF's metadata (long lists as their sha256) and per tensor its name, type, shape
    and the sha256 of its bytes: what two writers of one model are compared on."""
    meta, tensors = read(path, lambda k: True, digits=9)
    rows = [
        {"name": t.name, "type": t.type, "shape": t.shape, "sha256": t.sha256}
        for t in sorted(tensors, key=lambda t: t.name)
    ]
    return {"metadata": meta, "tensors": rows}
