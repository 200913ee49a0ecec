"""A tiny random LFM2-VL (``Lfm2VlForConditionalGeneration``), made with numpy only.

As ``tests/gen_qwen25vl.py``: the weights are a pure function of a seed, so the tests (no
torch) and ``scripts/make_tiny_lfm2vl.py`` (which loads the same HF directory into
transformers for the goldens and runs llama.cpp's converter on it) see identical numbers.
Written to the test-asset cache, never to the repository, as

* an HF directory shaped like the Hub's ``LiquidAI/LFM2-VL-450M`` (``text_config`` an
  LFM2 of ``tests/gen_lfm2.py``'s shape, ``model.language_model.*`` /
  ``model.vision_tower.*`` / ``model.multi_modal_projector.*`` weights), scaled down:
  vision a SigLIP2 NaFlex of 3 blocks of width 32, 2 heads, patch 16, 256 position
  embeddings (a 16 x 16 grid, resized to each image's), the projector's layer norm over
  the 2 x 2 pixel unshuffle (128) and its MLP 128 -> 96 -> 64; the processor the
  release's (64 .. 256 image tokens, 512-pixel tiles); the families' 384-token tokenizer
  with LFM2-VL's image tokens added (384..387, then the tiles' ``<|img_row_R_col_C|>``)
  and an LFM2-VL chat template;
* ``lfm2vl.gguf``: the text model as ``convert_hf_to_gguf.py`` writes ``lfm2``, and
* ``mmproj-lfm2vl.gguf``: the tower and projector as its ``--mmproj`` writes them
  (``lfm2``; the linear patch embedding as a (width, 3, 16, 16) kernel).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests import vision_support
from tests.assets import assets_dir
from tests.gen_lfm2 import CONFIG as LFM2
from tests.gen_lfm2 import FF, add_mixer
from tests.gen_tiny import Arrays, Rand, add_tensors, add_vocab, tokenizer_json
from tests.gguf_support import gguf_file
from tests.vision_support import ensure_vlm, mmproj_file

FIX = Path(__file__).parent / "fixtures"
VERSION = 1  # bump when the weights or the layout change
SEED = 20261251
TILE_LABELS = tuple(
    f"<|img_row_{r}_col_{c}|>" for r in range(1, 11) for c in range(1, 11) if r * c <= 10
)
SPECIALS = ("<|image_start|>", "<|image_end|>", "<image>", "<|img_thumbnail|>", *TILE_LABELS)
SPECIAL = {t: 384 + i for i, t in enumerate(SPECIALS)}
N_VOCAB = 384 + len(SPECIALS)
TEMPLATE = (FIX / "lfm2vl" / "lfm2_vl.jinja").read_text()
TEXT: dict[str, Any] = {**LFM2, "vocab_size": N_VOCAB, "max_position_embeddings": 2048}
VISION: dict[str, Any] = {
    "model_type": "siglip2_vision_model",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,  # >= 3: the converter maps linear_{bid} by block index
    "num_attention_heads": 2,
    "num_channels": 3,
    "num_patches": 256,
    "patch_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
    "attention_dropout": 0.0,
    "vision_use_head": False,
}
PROJ_HIDDEN = 96
CONFIG: dict[str, Any] = {
    "architectures": ["Lfm2VlForConditionalGeneration"],
    "model_type": "lfm2_vl",
    "downsample_factor": 2,
    "image_token_id": SPECIAL["<image>"],
    "projector_bias": True,
    "projector_hidden_act": "gelu",
    "projector_hidden_size": PROJ_HIDDEN,
    "projector_use_layernorm": True,
    "text_config": TEXT,
    "vision_config": VISION,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
MEAN = [0.5, 0.5, 0.5]
STD = [0.5, 0.5, 0.5]
PREPROCESSOR: dict[str, Any] = {
    "image_processor_type": "Lfm2VlImageProcessor",
    "processor_class": "Lfm2VlProcessor",
    "do_image_splitting": True,
    "downsample_factor": 2,
    "encoder_patch_size": 16,
    "max_image_tokens": 256,
    "min_image_tokens": 64,
    "max_num_patches": 1024,
    "max_pixels_tolerance": 2.0,
    "max_tiles": 10,
    "min_tiles": 2,
    "tile_size": 512,
    "use_thumbnail": True,
    "image_mean": MEAN,
    "image_std": STD,
    "resample": 2,
    "rescale_factor": 1 / 255,
}
TV = "model.vision_tower.vision_model."


def make_weights() -> Arrays:
    """HF tensor names -> f32 arrays, a pure function of :data:`SEED`."""
    r = Rand(SEED)
    d, v = TEXT["hidden_size"], N_VOCAB
    text: Arrays = {"model.embed_tokens.weight": r.w(v, d)}
    for i in range(TEXT["num_hidden_layers"]):
        p = f"model.layers.{i}."
        add_mixer(TEXT, r, i, text)
        text[p + "feed_forward.w1.weight"] = r.w(FF, d)
        text[p + "feed_forward.w3.weight"] = r.w(FF, d)
        text[p + "feed_forward.w2.weight"] = r.w(d, FF)
    # a large final gain: decisive logits, so greedy answers hold against llama.cpp
    text["model.embedding_norm.weight"] = r.norm(d) * np.float32(4.0)
    out = {k.replace("model.", "model.language_model.", 1): a for k, a in text.items()}
    rng = np.random.default_rng(SEED + 1)

    def w(*shape: int, s: float) -> np.ndarray[Any, Any]:
        return (s * rng.standard_normal(shape)).astype(np.float32)

    def ln(n: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        return (1 + 0.2 * rng.standard_normal(n)).astype(np.float32), w(n, s=0.1)

    vd, vff, ps = VISION["hidden_size"], VISION["intermediate_size"], VISION["patch_size"]
    out[TV + "embeddings.patch_embedding.weight"] = w(vd, 3 * ps * ps, s=0.05)
    out[TV + "embeddings.patch_embedding.bias"] = w(vd, s=0.1)
    out[TV + "embeddings.position_embedding.weight"] = w(VISION["num_patches"], vd, s=0.5)
    for i in range(VISION["num_hidden_layers"]):
        p = f"{TV}encoder.layers.{i}."
        for n in ("layer_norm1", "layer_norm2"):
            out[p + f"{n}.weight"], out[p + f"{n}.bias"] = ln(vd)
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out[p + f"self_attn.{n}.weight"] = w(vd, vd, s=0.3)
            out[p + f"self_attn.{n}.bias"] = w(vd, s=0.1)
        out[p + "mlp.fc1.weight"] = w(vff, vd, s=0.2)
        out[p + "mlp.fc1.bias"] = w(vff, s=0.1)
        out[p + "mlp.fc2.weight"] = w(vd, vff, s=0.2)
        out[p + "mlp.fc2.bias"] = w(vd, s=0.1)
    out[TV + "post_layernorm.weight"], out[TV + "post_layernorm.bias"] = ln(vd)
    m = 4 * vd  # the 2 x 2 pixel unshuffle
    pj = "model.multi_modal_projector."
    out[pj + "layer_norm.weight"], out[pj + "layer_norm.bias"] = ln(m)
    out[pj + "linear_1.weight"] = w(PROJ_HIDDEN, m, s=0.15)
    out[pj + "linear_1.bias"] = w(PROJ_HIDDEN, s=0.1)
    out[pj + "linear_2.weight"] = w(d, PROJ_HIDDEN, s=0.15)
    out[pj + "linear_2.bias"] = w(d, s=0.1)
    return out


def _layout(name: str, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return data.reshape(data.shape[0], -1) if name.endswith("conv.conv.weight") else data


def write_text_gguf(weights: Arrays, path: Path) -> None:
    """The text model as the converter's ``LFM2Model`` writes it (``tests/gen_lfm2.py``)."""
    cfg = TEXT
    kv_heads = [0 if t == "conv" else cfg["num_key_value_heads"] for t in cfg["layer_types"]]
    text = {
        k.replace("model.language_model.", "model.", 1): a
        for k, a in weights.items()
        if k.startswith("model.language_model.")
    }
    with gguf_file(path, "lfm2", atomic=True) as w:
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name("tiny-lfm2vl")
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(cfg["hidden_size"])
        w.add_feed_forward_length(FF)
        w.add_head_count(cfg["num_attention_heads"])
        w.add_head_count_kv(kv_heads)
        w.add_rope_freq_base(cfg["rope_theta"])
        w.add_layer_norm_rms_eps(cfg["norm_eps"])
        w.add_vocab_size(N_VOCAB)
        w.add_shortconv_l_cache(cfg["conv_L_cache"])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        add_vocab(w, N_VOCAB, TEMPLATE, specials=SPECIALS)
        add_tensors(w, gguf.MODEL_ARCH.LFM2, cfg, text, _layout)


