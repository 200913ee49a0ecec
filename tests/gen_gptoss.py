"""A tiny randomly initialised gpt-oss, made with numpy only (as ``tests/gen_families.py``).

The weights are a pure function of :data:`SEED`: the experts' matrices are drawn as
MXFP4 (random E2M1 codes, random E8M0 scales of each 32 values), so one model has two
exact forms, written to the test-asset cache, never to the repository:

* ``f32``: an HF directory with the experts as float tensors (``gate_up_proj`` (E, d, 2ff),
  gate and up columns interleaved; ``down_proj`` (E, ff, d)), and its GGUF with every
  tensor F32, as llama.cpp's ``convert_hf_to_gguf.py --outtype f32`` writes it;
* ``mxfp4``: an HF directory holding the experts as the release ships them
  (``*_blocks`` (E, rows, cols/32, 16) uint8, two E2M1 codes a byte, low nibble first;
  ``*_scales`` (E, rows, cols/32) uint8 E8M0; ``quantization_config`` mxfp4), and its GGUF
  with the experts MXFP4 (GGML type 39: per 32 values the E8M0 byte, then 16 bytes,
  value j in the low nibble of byte j and value j + 16 in its high nibble), as the
  converter repacks them.

The config is the release's, scaled down: 3 layers alternating sliding (window 4) / full
attention, 4 heads over 2 KV heads, head_dim 16, 4 experts with 2 a token, YaRN (factor
32 over 4096 positions, ``truncate`` false), attention sinks, every bias.  The tokenizer
is the committed 384-token BPE of ``tests/fixtures/families`` with harmony's special
tokens added (ids 384-391) and the release's chat template (``tests/fixtures/templates``).
Run ``python -m tests.gen_gptoss`` to (re)create them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.assets import assets_dir, cache_lock
from tests.gen_tiny import add_gpt2_tokens, write_tokenizer
from tests.gguf_support import gguf_file

FIX = Path(__file__).parent / "fixtures"
VERSION = 2
SEED = 20261205
KINDS = ("f32", "mxfp4")
HARMONY = [
    "<|startoftext|>",
    "<|start|>",
    "<|message|>",
    "<|channel|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|constrain|>",
]
N_VOCAB = 384 + len(HARMONY)
CONFIG: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "vocab_size": N_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "experts_per_token": 2,
    "sliding_window": 4,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "max_position_embeddings": 131072,
    "initial_context_length": 4096,
    "rms_norm_eps": 1e-05,
    "rope_theta": 150000,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "swiglu_limit": 7.0,
    "attention_bias": True,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "router_aux_loss_coef": 0.9,
    "output_router_logits": False,
    "use_cache": True,
    "eos_token_id": 384 + HARMONY.index("<|return|>"),
    "pad_token_id": 0,
    "torch_dtype": "float32",
}
MXFP4_CONFIG = {  # what the release's config.json adds
    "quantization_config": {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
}
# E2M1 (MXFP4's element type): the 16 codes' values, ggml's kvalues_mxfp4 / 2
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
# each expert matrix's E8M0 scales are drawn from these exponents (2^(e-127))
SCALES = {"gate_up_proj": (123, 124), "down_proj": (119, 120)}


FILE_TYPES = {"f32": gguf.LlamaFileType.ALL_F32, "mxfp4": gguf.LlamaFileType.MOSTLY_MXFP4_MOE}


def config(kind: str) -> dict[str, Any]:
    return {**CONFIG, **(MXFP4_CONFIG if kind == "mxfp4" else {})}


def _mxfp4(
    rng: np.random.Generator, n_e: int, rows: int, cols: int, exps: tuple[int, int]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Random HF MXFP4 blocks (n_e, rows, cols/32, 16) and scales (n_e, rows, cols/32)."""
    codes = rng.integers(0, 16, (n_e, rows, cols // 32, 32), dtype=np.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)  # low nibble first
    scales = rng.integers(exps[0], exps[1] + 1, (n_e, rows, cols // 32), dtype=np.uint8)
    return np.ascontiguousarray(blocks), scales


def dequant_hf(blocks: np.ndarray[Any, Any], scales: np.ndarray[Any, Any]) -> Any:
    """HF MXFP4 blocks and scales -> f32 (..., rows, cols), as transformers dequantizes."""
    codes = np.stack([blocks & 0xF, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    vals = E2M1[codes] * np.exp2(scales.astype(np.float32) - 127)[..., None]
    return vals.reshape(*blocks.shape[:-2], -1)


def make_weights(kind: str) -> dict[str, np.ndarray[Any, Any]]:
    """HF tensor names -> arrays of the ``kind`` form, a pure function of :data:`SEED`."""
    cfg = CONFIG
    rng = np.random.default_rng(SEED)
    d, ff, v, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    n_e, nh = cfg["num_local_experts"], cfg["num_attention_heads"]
    nq, nkv = nh * hd, cfg["num_key_value_heads"] * hd

    def w(*shape: int, std: float = 0.08) -> np.ndarray[Any, Any]:
        return (std * rng.standard_normal(shape)).astype(np.float32)

    def norm(n: int) -> np.ndarray[Any, Any]:
        return (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)

    out = {"model.embed_tokens.weight": w(v, d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = norm(d)
        for name, rows in (("q", nq), ("k", nkv), ("v", nkv)):
            out[p + f"self_attn.{name}_proj.weight"] = w(rows, d)
            out[p + f"self_attn.{name}_proj.bias"] = w(rows, std=0.3)
        out[p + "self_attn.o_proj.weight"] = w(d, nq)
        out[p + "self_attn.o_proj.bias"] = w(d, std=0.3)
        out[p + "self_attn.sinks"] = w(nh, std=1.0)
        out[p + "post_attention_layernorm.weight"] = norm(d)
        out[p + "mlp.router.weight"] = w(n_e, d, std=1.0)  # decisive top-k
        out[p + "mlp.router.bias"] = w(n_e, std=0.3)
        e = p + "mlp.experts."
        for name, rows, cols in (("gate_up_proj", 2 * ff, d), ("down_proj", d, ff)):
            blocks, scales = _mxfp4(rng, n_e, rows, cols, SCALES[name])
            if kind == "mxfp4":
                out[e + name + "_blocks"], out[e + name + "_scales"] = blocks, scales
            else:  # HF's float layout: (E, in, out)
                out[e + name] = np.ascontiguousarray(dequant_hf(blocks, scales).swapaxes(1, 2))
        out[e + "gate_up_proj_bias"] = w(n_e, 2 * ff, std=1.0)  # reaches the clamp at 7
        out[e + "down_proj_bias"] = w(n_e, d, std=0.3)
    out["model.norm.weight"] = norm(d)
    out["lm_head.weight"] = w(v, d)
    return out


def tokenizer_files(dest: Path) -> None:
    """The committed BPE with harmony's special tokens and the release's chat template."""
    tc = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|startoftext|>",
        "eos_token": "<|return|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "chat_template": (FIX / "templates" / "openai-gpt-oss-120b.jinja").read_text(),
    }
    write_tokenizer(dest, HARMONY, tc)


def gptoss_dir(kind: str) -> Path:
    return assets_dir() / f"tiny-gptoss-v{VERSION}" / kind


def ensure_gptoss(kind: str) -> tuple[Path, Path]:
    """The ``kind`` form's HF directory and GGUF (created if missing)."""
    from safetensors.numpy import save_file

    dest = gptoss_dir(kind)
    hf, gg = dest / "hf", dest / f"gptoss-{kind}.gguf"
    with cache_lock(f"tiny-gptoss-v{VERSION}-{kind}"):
        if gg.exists() and (hf / "model.safetensors").exists():
            return hf, gg
        hf.mkdir(parents=True, exist_ok=True)
        weights = make_weights(kind)
        tokenizer_files(hf)
        (hf / "config.json").write_text(json.dumps(config(kind), indent=2))
        save_file(weights, str(hf / "model.safetensors.tmp"), metadata={"format": "pt"})
        os.replace(hf / "model.safetensors.tmp", hf / "model.safetensors")
        write_gguf(kind, make_weights("mxfp4"), gg)
    return hf, gg


def to_ggml_mxfp4(blocks: np.ndarray[Any, Any], scales: np.ndarray[Any, Any]) -> Any:
    """HF MXFP4 (..., rows, cols/32, 16) + (..., rows, cols/32) -> GGML's MXFP4 rows
    (..., rows, cols/32 * 17): each block's E8M0 byte, then value j | value j + 16 << 4."""
    codes = np.stack([blocks & 0xF, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    packed = codes[..., :16] | (codes[..., 16:] << 4)
    out = np.concatenate([scales[..., None], packed], axis=-1)
    return np.ascontiguousarray(out.reshape(*out.shape[:-2], -1))


def write_gguf(kind: str, weights: dict[str, np.ndarray[Any, Any]], path: Path) -> None:
    """The GGUF llama.cpp's converter writes of the ``kind`` HF directory (``weights``:
    the MXFP4 form's), key for key and tensor for tensor (``tests/golden/gptoss_manifest.json``)."""
    cfg = config(kind)
    rs = cfg["rope_scaling"]
    with gguf_file(path, "gpt-oss", atomic=True) as w:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name("Hf")  # the converter names the model after its directory
        w.add_size_label("4x128K")
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(cfg["hidden_size"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count(cfg["num_attention_heads"])
        w.add_head_count_kv(cfg["num_key_value_heads"])
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rs["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rs["beta_slow"])
        w.add_rope_freq_base(cfg["rope_theta"])
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_expert_count(cfg["num_local_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        # the converter marks a file with MXFP4 experts MOSTLY_MXFP4_MOE whatever --outtype
        w.add_file_type(FILE_TYPES[kind])
        w.add_sliding_window(cfg["sliding_window"])
        w.add_expert_feed_forward_length(cfg["intermediate_size"])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _add_vocab(w)
        nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, cfg["num_hidden_layers"])
        for name, data in weights.items():
            if name.endswith("_scales"):
                continue
            if ".mlp.experts." in name:
                _add_experts(w, kind, name, data, weights)
                continue
            new = nmap.get_name(
                name + (".weight" if name.endswith("sinks") else ""),
                try_suffixes=(".weight", ".bias"),
            )
            assert new is not None, name
            w.add_tensor(new, np.ascontiguousarray(data, dtype=np.float32))


def _add_experts(
    w: gguf.GGUFWriter,
    kind: str,
    name: str,
    data: np.ndarray[Any, Any],
    weights: dict[str, np.ndarray[Any, Any]],
) -> None:
    """An expert tensor as the converter splits gate_up (rows ::2 the gate, 1::2 the up)
    and stacks it: MXFP4 blocks repacked, or dequantized to F32."""
    i = name.split(".")[2]
    if name.endswith("_bias"):
        if "gate_up" in name:
            w.add_tensor(f"blk.{i}.ffn_gate_exps.bias", np.ascontiguousarray(data[:, ::2]))
            w.add_tensor(f"blk.{i}.ffn_up_exps.bias", np.ascontiguousarray(data[:, 1::2]))
        else:
            w.add_tensor(f"blk.{i}.ffn_down_exps.bias", data)
        return
    scales = weights[name.replace("_blocks", "_scales")]
    parts = {"down": (data, scales)}
    if "gate_up" in name:
        parts = {"gate": (data[:, ::2], scales[:, ::2]), "up": (data[:, 1::2], scales[:, 1::2])}
    for proj, (b, s) in parts.items():
        new = f"blk.{i}.ffn_{proj}_exps.weight"
        if kind == "mxfp4":
            w.add_tensor(new, to_ggml_mxfp4(b, s), raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            w.add_tensor(new, np.ascontiguousarray(dequant_hf(b, s)))


def _add_vocab(w: gguf.GGUFWriter) -> None:
    """The vocabulary as the converter's ``_set_vocab_gpt2`` writes it."""
    specials = add_gpt2_tokens(w, N_VOCAB, HARMONY)
    w.add_bos_token_id(specials["<|startoftext|>"])
    w.add_eos_token_id(specials["<|return|>"])
    w.add_pad_token_id(specials["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template((FIX / "templates" / "openai-gpt-oss-120b.jinja").read_text())


if __name__ == "__main__":
    for k in KINDS:
        print(*ensure_gptoss(k))
