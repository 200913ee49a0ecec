"""Randomly initialised ~1B and ~3B llama-shape GGUFs for the CPU speed comparisons.

    .venv/bin/python -m bench.big_models OUT_DIR [--models 1b-q4_k_m,1b-q8_0,3b-q4_k_m,135m-q4_k_m,1b-q5_k_m,1b-q3_k_m,moe-q4_k_m]

Real vocabulary (SmolLM2's byte-level BPE, its chat template), so both modelc and
llama.cpp's server tokenize text prompts the same way; every matrix is random blocks of
its type (``tests.gen_cuda_models.random_blocks``: scales set so each weight's standard
deviation is near 0.02), so a 3B file takes seconds, not a quantizer's minutes.

``q4_k_m`` follows llama.cpp's ``LLAMA_FTYPE_MOSTLY_Q4_K_M`` recipe for llama models
(``llama_tensor_get_type``): Q4_K everywhere except ``output.weight`` (Q6_K) and
``attn_v`` / ``ffn_down`` in the layers its ``use_more_bits`` picks (the first and last
eighth, and every third layer between), which are Q6_K.  ``q5_k_m`` (``LLAMA_FTYPE_MOSTLY_Q5_K_M``)
is the same with Q5_K for Q4_K.  ``q3_k_m`` (``LLAMA_FTYPE_MOSTLY_Q3_K_M``): Q3_K except
``output.weight`` (Q6_K), ``attn_output`` and ``ffn_down`` (Q4_K; ``ffn_down`` in the first
sixteenth Q5_K) and ``attn_v`` (Q5_K in the first two layers, else Q4_K).

``smollm2-f16`` / ``smollm2-bf16`` are not random: SmolLM2-135M-Instruct's own weights
(the test asset's Q4_1 / Q8_0 blocks dequantized) with every matrix stored as F16 / BF16
and its metadata as is, the float-weight model a user gets from an F16 GGUF or an HF
directory packed without ``--quantize``; written as ``smollm2-135m-f16.gguf`` etc.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from modelc.formats.ir import DType
from tests.gen_cuda_models import random_blocks


@dataclass(frozen=True)
class BigShape:
    d: int
    n_layer: int
    n_head: int
    n_head_kv: int
    ff: int  # with experts: each expert's
    n_ctx: int = 4096
    n_expert: int = 0  # a mixture of experts (Mixtral's llama layout): experts a layer
    n_expert_used: int = 0


# Llama 3.2 1B and 3B shapes (SmolLM2's 49,152-token vocabulary instead of 128,256); and
# SmolLM2-135M's size with a width K-quants can hold (its 576 is no multiple of 256, so
# llama.cpp's Q4_K_M of SmolLM2 itself falls back to other types in most tensors)
SHAPES = {
    "135m": BigShape(d=512, n_layer=30, n_head=8, n_head_kv=4, ff=1536),
    "1b": BigShape(d=2048, n_layer=16, n_head=32, n_head_kv=8, ff=8192),
    "3b": BigShape(d=3072, n_layer=28, n_head=24, n_head_kv=8, ff=8192),
    # Qwen3-30B-A3B's layer (width 2048, 32 / 4 heads, experts of 768, 8 a token) with 64
    # experts, not 128, and 12 layers, not 48: 3.9B parameters, 0.6B active a token
    "moe": BigShape(
        d=2048, n_layer=12, n_head=32, n_head_kv=4, ff=768, n_expert=64, n_expert_used=8
    ),
}
MODELS = (
    "1b-q4_k_m",
    "1b-q8_0",
    "3b-q4_k_m",
    "135m-q4_k_m",
    "1b-q5_k_m",
    "1b-q3_k_m",
    "moe-q4_k_m",
    "smollm2-f16",
    "smollm2-bf16",
)
FLOAT_COPIES = {"smollm2-f16": "F16", "smollm2-bf16": "BF16"}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of layers whose attn_v / ffn_down get more bits."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(name: str, layer: int, n_layer: int, ftype: str) -> DType:
    if ftype == "q8_0":
        return DType.Q8_0
    if name == "output.weight":
        return DType.Q6_K
    if ftype == "q3_k_m":
        if name == "attn_v":
            return DType.Q5_K if layer < 2 else DType.Q4_K
        if name == "ffn_down":
            return DType.Q5_K if layer < n_layer // 16 else DType.Q4_K
        return DType.Q4_K if name == "attn_output" else DType.Q3_K
    if name in ("attn_v", "ffn_down") and use_more_bits(layer, n_layer):
        return DType.Q6_K
    return DType.Q5_K if ftype == "q5_k_m" else DType.Q4_K


def copy_tokenizer(src: Path, w: gguf.GGUFWriter) -> int:
    """Every ``tokenizer.*`` key of ``src`` into ``w``; returns the vocabulary size."""
    r = gguf.GGUFReader(str(src))
    n_vocab = 0
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        val = f.contents()
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(val)
        w.add_key_value(key, val, vtype, sub)
    return n_vocab


def write_model(path: Path, size: str, ftype: str, tokenizer_from: Path, seed: int = 0) -> Path:
    shape = SHAPES[size]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"random-llama-{size}-{ftype}")
    n_vocab = copy_tokenizer(tokenizer_from, w)
    w.add_block_count(shape.n_layer)
    w.add_context_length(shape.n_ctx)
    w.add_embedding_length(shape.d)
    w.add_feed_forward_length(shape.ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_rope_dimension_count(shape.d // shape.n_head)
    if shape.n_expert:
        w.add_expert_count(shape.n_expert)
        w.add_expert_used_count(shape.n_expert_used)
    w.add_file_type(
        {
            "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
            "q5_k_m": gguf.LlamaFileType.MOSTLY_Q5_K_M,
            "q3_k_m": gguf.LlamaFileType.MOSTLY_Q3_K_M,
        }.get(ftype, gguf.LlamaFileType.MOSTLY_Q4_K_M)
    )
    hd = shape.d // shape.n_head

    def mat(name: str, layer: int, rows: int, cols: int, std: float = 0.02, n: int = 0) -> None:
        """A (rows, cols) matrix, or ``n`` of them stacked (a mixture's experts)."""
        short = name.split(".")[-2].removesuffix("_exps") if layer >= 0 else name
        dt = tensor_type(short, layer, shape.n_layer, ftype)
        data, raw = random_blocks(rng, dt, rows * max(n, 1), cols, std)
        w.add_tensor(name, data.reshape(n, rows, -1) if n else data, raw_dtype=raw)

    def norm(name: str, n: int) -> None:
        w.add_tensor(name, rng.uniform(0.8, 1.2, n).astype(np.float32))

    mat("token_embd.weight", -1, n_vocab, shape.d, 1.0)
    for i in range(shape.n_layer):
        norm(f"blk.{i}.attn_norm.weight", shape.d)
        mat(f"blk.{i}.attn_q.weight", i, shape.n_head * hd, shape.d)
        mat(f"blk.{i}.attn_k.weight", i, shape.n_head_kv * hd, shape.d)
        mat(f"blk.{i}.attn_v.weight", i, shape.n_head_kv * hd, shape.d)
        mat(f"blk.{i}.attn_output.weight", i, shape.d, shape.n_head * hd)
        norm(f"blk.{i}.ffn_norm.weight", shape.d)
        if shape.n_expert:  # the router in f32 (as llama.cpp's quantizer leaves it)
            router = rng.standard_normal((shape.n_expert, shape.d)).astype(np.float32)
            w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", router)
            for part, rows, cols in (("gate", shape.ff, shape.d), ("up", shape.ff, shape.d)):
                mat(f"blk.{i}.ffn_{part}_exps.weight", i, rows, cols, n=shape.n_expert)
            mat(f"blk.{i}.ffn_down_exps.weight", i, shape.d, shape.ff, n=shape.n_expert)
            continue
        mat(f"blk.{i}.ffn_gate.weight", i, shape.ff, shape.d)
        mat(f"blk.{i}.ffn_up.weight", i, shape.ff, shape.d)
        mat(f"blk.{i}.ffn_down.weight", i, shape.d, shape.ff)
    norm("output_norm.weight", shape.d)
    mat("output.weight", -1, n_vocab, shape.d, 0.05)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_float_copy(path: Path, src: Path, ftype: str) -> Path:
    """``src`` with each matrix dequantized and stored as ``ftype`` (F16 or BF16), vectors
    as F32, every metadata key as it is but the file type."""
    from gguf.quants import dequantize, quantize

    r = gguf.GGUFReader(str(src))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(str(path), arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        vtype = f.types[0]
        w.add_key_value(
            key, f.contents(), vtype, f.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        )
    qt = gguf.GGMLQuantizationType[ftype]
    w.add_file_type(
        gguf.LlamaFileType.MOSTLY_F16 if ftype == "F16" else gguf.LlamaFileType.MOSTLY_BF16
    )
    for t in r.tensors:
        shape = tuple(int(v) for v in reversed(t.shape))  # numpy order
        vals = dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if len(shape) < 2:
            w.add_tensor(t.name, vals)
        elif ftype == "F16":
            w.add_tensor(t.name, vals.astype(np.float16))
        else:
            w.add_tensor(t.name, quantize(vals, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def model_path(out: Path, name: str) -> Path:
    if name in FLOAT_COPIES:
        return out / f"smollm2-135m-{name.split('-')[1]}.gguf"
    return out / f"random-llama-{name}.gguf"


def main() -> int:
    from tests.assets import smollm2_gguf

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--models", default=",".join(MODELS), help=f"any of {', '.join(MODELS)}")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in (m.strip() for m in args.models.split(",") if m.strip()):
        if name not in MODELS:
            print(f"unknown model {name!r}: pick from {', '.join(MODELS)}", file=sys.stderr)
            return 2
        size, ftype = name.split("-", 1)
        p = model_path(args.out, name)
        if not p.exists():
            tmp = p.with_suffix(".part")
            if name in FLOAT_COPIES:
                write_float_copy(tmp, smollm2_gguf(), FLOAT_COPIES[name])
            else:
                write_model(tmp, size, ftype, smollm2_gguf())
            tmp.rename(p)
        print(f"{p} {p.stat().st_size / 1e6:,.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
