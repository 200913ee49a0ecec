"""A tiny randomly initialised SmolVLM (Idefics3), made with numpy only.

As ``tests/gen_qwen25vl.py``: the weights are a pure function of a seed, so the tests (no
torch) and ``scripts/make_tiny_smolvlm.py`` (which loads the same HF directory into
transformers for the goldens and runs llama.cpp's converter on it) see identical numbers.
Written to the test-asset cache, never to the repository, as

* an HF directory shaped like the Hub's ``HuggingFaceTB/SmolVLM-256M-Instruct``
  (``SmolVLMForConditionalGeneration``; ``model.text_model.*``, ``model.vision_model.*``,
  ``model.connector.*``, ``lm_head``), scaled down: text a llama of 2 layers of width 64
  (4 query heads on 2 KV heads), vision a SigLIP of 2 layers of width 32 over 32 x 32
  tiles in 4 x 4 patches, the pixel shuffle by 2 into 16 embeddings a tile; images
  resized to a longest side of 64 (two tiles), so an image is at most 2 x 2 tiles and the
  global image: 80 image tokens; the families' 384-token tokenizer with ``\\n\\n`` (384,
  and its merge) and SmolVLM's image tokens added (385..), and the release's template;
* ``smolvlm.gguf``: the text model as ``convert_hf_to_gguf.py`` writes ``llama`` (Q/K
  rows permuted to interleaved pairs), and
* ``mmproj-smolvlm.gguf``: the tower and connector as its ``--mmproj`` writes them
  (``idefics3``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests import vision_support
from tests.assets import assets_dir
from tests.gen_families import _permute
from tests.gen_tiny import add_gpt2_vocab, added_token
from tests.gguf_support import hf_gguf
from tests.vision_support import VlmRand, decoder_weights, ensure_vlm, mmproj_file

FAM = Path(__file__).parent / "fixtures" / "families"
FIX = Path(__file__).parent / "fixtures" / "smolvlm"
VERSION = 2  # bump when the weights or the layout change
SEED = 20261207
NEWLINES = ("\u010a\u010a", 384)  # "\n\n": llama.cpp's mtmd looks it up as one token
SPECIAL = {
    "<fake_token_around_image>": 385,
    "<image>": 386,
    "<global-img>": 387,
    "<end_of_utterance>": 388,
    "<row_1_col_1>": 389,
    "<row_1_col_2>": 390,
    "<row_2_col_1>": 391,
    "<row_2_col_2>": 392,
}
N_VOCAB = 393
TEXT: dict[str, Any] = {
    "architectures": ["VLlama3ForCausalLM"],
    "model_type": "llama",
    "vocab_size": N_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": SPECIAL["<end_of_utterance>"],
    "pad_token_id": 0,
}
VISION: dict[str, Any] = {
    "model_type": "smolvlm_vision",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_channels": 3,
    "image_size": 32,
    "patch_size": 4,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
SCALE = 2
CONFIG: dict[str, Any] = {
    "architectures": ["SmolVLMForConditionalGeneration"],
    "model_type": "smolvlm",
    "image_token_id": SPECIAL["<image>"],
    "scale_factor": SCALE,
    "text_config": TEXT,
    "vision_config": VISION,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}
MEAN = STD = [0.5, 0.5, 0.5]
LONGEST = 64  # the preprocessor's longest side: two tiles
TOKENS_PER_TILE = (VISION["image_size"] // VISION["patch_size"] // SCALE) ** 2
PREPROCESSOR: dict[str, Any] = {
    "image_processor_type": "SmolVLMImageProcessor",
    "processor_class": "SmolVLMProcessor",
    "do_convert_rgb": True,
    "do_image_splitting": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": MEAN,
    "image_std": STD,
    "max_image_size": {"longest_edge": VISION["image_size"]},
    "resample": 1,  # PIL Lanczos
    "rescale_factor": 1 / 255,
    "size": {"longest_edge": LONGEST},
}
CHAT_TEMPLATE = (FIX / "smolvlm.jinja").read_text()


def make_weights() -> dict[str, np.ndarray[Any, Any]]:
    """HF tensor names -> f32 arrays, a pure function of :data:`SEED`."""
    r, t, v = VlmRand(SEED), TEXT, VISION
    w, norm = r.w, r.norm
    d = t["hidden_size"]
    out = decoder_weights(r, "model.text_model.", t, N_VOCAB, t["head_dim"])
    out["lm_head.weight"] = w(N_VOCAB, d, s=0.5)
    vd, vff, ps = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    side = v["image_size"] // ps
    p = "model.vision_model."
    out[p + "embeddings.patch_embedding.weight"] = w(vd, 3, ps, ps, s=0.1)
    out[p + "embeddings.patch_embedding.bias"] = w(vd, s=0.1)
    out[p + "embeddings.position_embedding.weight"] = w(side * side, vd, s=0.3)
    for i in range(v["num_hidden_layers"]):
        b = f"{p}encoder.layers.{i}."
        for n in ("layer_norm1", "layer_norm2"):
            out[b + f"{n}.weight"] = norm(vd)
            out[b + f"{n}.bias"] = w(vd, s=0.1)
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out[b + f"self_attn.{n}.weight"] = w(vd, vd, s=0.3)
            out[b + f"self_attn.{n}.bias"] = w(vd, s=0.1)
        out[b + "mlp.fc1.weight"] = w(vff, vd, s=0.2)
        out[b + "mlp.fc1.bias"] = w(vff, s=0.1)
        out[b + "mlp.fc2.weight"] = w(vd, vff, s=0.2)
        out[b + "mlp.fc2.bias"] = w(vd, s=0.1)
    out[p + "post_layernorm.weight"] = norm(vd)
    out[p + "post_layernorm.bias"] = w(vd, s=0.1)
    out["model.connector.modality_projection.proj.weight"] = w(d, vd * SCALE * SCALE, s=0.15)
    return out


def tokenizer_json() -> dict[str, Any]:
    """The families' tokenizer with ``\\n\\n`` and SmolVLM's image tokens."""
    tj = json.loads((FAM / "tokenizer.json").read_text())
    tj["model"]["vocab"][NEWLINES[0]] = NEWLINES[1]
    tj["model"]["merges"].append(["\u010a", "\u010a"])
    tj["added_tokens"] += [added_token(text, i) for text, i in SPECIAL.items()]
    return tj


def tokenizer_files(dest: Path) -> None:
    (dest / "tokenizer.json").write_text(json.dumps(tokenizer_json(), ensure_ascii=False))
    tc = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<end_of_utterance>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
        "extra_special_tokens": {
            "fake_image_token": "<fake_token_around_image>",
            "image_token": "<image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
        "processor_class": "SmolVLMProcessor",
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))


def _vocab(w: gguf.GGUFWriter) -> None:
    control = add_gpt2_vocab(w, tokenizer_json(), N_VOCAB)
    w.add_bos_token_id(control["<|im_start|>"])
    w.add_eos_token_id(control["<end_of_utterance>"])
    w.add_pad_token_id(control["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def write_text_gguf(weights: dict[str, np.ndarray[Any, Any]], path: Path) -> None:
    t = TEXT
    with hf_gguf(path, "llama", "tiny-smolvlm", t) as w:
        w.add_vocab_size(N_VOCAB)
        w.add_rope_dimension_count(t["head_dim"])
        w.add_key_length(t["head_dim"])
        w.add_value_length(t["head_dim"])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _vocab(w)
        nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, t["num_hidden_layers"])
        for name, data in weights.items():
            if not name.startswith(("model.text_model.", "lm_head.")):
                continue
            hf = name.replace("text_model.", "")
            new = nmap.get_name(hf, try_suffixes=(".weight", ".bias"))
            assert new is not None, name
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                heads = t["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
                data = _permute(data, heads)
            w.add_tensor(new, np.ascontiguousarray(data, dtype=np.float32))


def write_mmproj(weights: dict[str, np.ndarray[Any, Any]], path: Path) -> None:
    """The vision tower + connector as ``convert_hf_to_gguf.py --mmproj`` writes them."""
    v = VISION
    with mmproj_file(
        path, gguf.VisionProjectorType.IDEFICS3, v, TEXT["hidden_size"], MEAN, STD
    ) as w:
        w.add_vision_attention_layernorm_eps(v["layer_norm_eps"])
        w.add_vision_projector_scale_factor(SCALE)
        w.add_vision_use_gelu(True)
        w.add_vision_preproc_image_size(LONGEST)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, v["num_hidden_layers"])
        for name, data in weights.items():
            if not name.startswith(("model.vision_model.", "model.connector.")):
                continue
            new = nmap.get_name(name, try_suffixes=(".weight", ".bias"))
            assert new is not None, name
            w.add_tensor(new, np.ascontiguousarray(data, dtype=np.float32))


def model_dir() -> Path:
    return assets_dir() / f"tiny-smolvlm-v{VERSION}"


def write_hf(hf: Path, weights: dict[str, np.ndarray[Any, Any]]) -> None:
    vision_support.write_hf(
        hf,
        weights,
        tokenizer=tokenizer_files,
        config=CONFIG,
        preprocessor=PREPROCESSOR,
        processor={"image_seq_len": TOKENS_PER_TILE, "processor_class": "SmolVLMProcessor"},
        template=CHAT_TEMPLATE,
    )


def ensure_model() -> tuple[Path, Path, Path]:
    """The HF directory, the model GGUF and the mmproj GGUF (created if missing)."""
    return ensure_vlm(model_dir(), "smolvlm", make_weights, write_hf, write_text_gguf, write_mmproj)


if __name__ == "__main__":
    print(*ensure_model())
