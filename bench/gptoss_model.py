"""A random GGUF with gpt-oss-20b's layer, for ``bench.side_by_side --models PATH``.

    .venv/bin/python -m bench.gptoss_model OUT.gguf [--layers 2]

gpt-oss-20b's shapes (width 2880, 64 query / 8 KV heads of 64, 32 experts of 2880 with 4
a token, every other layer windowed to 128, YaRN x32 over 4096) with fewer layers and
SmolLM2's 49,152-token vocabulary (its tokenizer keys copied, so prompts tokenize): the
experts MXFP4 as the release ships them (random codes, scales 2^-8..2^-5), attention,
embeddings and head Q8_0, router, sinks, norms and biases F32, in the layout llama.cpp's
converter writes (``tests/gen_gptoss.py`` holds the tiny one to that layout).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

from bench.big_models import copy_tokenizer
from modelc.formats.ir import DType
from tests.gen_cuda_models import random_blocks

D, N_HEAD, N_KV, HD, N_EXPERT, N_USED, FF, WINDOW = 2880, 64, 8, 64, 32, 4, 2880, 128


def _mxfp4(rng: np.random.Generator, n: int, rows: int, cols: int) -> np.ndarray:
    """Random MXFP4 rows (n, rows, cols / 32 * 17): an E8M0 byte, then 16 bytes of codes."""
    blocks = rng.integers(0, 256, (n, rows, cols // 32, 17), dtype=np.uint8)
    blocks[..., 0] = rng.integers(120, 124, blocks.shape[:-1], dtype=np.uint8)
    return blocks.reshape(n, rows, -1)


def write(path: Path, n_layer: int, tokenizer_from: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    w.add_name(f"random-gpt-oss-20b-{n_layer}l")
    n_vocab = copy_tokenizer(tokenizer_from, w)
    w.add_block_count(n_layer)
    w.add_context_length(131072)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    w.add_rope_freq_base(150000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_USED)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    w.add_sliding_window(WINDOW)
    w.add_expert_feed_forward_length(FF)

    def q8(name: str, rows: int, cols: int, std: float = 0.02) -> None:
        data, raw = random_blocks(rng, DType.Q8_0, rows, cols, std)
        w.add_tensor(name, data, raw_dtype=raw)

    def f32(name: str, *shape: int, mean: float = 0.0, std: float = 0.1) -> None:
        w.add_tensor(name, (mean + std * rng.standard_normal(shape)).astype(np.float32))

    q8("token_embd.weight", n_vocab, D, 1.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        f32(p + "attn_norm.weight", D, mean=1.0)
        f32(p + "post_attention_norm.weight", D, mean=1.0)
        for name, rows in (("q", N_HEAD * HD), ("k", N_KV * HD), ("v", N_KV * HD)):
            q8(p + f"attn_{name}.weight", rows, D)
            f32(p + f"attn_{name}.bias", rows)
        q8(p + "attn_output.weight", D, N_HEAD * HD)
        f32(p + "attn_output.bias", D)
        f32(p + "attn_sinks.weight", N_HEAD, std=1.0)
        f32(p + "ffn_gate_inp.weight", N_EXPERT, D, std=1.0)
        f32(p + "ffn_gate_inp.bias", N_EXPERT)
        mx = gguf.GGMLQuantizationType.MXFP4
        for part, rows, cols in (("gate", FF, D), ("up", FF, D), ("down", D, FF)):
            w.add_tensor(
                p + f"ffn_{part}_exps.weight", _mxfp4(rng, N_EXPERT, rows, cols), raw_dtype=mx
            )
            f32(p + f"ffn_{part}_exps.bias", N_EXPERT, rows)
    f32("output_norm.weight", D, mean=1.0)
    q8("output.weight", n_vocab, D, 0.05)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> int:
    from tests.assets import smollm2_gguf

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    print(write(args.out, args.layers, smollm2_gguf()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
