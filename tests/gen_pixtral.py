"""A tiny randomly initialised Mistral 3 (Pixtral vision), made with numpy only.

As ``tests/gen_qwen25vl.py``: the weights are a pure function of a seed, so the tests (no
torch) and ``scripts/make_tiny_pixtral.py`` (transformers, llama.cpp's converter) see
identical numbers.  Written to the test-asset cache, never to the repository, as

* an HF directory shaped like the Hub's ``mistralai/Mistral-Small-3.1-24B-Instruct-2503``
  (``Mistral3ForConditionalGeneration``: ``text_config`` / ``vision_config``,
  ``language_model.*`` / ``vision_tower.*`` / ``multi_modal_projector.*`` weights), scaled
  down: text 3 layers of width 64, 4 query heads on 2 KV heads of 16; vision 3 blocks of
  width 32, 2 heads of 16, patch 14, the 2x2 patch merger, a bias-free GELU projector;
  the families' 384-token tokenizer with ``[INST]``, ``[/INST]``, ``[IMG]``,
  ``[IMG_BREAK]`` and ``[IMG_END]`` added (384..388) and a short chat template in the
  release's ``[INST]`` / ``[IMG]`` form;
* ``pixtral.gguf``: the text model as ``convert_hf_to_gguf.py`` writes ``mistral3``, and
* ``mmproj-pixtral.gguf``: the tower and projector as its ``--mmproj`` writes them
  (``pixtral``; Q/K rows permuted to interleaved pairs), with ``v.token_embd.img_break``
  (the text model's ``[IMG_BREAK]`` embedding), which llama.cpp's ``clip.cpp`` requires
  and older converters wrote, but llama-cpp-python 0.3.36's converter drops for an HF
  directory (``MmprojModel.filter_tensors`` skips ``language_model.*`` before
  ``LlavaVisionModel`` can take the row).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests import vision_support
from tests.assets import assets_dir
from tests.gen_tiny import add_vocab, permute, tokenizer_json
from tests.gguf_support import hf_gguf
from tests.vision_support import VlmRand, decoder_weights, ensure_vlm, mmproj_file

FIX = Path(__file__).parent / "fixtures" / "pixtral"
VERSION = 2  # bump when the weights or the layout change
SEED = 20261205
SPECIALS = ("[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]")
IMG, IMG_BREAK, IMG_END = 386, 387, 388
N_VOCAB = 389
TEMPLATE = (FIX / "mistral3.jinja").read_text()
TEXT: dict[str, Any] = {
    "model_type": "mistral",
    "vocab_size": N_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000000.0,
    "hidden_act": "silu",
    "sliding_window": None,
    "tie_word_embeddings": False,
    "attention_dropout": 0.0,
}
VISION: dict[str, Any] = {
    "model_type": "pixtral",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "head_dim": 16,
    "num_channels": 3,
    "patch_size": 14,
    "image_size": 1540,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "attention_dropout": 0.0,
}
CONFIG: dict[str, Any] = {
    "architectures": ["Mistral3ForConditionalGeneration"],
    "model_type": "mistral3",
    "image_token_index": IMG,
    "multimodal_projector_bias": False,
    "projector_hidden_act": "gelu",
    "spatial_merge_size": 2,
    "vision_feature_layer": -1,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "text_config": TEXT,
    "vision_config": VISION,
}
MEAN = [0.48145466, 0.4578275, 0.40821073]  # as the release's
STD = [0.26862954, 0.26130258, 0.27577711]
PREPROCESSOR: dict[str, Any] = {
    "image_processor_type": "PixtralImageProcessor",
    "processor_class": "PixtralProcessor",
    "do_resize": True,
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
    "resample": 3,
    "rescale_factor": 1 / 255,
    "size": {"longest_edge": VISION["image_size"]},
    "patch_size": {"height": 14, "width": 14},
    "image_mean": MEAN,
    "image_std": STD,
}


def make_weights() -> dict[str, np.ndarray[Any, Any]]:
    """HF tensor names (the release's) -> f32 arrays, a pure function of :data:`SEED`."""
    r, t, v = VlmRand(SEED), TEXT, VISION
    w, norm = r.w, r.norm
    d = t["hidden_size"]
    out = decoder_weights(r, "language_model.model.", t, N_VOCAB, t["head_dim"])
    out["language_model.lm_head.weight"] = w(N_VOCAB, d, s=0.5)
    vd, vff, ps = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    out["vision_tower.patch_conv.weight"] = w(vd, 3, ps, ps, s=0.05)
    out["vision_tower.ln_pre.weight"] = norm(vd)
    for i in range(v["num_hidden_layers"]):
        p = f"vision_tower.transformer.layers.{i}."
        out[p + "attention_norm.weight"] = norm(vd)
        for x in "qkvo":
            out[p + f"attention.{x}_proj.weight"] = w(vd, vd, s=0.3)
        out[p + "ffn_norm.weight"] = norm(vd)
        out[p + "feed_forward.gate_proj.weight"] = w(vff, vd, s=0.2)
        out[p + "feed_forward.up_proj.weight"] = w(vff, vd, s=0.2)
        out[p + "feed_forward.down_proj.weight"] = w(vd, vff, s=0.2)
    out["multi_modal_projector.norm.weight"] = norm(vd)
    out["multi_modal_projector.patch_merger.merging_layer.weight"] = w(vd, 4 * vd, s=0.15)
    out["multi_modal_projector.linear_1.weight"] = w(d, vd, s=0.3)
    out["multi_modal_projector.linear_2.weight"] = w(d, d, s=0.3)
    return out


def write_text_gguf(weights: dict[str, np.ndarray[Any, Any]], path: Path) -> None:
    t = TEXT
    with hf_gguf(path, "mistral3", "tiny-pixtral", t) as w:
        w.add_vocab_size(N_VOCAB)
        w.add_key_length(t["head_dim"])
        w.add_value_length(t["head_dim"])
        w.add_rope_dimension_count(t["head_dim"])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        add_vocab(w, N_VOCAB, TEMPLATE, SPECIALS)
        nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MISTRAL3, t["num_hidden_layers"])
        for name, data in weights.items():
            if not name.startswith("language_model."):
                continue
            hf = name.removeprefix("language_model.")
            if hf.endswith("q_proj.weight"):
                data = permute(data, t["num_attention_heads"])
            elif hf.endswith("k_proj.weight"):
                data = permute(data, t["num_key_value_heads"])
            new = nmap.get_name(hf, try_suffixes=(".weight", ".bias"))
            assert new is not None, name
            w.add_tensor(new, np.ascontiguousarray(data, dtype=np.float32))


