"""A tiny randomly initialised Gemma 3 vision-language model, made with numpy only.

As ``tests/gen_families.py``: the weights are a pure function of a seed, so the tests (no
torch) and ``scripts/make_tiny_gemma3vl.py`` (which loads the very same HF directory into
transformers for the goldens and runs llama.cpp's converter on it) see identical numbers.
Written to the test-asset cache, never to the repository, as

* an HF directory: ``config.json`` of a ``Gemma3ForConditionalGeneration`` scaled down
  (text: 2 layers of width 64; vision: a SigLIP of 2 layers of width 32 over 32x32
  images in 4x4 patches, pooled 4x4 into 4 soft tokens), ``model.safetensors`` with the
  names ``save_pretrained`` writes, ``preprocessor_config.json`` /
  ``processor_config.json`` (images resized to 32x32), and the families' 384-token
  byte-level BPE with Gemma 3's special tokens added (384..391) and Gemma 3's chat
  template;
* ``gemma3vl.gguf``: the text model as ``convert_hf_to_gguf.py`` writes it (norms as
  ``1 + w``), and
* ``mmproj-gemma3vl.gguf``: the vision tower and projector as the converter's
  ``--mmproj`` writes them (``clip.*`` keys, ``v.*`` / ``mm.*`` tensors, the patch
  embedding kept 4-D and f32, the input projection f16, ``mm.soft_emb_norm`` as ``1 + w``).

``scripts/make_tiny_gemma3vl.py`` records the converter's own output for these files in
``tests/golden/gemma3vl_converter.json``; the tests hold the numpy writers to it.
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
from tests.vision_support import ensure_vlm, mmproj_file

FIX = Path(__file__).parent / "fixtures" / "vision"
VERSION = 3  # bump when the weights or the layout change
SEED = 20261205
# Gemma 3's special tokens after the families' 384 (their ids in the tiny vocabulary)
SPECIAL = {
    "<bos>": 384,
    "<start_of_turn>": 385,
    "<end_of_turn>": 386,
    "<start_of_image>": 387,
    "<end_of_image>": 388,
    "<image_soft_token>": 389,
    "<eos>": 390,
    "<pad>": 391,
}
N_VOCAB = 392
TEXT: dict[str, Any] = {
    "model_type": "gemma3_text",
    "vocab_size": N_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "query_pre_attn_scalar": 16,
    "sliding_window": 512,  # every layer windowed (llama.cpp: 5 of 6), none reached
    "layer_types": ["sliding_attention", "sliding_attention"],
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh",
    "rope_parameters": {
        "full_attention": {"rope_theta": 1_000_000.0, "rope_type": "default"},
        "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"},
    },
    "bos_token_id": SPECIAL["<bos>"],
    "eos_token_id": [SPECIAL["<eos>"], SPECIAL["<end_of_turn>"]],
    "pad_token_id": 0,
    "tie_word_embeddings": True,
}
VISION: dict[str, Any] = {
    "model_type": "siglip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 32,
    "patch_size": 4,
    "num_channels": 3,
    "layer_norm_eps": 1e-6,
    "hidden_act": "gelu_pytorch_tanh",
    "vision_use_head": False,
}
CONFIG: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "mm_tokens_per_image": 4,
    "boi_token_index": SPECIAL["<start_of_image>"],
    "eoi_token_index": SPECIAL["<end_of_image>"],
    "image_token_index": SPECIAL["<image_soft_token>"],
    "text_config": TEXT,
    "vision_config": VISION,
    "tie_word_embeddings": True,
    "bos_token_id": SPECIAL["<bos>"],
    "eos_token_id": [SPECIAL["<eos>"], SPECIAL["<end_of_turn>"]],
    "pad_token_id": 0,
}
MEAN = STD = [0.5, 0.5, 0.5]
PREPROCESSOR: dict[str, Any] = {
    "image_processor_type": "Gemma3ImageProcessor",
    "processor_class": "Gemma3Processor",
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_pan_and_scan": False,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": MEAN,
    "image_std": STD,
    "image_seq_length": CONFIG["mm_tokens_per_image"],
    "resample": 2,  # PIL bilinear
    "rescale_factor": 1 / 255,
    "size": {"height": VISION["image_size"], "width": VISION["image_size"]},
}


def make_weights() -> dict[str, np.ndarray[Any, Any]]:
    """HF tensor names -> f32 arrays, a pure function of :data:`SEED`."""
    rng = np.random.default_rng(SEED)
    t, v = TEXT, VISION

    def w(*shape: int, s: float = 0.25) -> np.ndarray[Any, Any]:
        return (s * rng.standard_normal(shape)).astype(np.float32)

    def gnorm(n: int) -> np.ndarray[Any, Any]:  # Gemma's RMSNorm multiplies by 1 + w
        return (0.5 + 0.3 * rng.standard_normal(n)).astype(np.float32)

    def ln(n: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        return (1 + 0.2 * rng.standard_normal(n)).astype(np.float32), w(n, s=0.1)

    d, ff, hd = t["hidden_size"], t["intermediate_size"], t["head_dim"]
    nq, nkv = t["num_attention_heads"] * hd, t["num_key_value_heads"] * hd
    out = {"language_model.model.embed_tokens.weight": w(N_VOCAB, d, s=0.05)}
    for i in range(t["num_hidden_layers"]):
        p = f"language_model.model.layers.{i}."
        out[p + "input_layernorm.weight"] = gnorm(d)
        out[p + "self_attn.q_proj.weight"] = w(nq, d)
        out[p + "self_attn.k_proj.weight"] = w(nkv, d)
        out[p + "self_attn.v_proj.weight"] = w(nkv, d)
        out[p + "self_attn.q_norm.weight"] = gnorm(hd)
        out[p + "self_attn.k_norm.weight"] = gnorm(hd)
        out[p + "self_attn.o_proj.weight"] = w(d, nq)
        out[p + "post_attention_layernorm.weight"] = gnorm(d)
        out[p + "pre_feedforward_layernorm.weight"] = gnorm(d)
        out[p + "post_feedforward_layernorm.weight"] = gnorm(d)
        out[p + "mlp.gate_proj.weight"] = w(ff, d)
        out[p + "mlp.up_proj.weight"] = w(ff, d)
        out[p + "mlp.down_proj.weight"] = w(d, ff)
    # a large final gain: decisive logits, so greedy answers hold against llama.cpp's f16
    out["language_model.model.norm.weight"] = gnorm(d) + np.float32(4.0)
    vd, vff, ps = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    n_patch = (v["image_size"] // ps) ** 2
    e = "vision_tower.vision_model.embeddings."
    out[e + "patch_embedding.weight"] = w(vd, v["num_channels"], ps, ps, s=0.3)
    out[e + "patch_embedding.bias"] = w(vd, s=0.1)
    out[e + "position_embedding.weight"] = w(n_patch, vd, s=0.3)
    for i in range(v["num_hidden_layers"]):
        p = f"vision_tower.vision_model.encoder.layers.{i}."
        out[p + "layer_norm1.weight"], out[p + "layer_norm1.bias"] = ln(vd)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out[p + f"self_attn.{proj}.weight"] = w(vd, vd, s=0.2)
            out[p + f"self_attn.{proj}.bias"] = w(vd, s=0.1)
        out[p + "layer_norm2.weight"], out[p + "layer_norm2.bias"] = ln(vd)
        out[p + "mlp.fc1.weight"], out[p + "mlp.fc1.bias"] = w(vff, vd, s=0.2), w(vff, s=0.1)
        out[p + "mlp.fc2.weight"], out[p + "mlp.fc2.bias"] = w(vd, vff, s=0.2), w(vd, s=0.1)
    pl = "vision_tower.vision_model.post_layernorm."
    out[pl + "weight"], out[pl + "bias"] = ln(vd)
    # f16 values: the converter stores this one in f16, so both sides hold the same numbers
    proj = w(vd, d, s=1.0).astype(np.float16).astype(np.float32)
    out["multi_modal_projector.mm_input_projection_weight"] = proj
    out["multi_modal_projector.mm_soft_emb_norm.weight"] = gnorm(vd)
    return out


CHAT_TEMPLATE = (FIX / "gemma3.jinja").read_text() if (FIX / "gemma3.jinja").exists() else ""


def tokenizer_files(dest: Path) -> None:
    """The families' tokenizer with Gemma 3's special tokens and chat template."""
    tc = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "extra_special_tokens": {
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
        "processor_class": "Gemma3Processor",
    }
    write_tokenizer(dest, list(SPECIAL), tc, indent=2)


def _vocab(w: gguf.GGUFWriter) -> None:
    add_gpt2_tokens(w, N_VOCAB, list(SPECIAL))
    w.add_bos_token_id(SPECIAL["<bos>"])
    w.add_eos_token_id(SPECIAL["<eos>"])
    w.add_pad_token_id(SPECIAL["<pad>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def write_text_gguf(weights: dict[str, np.ndarray[Any, Any]], path: Path) -> None:
    t = TEXT
    with hf_gguf(
        path,
        "gemma3",
        "tiny-gemma3vl",
        t,
        rope_base=t["rope_parameters"]["full_attention"]["rope_theta"],
    ) as w:
        w.add_key_length(t["head_dim"])
        w.add_value_length(t["head_dim"])
        w.add_sliding_window(t["sliding_window"])
        _vocab(w)
        nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, t["num_hidden_layers"])
        for name, data in weights.items():
            if not name.startswith("language_model."):
                continue
            hf = name.replace("language_model.model.", "model.")
            new = nmap.get_name(hf, try_suffixes=(".weight", ".bias"))
            assert new is not None, name
            if name.endswith("norm.weight"):
                data = data + np.float32(1.0)
            w.add_tensor(new, np.ascontiguousarray(data, dtype=np.float32))


def write_mmproj(weights: dict[str, np.ndarray[Any, Any]], path: Path) -> None:
    """The vision tower + projector as ``convert_hf_to_gguf.py --mmproj`` writes them."""
    v = VISION
    with mmproj_file(path, gguf.VisionProjectorType.GEMMA3, v, TEXT["hidden_size"], MEAN, STD) as w:
        w.add_vision_attention_layernorm_eps(v["layer_norm_eps"])
        w.add_vision_use_gelu(True)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, v["num_hidden_layers"])
        for name, data in weights.items():
            if name.startswith("language_model."):
                continue
            hf = name.replace("_weight", ".weight")
            new = nmap.get_name(hf, try_suffixes=(".weight", ".bias"))
            assert new is not None, name
            if "soft_emb_norm" in name:
                data = data + np.float32(1.0)
            if "input_projection" in name:  # the converter forces f16 (llama.cpp #13025)
                w.add_tensor(new, np.ascontiguousarray(data, dtype=np.float16))
                continue
            w.add_tensor(new, np.ascontiguousarray(data, dtype=np.float32))


def model_dir() -> Path:
    return assets_dir() / f"tiny-gemma3vl-v{VERSION}"


def write_hf(hf: Path, weights: dict[str, np.ndarray[Any, Any]]) -> None:
    vision_support.write_hf(
        hf,
        weights,
        tokenizer=tokenizer_files,
        config=CONFIG,
        preprocessor=PREPROCESSOR,
        processor={"processor_class": "Gemma3Processor", "image_seq_length": 4},
        template=(FIX / "gemma3.jinja").read_text(),
    )


def ensure_model() -> tuple[Path, Path, Path]:
    """The HF directory, the model GGUF and the mmproj GGUF (created if missing)."""
    return ensure_vlm(
        model_dir(), "gemma3vl", make_weights, write_hf, write_text_gguf, write_mmproj
    )


if __name__ == "__main__":
    print(*ensure_model())
