"""Randomly initialised llama-shape GGUF files with their matrices in any GGUF block type.

The blocks are drawn directly (random quants, scales set so every weight has a standard
deviation near ``std``), so a 1B model in Q4_0 or Q8_0 takes seconds to make; the CUDA
tests and ``bench/cuda_bench.py`` use it.  ``python -m tests.gen_cuda_models OUT_DIR``
writes the ~1.1B TinyLlama-shape model in Q4_0, Q8_0 and Q4_K_M (Q4_K + Q6_K, as
llama.cpp mixes them); ``... OUT_DIR 8b`` the Llama-3-8B-shape one in Q4_0
(``llama8b-q4_0.gguf``, ~4.4 GB: partial offload's test), ``... OUT_DIR 8b-q4_k_m`` in
Q4_K_M (``llama8b-q4_k_m.gguf``, ~4.9 GB: issue 35's batch-1 figure).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from modelc.formats.ir import BLOCK_SIZES, DType
from tests.gguf_support import add_llama_shape, gguf_file

Q = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class Shape:
    n_vocab: int = 32000
    d: int = 2048
    n_layer: int = 22
    n_head: int = 32
    n_head_kv: int = 4
    ff: int = 5632
    n_ctx: int = 4096


TINYLLAMA = Shape()  # ~1.1B parameters
LLAMA8B = Shape(n_vocab=128256, d=4096, n_layer=32, n_head=32, n_head_kv=8, ff=14336, n_ctx=8192)
SMALL = Shape(n_vocab=512, d=256, n_layer=2, n_head=4, n_head_kv=2, ff=512, n_ctx=512)


def _f16_field(rng: np.random.Generator, n: int, scale: float) -> np.ndarray[Any, Any]:
    d = (scale * rng.uniform(0.5, 1.5, n)).astype(np.float16)
    return d.view(np.uint8).reshape(n, 2)


def _scaled(field: np.ndarray[Any, Any], k: float) -> np.ndarray[Any, Any]:
    """An f16 field (n, 2) of k times another's values (a min that centres the weights)."""
    v = k * field.copy().view(np.float16).astype(np.float32)
    return v.astype(np.float16).view(np.uint8).reshape(-1, 2)