def write_mmproj(weights: dict[str, np.ndarray[Any, Any]], path: Path) -> None:
    """The vision tower + projector as ``convert_hf_to_gguf.py --mmproj`` writes them."""
    v = VISION
    with mmproj_file(
        path, gguf.VisionProjectorType.PIXTRAL, v, TEXT["hidden_size"], MEAN, STD
    ) as w:
        w.add_vision_attention_layernorm_eps(1e-5)
        w.add_vision_use_silu(True)
        w.add_vision_spatial_merge_size(CONFIG["spatial_merge_size"])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, v["num_hidden_layers"])
        n_head = v["num_attention_heads"]
        for name, data in weights.items():
            if name == "language_model.model.embed_tokens.weight":
                brk = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_TOK_EMBD_IMG_BREAK]
                w.add_tensor(brk, np.ascontiguousarray(data[IMG_BREAK]))
                continue
            if name.startswith("language_model."):
                continue
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                data = permute(data, n_head)
            new = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
            assert new is not None, name
            w.add_tensor(new, np.ascontiguousarray(data, dtype=np.float32))


def model_dir() -> Path:
    return assets_dir() / f"tiny-pixtral-v{VERSION}"


def tokenizer_files(dest: Path) -> None:
    """The families' tokenizer with the Mistral 3 specials and template."""
    tj = tokenizer_json(SPECIALS)
    (dest / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    tc = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "chat_template": TEMPLATE,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(tc, indent=1) + "\n")


def write_hf(hf: Path, weights: dict[str, np.ndarray[Any, Any]]) -> None:
    vision_support.write_hf(
        hf, weights, tokenizer=tokenizer_files, config=CONFIG, preprocessor=PREPROCESSOR
    )


def ensure_model() -> tuple[Path, Path, Path]:
    """The HF directory, the model GGUF and the mmproj GGUF (created if missing)."""
    return ensure_vlm(model_dir(), "pixtral", make_weights, write_hf, write_text_gguf, write_mmproj)


if __name__ == "__main__":
    print(*ensure_model())
