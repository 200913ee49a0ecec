"""A tiny randomly initialised Qwen2.5-VL, made with numpy only.

As ``tests/gen_gemma3vl.py``: the weights are a pure function of a seed, so the tests (no
torch) and ``scripts/make_tiny_qwen25vl.py`` (which loads the same HF directory into
transformers for the goldens and runs llama.cpp's converter on it) see identical numbers.
Written to the test-asset cache, never to the repository, as

* an HF directory shaped like the Hub's ``Qwen/Qwen2.5-VL-3B-Instruct`` (a flat
  ``config.json``, ``model.*`` / ``visual.*`` weights), scaled down: text 3 layers of width
  64, 4 query heads on 2 KV heads of 16, M-RoPE sections 2/3/3 of its 8 pairs (the
  release's 16/24/24 of 64); vision 4 blocks of width 32, 2 heads, patch 14, temporal patch
  2, windows of 112 pixels with blocks 1 and 3 attending fully (the release's 7, 15, 23, 31
  of 32), a 2x2 merger into the text width; the families' 384-token tokenizer with
  Qwen2.5-VL's vision tokens added (384..388) and the release's chat template;
* ``qwen25vl.gguf``: the text model as ``convert_hf_to_gguf.py`` writes ``qwen2vl``, and
* ``mmproj-qwen25vl.gguf``: the tower and merger as its ``--mmproj`` writes them
  (``qwen2.5vl_merger``; Q/K/V split, the 3-D patch kernel as two 2-D ones).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests import vision_support
from tests.assets import assets_dir
from tests.gen_tiny import add_gpt2_tokens, write_tokenizer
from tests.gguf_support import hf_gguf
from tests.vision_support import VlmRand, decoder_weights, ensure_vlm, mmproj_file

FIX = Path(__file__).parent / "fixtures" / "qwenvl"
VERSION = 2  # bump when the weights or the layout change
SEED = 20261206
SPECIAL = {
    "<|vision_start|>": 384,
    "<|vision_end|>": 385,
    "<|vision_pad|>": 386,
    "<|image_pad|>": 387,
    "<|video_pad|>": 388,
}
N_VOCAB = 389
SECTIONS = [2, 3, 3]
VISION: dict[str, Any] = {
    "depth": 4,
    "hidden_act": "silu",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_heads": 2,
    "in_chans": 3,
    "out_hidden_size": 64,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "spatial_patch_size": 14,
    "window_size": 112,
    "fullatt_block_indexes": [1, 3],
    "tokens_per_second": 2,
    "temporal_patch_size": 2,
}
CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "vision_start_token_id": SPECIAL["<|vision_start|>"],
    "vision_end_token_id": SPECIAL["<|vision_end|>"],
    "vision_token_id": SPECIAL["<|vision_pad|>"],
    "image_token_id": SPECIAL["<|image_pad|>"],
    "video_token_id": SPECIAL["<|video_pad|>"],
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 2048,
    "max_window_layers": 3,
    "num_attention_heads": 4,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "sliding_window": 2048,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "use_cache": True,
    "use_sliding_window": False,
    "vision_config": VISION,
    "rope_scaling": {"type": "mrope", "mrope_section": SECTIONS},
    "vocab_size": N_VOCAB,
}
MEAN = [0.48145466, 0.4578275, 0.40821073]  # OpenAI CLIP's, as the release
STD = [0.26862954, 0.26130258, 0.27577711]
PREPROCESSOR: dict[str, Any] = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": MEAN,
    "image_std": STD,
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2_5_VLProcessor",
}


def make_weights() -> dict[str, np.ndarray[Any, Any]]:
    """HF tensor names -> f32 arrays, a pure function of :data:`SEED`."""
    r, c, v = VlmRand(SEED), CONFIG, VISION
    w, norm = r.w, r.norm
    d, hd = c["hidden_size"], c["hidden_size"] // c["num_attention_heads"]
    out = decoder_weights(r, "model.", c, N_VOCAB, hd, qkv_bias=True)
    vd, vff, ps = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    out["visual.patch_embed.proj.weight"] = w(vd, 3, 2, ps, ps, s=0.05)
    for i in range(v["depth"]):
        p = f"visual.blocks.{i}."
        out[p + "norm1.weight"] = norm(vd)
        out[p + "norm2.weight"] = norm(vd)
        out[p + "attn.qkv.weight"] = w(3 * vd, vd, s=0.3)
        out[p + "attn.qkv.bias"] = w(3 * vd, s=0.1)
        out[p + "attn.proj.weight"] = w(vd, vd, s=0.2)
        out[p + "attn.proj.bias"] = w(vd, s=0.1)
        for proj, shape in (
            ("gate_proj", (vff, vd)),
            ("up_proj", (vff, vd)),
            ("down_proj", (vd, vff)),
        ):
            out[p + f"mlp.{proj}.weight"] = w(*shape, s=0.2)
            out[p + f"mlp.{proj}.bias"] = w(shape[0], s=0.1)
    m = 4 * vd
    out["visual.merger.ln_q.weight"] = norm(vd)
    out["visual.merger.mlp.0.weight"] = w(m, m, s=0.15)
    out["visual.merger.mlp.0.bias"] = w(m, s=0.1)
    out["visual.merger.mlp.2.weight"] = w(d, m, s=0.15)
    out["visual.merger.mlp.2.bias"] = w(d, s=0.1)
    return out


CHAT_TEMPLATE = (FIX / "qwen2_5_vl.jinja").read_text()


def tokenizer_files(dest: Path) -> None:
    """The families' tokenizer with Qwen2.5-VL's vision tokens and chat template."""
    tc = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "extra_special_tokens": {
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
        },
        "processor_class": "Qwen2_5_VLProcessor",
    }
    write_tokenizer(dest, list(SPECIAL), tc, indent=2)


def _vocab(w: gguf.GGUFWriter) -> None:
    control = add_gpt2_tokens(w, N_VOCAB, list(SPECIAL))
    w.add_eos_token_id(control["<|im_end|>"])
    w.add_pad_token_id(control["<|endoftext|>"])
    w.add_bos_token_id(control["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def write_text_gguf(weights: dict[str, np.ndarray[Any, Any]], path: Path) -> None:
    c = CONFIG
    with hf_gguf(path, "qwen2vl", "tiny-qwen25vl", c) as w:
        w.add_rope_dimension_sections([*SECTIONS, 0])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _vocab(w)
        nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2VL, c["num_hidden_layers"])
        for name, data in weights.items():
            if name.startswith("visual."):
                continue
            new = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
            assert new is not None, name
            w.add_tensor(new, np.ascontiguousarray(data, dtype=np.float32))


def write_mmproj(weights: dict[str, np.ndarray[Any, Any]], path: Path) -> None:
    """The vision tower + merger as ``convert_hf_to_gguf.py --mmproj`` writes them."""
    v = VISION
    with mmproj_file(
        path, gguf.VisionProjectorType.QWEN25VL, v, CONFIG["hidden_size"], MEAN, STD, 560
    ) as w:
        w.add_vision_use_silu(True)
        w.add_vision_n_wa_pattern(v["fullatt_block_indexes"][0] + 1)
        w.add_vision_attention_layernorm_eps(CONFIG["rms_norm_eps"])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, v["depth"])
        patch = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_ENC_EMBD_PATCH] + ".weight"
        for name, data in weights.items():
            if not name.startswith("visual."):
                continue
            if "patch_embed" in name:  # the 3-D kernel as two 2-D ones
                w.add_tensor(patch, np.ascontiguousarray(data[:, :, 0]))
                w.add_tensor(patch + ".1", np.ascontiguousarray(data[:, :, 1]))
                continue
            parts = [(name, data)]
            if ".qkv." in name:
                parts = [
                    (name.replace("qkv", x), p)
                    for x, p in zip("qkv", np.split(data, 3), strict=True)
                ]
            for hf, arr in parts:
                new = nmap.get_name(hf, try_suffixes=(".weight", ".bias"))
                assert new is not None, hf
                w.add_tensor(new, np.ascontiguousarray(arr, dtype=np.float32))


def write_hf(
    hf: Path,
    weights: dict[str, np.ndarray[Any, Any]],
    config: dict[str, Any],
    preprocessor: dict[str, Any],
) -> None:
    """An HF directory with Qwen2.5-VL's tokenizer and template (the Qwen VL generators')."""
    vision_support.write_hf(
        hf,
        weights,
        tokenizer=tokenizer_files,
        config=config,
        preprocessor=preprocessor,
        template=CHAT_TEMPLATE,
    )


def model_dir() -> Path:
    return assets_dir() / f"tiny-qwen25vl-v{VERSION}"


def ensure_model() -> tuple[Path, Path, Path]:
    """The HF directory, the model GGUF and the mmproj GGUF (created if missing)."""
    return ensure_vlm(
        model_dir(),
        "qwen25vl",
        make_weights,
        lambda hf, weights: write_hf(hf, weights, CONFIG, PREPROCESSOR),
        write_text_gguf,
        write_mmproj,
    )


if __name__ == "__main__":
    print(*ensure_model())