def write_mmproj(weights: Arrays, path: Path) -> None:
    """The vision tower + projector as ``convert_hf_to_gguf.py --mmproj`` writes them."""
    v = VISION
    size = 256  # the converter's stand-in image size (NaFlex has none)
    with mmproj_file(
        path, gguf.VisionProjectorType.LFM2, v, TEXT["hidden_size"], MEAN, STD, size
    ) as w:
        w.add_vision_attention_layernorm_eps(v["layer_norm_eps"])
        w.add_vision_projector_scale_factor(CONFIG["downsample_factor"])
        w.add_vision_use_gelu(True)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, v["num_hidden_layers"])
        fixed = {"multi_modal_projector.linear_1": "mm.1", "multi_modal_projector.linear_2": "mm.2"}
        for name, data in weights.items():
            if name.startswith("model.language_model."):
                continue
            hf = name.replace("model.", "", 1)
            base, _, suffix = hf.rpartition(".")
            new = (
                f"{fixed[base]}.{suffix}"
                if base in fixed
                else nmap.get_name(hf, (".weight", ".bias"))
            )
            assert new is not None, name
            if name.endswith("patch_embedding.weight"):  # (width, 16*16*3) -> (width, 3, 16, 16)
                data = data.reshape(data.shape[0], 16, 16, 3).transpose(0, 3, 1, 2)
            w.add_tensor(new, np.ascontiguousarray(data, dtype=np.float32))