def random_blocks(
    rng: np.random.Generator, dtype: DType, rows: int, cols: int, std: float
) -> tuple[np.ndarray[Any, Any], Any]:
    """(data, raw GGML type) for a (rows, cols) matrix of random ``dtype`` blocks."""
    if dtype in (DType.F32, DType.F16):
        x = rng.normal(0, std, (rows, cols)).astype(
            np.float32 if dtype is DType.F32 else np.float16
        )
        return x, None
    if dtype is DType.BF16:  # f32 rounded to its high half (to nearest, ties to even)
        u = rng.normal(0, std, (rows, cols)).astype(np.float32).view(np.uint32)
        bits = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        return bits.astype(np.uint16).view(np.uint8).reshape(rows, -1), Q.BF16
    bs, ts = BLOCK_SIZES[dtype]
    nb = rows * cols // bs
    b = rng.integers(0, 256, (nb, ts), dtype=np.uint8)
    if dtype is DType.Q4_0:  # nibble - 8: std ~4.6
        b[:, :2] = _f16_field(rng, nb, std / 4.6)
    elif dtype is DType.Q4_1:  # d * nibble + m, centred
        b[:, :2] = _f16_field(rng, nb, std / 4.6)
        b[:, 2:4] = _scaled(b[:, :2], -7.5)
    elif dtype is DType.Q8_0:  # int8: std ~74
        b[:, :2] = _f16_field(rng, nb, std / 74)
    elif dtype is DType.Q5_0:  # 5-bit q - 16: std ~9.2
        b[:, :2] = _f16_field(rng, nb, std / 9.2)
    elif dtype is DType.Q5_1:  # d * q + m, centred
        b[:, :2] = _f16_field(rng, nb, std / 9.2)
        b[:, 2:4] = _scaled(b[:, :2], -15.5)
    elif dtype is DType.Q2_K:  # d * sc * q - dmin * mn; 4-bit sc, mn ~7.5, q ~1.5
        b[:, 80:82] = _f16_field(rng, nb, std / (7.5 * 1.1))
        b[:, 82:84] = _scaled(b[:, 80:82], 1.5)
    elif dtype in (DType.IQ4_NL, DType.IQ4_XS):  # d (* 6-bit scale - 32) * level: std ~70
        b[:, :2] = _f16_field(rng, nb, std / (70 if dtype is DType.IQ4_NL else 70 * 18))
    elif dtype is DType.Q4_K:  # d * sc * q - dmin * mn; 6-bit sc, mn ~32, q ~7.5
        b[:, :2] = _f16_field(rng, nb, std / (32 * 4.6))
        b[:, 2:4] = _scaled(b[:, :2], 7.5)  # centred: E[sc] = E[mn]
    elif dtype is DType.Q3_K:  # d * sc(6-bit, -32..31) * (q in -4..3)
        b[:, 108:110] = _f16_field(rng, nb, std / (18 * 2.3))
    elif dtype is DType.Q5_K:  # as Q4_K with 5-bit q ~15.5
        b[:, :2] = _f16_field(rng, nb, std / (32 * 9.2))
        b[:, 2:4] = _scaled(b[:, :2], 15.5)
    elif dtype is DType.Q6_K:  # d * sc(int8) * (q - 32)
        b[:, 208:210] = _f16_field(rng, nb, std / (74 * 18))
    elif dtype is DType.MXFP4:  # level (doubled E2M1, std ~5.9) * 2^(e - 128)
        e = round(128 + np.log2(std / 5.9))
        b[:, 0] = rng.integers(e - 1, e + 2, nb)
        b[: min(2, nb), 0] = (0, 1)[: min(2, nb)]  # the subnormal scales (e < 2) too
    else:
        raise ValueError(f"no random blocks for {dtype}")
    return b.reshape(rows, -1), Q[dtype.name]


def as_the_gpu_reads(w: Any) -> np.ndarray[Any, Any]:
    """The f32 values of ``w`` (a :class:`~modelc.runtime.backend.Weight`) as the GPU's
    kernels read them: CuPy compiles every kernel with ``-ftz=true`` (a caller's
    ``-ftz=false`` is overridden: cupy/cupy#9576), so a subnormal operand of a float
    instruction is a signed zero there. Of the stored types only MXFP4 meets one: its two
    smallest E8M0 scales (2^-128, 2^-127, which ``random_blocks`` makes on purpose) are
    subnormal halved, and their blocks read as zeros (the CPU keeps them:
    tests/test_cuda_quants_host.py). No real model's scale is that small."""
    from modelc.runtime.backends.numpy_ref import dequantize_weight

    dense = dequantize_weight(w)
    if w.dtype is DType.MXFP4:
        blocks = dense.reshape(-1, 32).copy()
        blocks[np.asarray(w.data).reshape(-1, 17)[:, 0] < 2] = 0.0
        dense = blocks.reshape(dense.shape)
    return dense


# llama.cpp's Q4_K_M: Q6_K for attn_v, half the layers' ffn_down (its use_more_bits:
# the first and last eighth and every third between) and the output; Q4_K elsewhere
Q4_K_M = "Q4_K_M"


def _q4_k_m(name: str, n_layer: int) -> DType:
    if name == "output.weight":
        return DType.Q6_K
    if name.endswith(("attn_v.weight", "ffn_down.weight")):
        i = int(name.split(".")[1])
        more = i < n_layer // 8 or i >= 7 * n_layer // 8 or (i - n_layer // 8) % 3 == 2
        return DType.Q6_K if more else DType.Q4_K
    return DType.Q4_K