def tokenizer_files(dest: Path) -> None:
    """The families' tokenizer with LFM2-VL's image tokens and chat template."""
    (dest / "tokenizer.json").write_text(json.dumps(tokenizer_json(SPECIALS), ensure_ascii=False))
    tc = json.loads((FIX / "families" / "tokenizer_config.json").read_text())
    tc |= {
        "chat_template": TEMPLATE,
        "image_token": "<image>",
        "image_start_token": "<|image_start|>",
        "image_end_token": "<|image_end|>",
        "image_thumbnail_token": "<|img_thumbnail|>",
        "processor_class": "Lfm2VlProcessor",
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(tc, indent=1) + "\n")


def model_dir() -> Path:
    return assets_dir() / f"tiny-lfm2vl-v{VERSION}"


def write_hf(hf: Path, weights: dict[str, np.ndarray[Any, Any]]) -> None:
    vision_support.write_hf(
        hf,
        weights,
        tokenizer=tokenizer_files,
        config=CONFIG,
        preprocessor=PREPROCESSOR,
        template=TEMPLATE,
    )


def ensure_model() -> tuple[Path, Path, Path]:
    """The HF directory, the model GGUF and the mmproj GGUF (created if missing)."""
    return ensure_vlm(model_dir(), "lfm2vl", make_weights, write_hf, write_text_gguf, write_mmproj)


if __name__ == "__main__":
    print(*ensure_model())