def add_spm_vocab(w: Any, n_vocab: int) -> None:
    """A SentencePiece vocabulary of ``n_vocab`` pieces (the three specials, the 256 byte
    pieces, printable characters alone and after ``▁``, then filler pieces), so that
    llama.cpp's tools and modelc's text routes load the random model."""
    chars = [chr(c) for c in range(33, 127)]
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    pieces += ["▁", *chars, *("▁" + c for c in chars)]
    pieces += [f"▁w{i}" for i in range(n_vocab - len(pieces))]
    types = [2, 3, 3, *([6] * 256), *([1] * (n_vocab - 259))]  # unknown, control, byte, normal
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces[:n_vocab])
    w.add_token_scores([-float(i) for i in range(n_vocab)])
    w.add_token_types(types[:n_vocab])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)


def write_random_llama(
    path: Path,
    dtype: DType | str,
    shape: Shape = TINYLLAMA,
    *,
    seed: int = 0,
    std: float = 0.02,
) -> Path:
    """A llama GGUF of ``shape`` whose every matrix is random ``dtype`` blocks (or the
    mixture of :data:`Q4_K_M`)."""
    rng = np.random.default_rng(seed)
    with gguf_file(path, "llama") as w:
        w.add_name(f"random-llama-{(dtype if isinstance(dtype, str) else dtype.name).lower()}")
        add_llama_shape(
            w,
            n_layer=shape.n_layer,
            n_ctx=shape.n_ctx,
            d=shape.d,
            ff=shape.ff,
            n_head=shape.n_head,
            n_head_kv=shape.n_head_kv,
            rope_base=10000.0,
            rms_eps=1e-5,
        )
        w.add_vocab_size(shape.n_vocab)
        add_spm_vocab(w, shape.n_vocab)
        hd = shape.d // shape.n_head

        def mat(name: str, rows: int, cols: int, s: float = std) -> None:
            dt = _q4_k_m(name, shape.n_layer) if dtype == Q4_K_M else DType(dtype)
            data, raw = random_blocks(rng, dt, rows, cols, s)
            w.add_tensor(name, data, raw_dtype=raw)

        def norm(name: str, n: int) -> None:
            w.add_tensor(name, rng.uniform(0.8, 1.2, n).astype(np.float32))

        mat("token_embd.weight", shape.n_vocab, shape.d, 1.0)
        for i in range(shape.n_layer):
            norm(f"blk.{i}.attn_norm.weight", shape.d)
            mat(f"blk.{i}.attn_q.weight", shape.n_head * hd, shape.d)
            mat(f"blk.{i}.attn_k.weight", shape.n_head_kv * hd, shape.d)
            mat(f"blk.{i}.attn_v.weight", shape.n_head_kv * hd, shape.d)
            mat(f"blk.{i}.attn_output.weight", shape.d, shape.n_head * hd)
            norm(f"blk.{i}.ffn_norm.weight", shape.d)
            mat(f"blk.{i}.ffn_gate.weight", shape.ff, shape.d)
            mat(f"blk.{i}.ffn_up.weight", shape.ff, shape.d)
            mat(f"blk.{i}.ffn_down.weight", shape.d, shape.ff)
        norm("output_norm.weight", shape.d)
        mat("output.weight", shape.n_vocab, shape.d, 0.05)
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    if sys.argv[2:] == ["8b"]:
        print(write_random_llama(out / "llama8b-q4_0.gguf", DType.Q4_0, LLAMA8B))
        sys.exit()
    if sys.argv[2:] == ["8b-q4_k_m"]:
        print(write_random_llama(out / "llama8b-q4_k_m.gguf", Q4_K_M, LLAMA8B))
        sys.exit()
    for dt in (DType.Q4_0, DType.Q8_0, Q4_K_M):
        name = dt if isinstance(dt, str) else dt.name
        print(write_random_llama(out / f"llama1b-{name.lower()}.gguf", dt))
