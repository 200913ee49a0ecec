"""A tiny randomly initialised Qwen3-VL, made with numpy only.

As ``tests/gen_qwen25vl.py``: the weights are a pure function of a seed, so the tests (no
torch) and ``scripts/make_tiny_qwen3vl.py`` (which loads the same HF directory into
transformers for the goldens and runs llama.cpp's converter on it) see identical numbers.
Written to the test-asset cache, never to the repository, as

* an HF directory shaped like the Hub's ``Qwen/Qwen3-VL-2B-Instruct`` (``text_config`` and
  ``vision_config``, ``model.language_model.*`` / ``model.visual.*`` weights), scaled down:
  text 3 layers of width 64, 4 query heads on 2 KV heads of 32 (Qwen3's Q/K norms),
  interleaved M-RoPE sections 6/5/5 of its 16 pairs (the release's 24/20/20 of 64); vision
  4 blocks of width 32, 2 heads, patch 16, temporal patch 2, a 6 x 6 table of learned
  position embeddings (the release's 48 x 48), DeepStack mergers after blocks 0 and 2 (the
  release's 5, 11, 17 of 24) and the 2x2 merger into the text width; the families'
  384-token tokenizer with the Qwen VL vision tokens (384..388) and Qwen2.5-VL's chat
  template (its image part is Qwen3-VL's);
* ``qwen3vl.gguf``: the text model as ``convert_hf_to_gguf.py`` writes ``qwen3vl``, and
* ``mmproj-qwen3vl.gguf``: the tower and mergers as its ``--mmproj`` writes them
  (``qwen3vl_merger``; the 3-D patch kernel as two 2-D ones, the DeepStack mergers as
  ``v.deepstack.{block}.*``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.assets import assets_dir
from tests.gen_qwen25vl import N_VOCAB, SPECIAL, _vocab, write_hf
from tests.gguf_support import hf_gguf
from tests.vision_support import VlmRand, decoder_weights, ensure_vlm, mmproj_file

VERSION = 1  # bump when the weights or the layout change
SEED = 20261207
SECTIONS = [6, 5, 5]
DEEPSTACK = [0, 2]
VISION: dict[str, Any] = {
    "model_type": "qwen3_vl",
    "depth": 4,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_heads": 2,
    "in_channels": 3,
    "out_hidden_size": 64,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 36,
    "deepstack_visual_indexes": DEEPSTACK,
    "initializer_range": 0.02,
}
TEXT: dict[str, Any] = {
    "model_type": "qwen3_vl_text",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 2048,
    "num_attention_heads": 4,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 5000000.0,
        "mrope_section": SECTIONS,
        "mrope_interleaved": True,
    },
    "tie_word_embeddings": True,
    "dtype": "float32",
    "use_cache": True,
    "vocab_size": N_VOCAB,
}
CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    "image_token_id": SPECIAL["<|image_pad|>"],
    "video_token_id": SPECIAL["<|video_pad|>"],
    "vision_start_token_id": SPECIAL["<|vision_start|>"],
    "vision_end_token_id": SPECIAL["<|vision_end|>"],
    "tie_word_embeddings": True,
    "text_config": TEXT,
    "vision_config": VISION,
    "dtype": "float32",
}
MEAN = [0.5, 0.5, 0.5]  # the release's
STD = [0.5, 0.5, 0.5]
PREPROCESSOR: dict[str, Any] = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": MEAN,
    "image_std": STD,
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "processor_class": "Qwen3VLProcessor",
}


def make_weights() -> dict[str, np.ndarray[Any, Any]]:
    """HF tensor names -> f32 arrays, a pure function of :data:`SEED`."""
    r, c, v = VlmRand(SEED), TEXT, VISION
    w, norm = r.w, r.norm
    d = c["hidden_size"]
    out = decoder_weights(r, "model.language_model.", c, N_VOCAB, c["head_dim"], qk_norm=True)
    vd, vff, ps = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    vis = "model.visual."
    out[vis + "patch_embed.proj.weight"] = w(vd, 3, 2, ps, ps, s=0.05)
    out[vis + "patch_embed.proj.bias"] = w(vd, s=0.1)
    out[vis + "pos_embed.weight"] = w(v["num_position_embeddings"], vd, s=0.5)
    for i in range(v["depth"]):
        p = f"{vis}blocks.{i}."
        for n in ("norm1", "norm2"):
            out[p + f"{n}.weight"] = norm(vd)
            out[p + f"{n}.bias"] = w(vd, s=0.1)
        out[p + "attn.qkv.weight"] = w(3 * vd, vd, s=0.3)
        out[p + "attn.qkv.bias"] = w(3 * vd, s=0.1)
        out[p + "attn.proj.weight"] = w(vd, vd, s=0.2)
        out[p + "attn.proj.bias"] = w(vd, s=0.1)
        out[p + "mlp.linear_fc1.weight"] = w(vff, vd, s=0.2)
        out[p + "mlp.linear_fc1.bias"] = w(vff, s=0.1)
        out[p + "mlp.linear_fc2.weight"] = w(vd, vff, s=0.2)
        out[p + "mlp.linear_fc2.bias"] = w(vd, s=0.1)
    m = 4 * vd
    mergers = [("merger.", vd)] + [
        (f"deepstack_merger_list.{k}.", m) for k in range(len(DEEPSTACK))
    ]
    for name, width in mergers:  # the main merger norms each patch, DeepStack's the 2x2 rows
        out[vis + name + "norm.weight"] = norm(width)
        out[vis + name + "norm.bias"] = w(width, s=0.1)
        out[vis + name + "linear_fc1.weight"] = w(m, m, s=0.15)
        out[vis + name + "linear_fc1.bias"] = w(m, s=0.1)
        out[vis + name + "linear_fc2.weight"] = w(d, m, s=0.15)
        out[vis + name + "linear_fc2.bias"] = w(d, s=0.1)
    return out


def write_text_gguf(
    weights: dict[str, np.ndarray[Any, Any]], path: Path, c: dict[str, Any] = TEXT
) -> None:
    """The text model as the converter writes ``qwen3vl`` (``qwen3vlmoe`` where ``c`` has
    experts: their count keys, the fused stacks split and transposed)."""
    moe = "num_experts" in c
    arch = gguf.MODEL_ARCH.QWEN3VLMOE if moe else gguf.MODEL_ARCH.QWEN3VL
    label = gguf.MODEL_ARCH_NAMES[arch]
    rope_base = c["rope_parameters"]["rope_theta"]
    with hf_gguf(path, label, f"tiny-{label}", c, rope_base=rope_base) as w:
        if moe:
            w.add_expert_count(c["num_experts"])
            w.add_expert_used_count(c["num_experts_per_tok"])
            w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
        w.add_rope_dimension_sections([*SECTIONS, 0])
        w.add_num_deepstack_layers(len(DEEPSTACK))
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _vocab(w)
        nmap = gguf.get_tensor_name_map(arch, c["num_hidden_layers"])
        for name, data in weights.items():
            if name.startswith("model.visual."):
                continue
            arr = np.ascontiguousarray(data, dtype=np.float32)
            if ".mlp.experts." in name:  # (E, d, 2ff) / (E, ff, d) -> rows as outputs
                i = name.split(".")[3]
                if name.endswith("down_proj"):
                    w.add_tensor(f"blk.{i}.ffn_down_exps.weight", _rows(arr))
                    continue
                half = arr.shape[2] // 2
                w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", _rows(arr[:, :, :half]))
                w.add_tensor(f"blk.{i}.ffn_up_exps.weight", _rows(arr[:, :, half:]))
                continue
            hf = name.replace("model.language_model.", "model.")
            new = nmap.get_name(hf, try_suffixes=(".weight", ".bias"))
            assert new is not None, name
            w.add_tensor(new, arr)


def _rows(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.ascontiguousarray(x.transpose(0, 2, 1))


def write_mmproj(weights: dict[str, np.ndarray[Any, Any]], path: Path) -> None:
    """The vision tower and mergers as ``convert_hf_to_gguf.py --mmproj`` writes them."""
    v = VISION
    side = round(v["num_position_embeddings"] ** 0.5)
    with mmproj_file(
        path,
        gguf.VisionProjectorType.QWEN3VL,
        v,
        TEXT["hidden_size"],
        MEAN,
        STD,
        side * v["patch_size"],
    ) as w:
        w.add_vision_use_gelu(True)
        w.add_vision_spatial_merge_size(v["spatial_merge_size"])
        w.add_vision_attention_layernorm_eps(TEXT["rms_norm_eps"])
        w.add_vision_is_deepstack_layers([i in DEEPSTACK for i in range(v["depth"])])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        nmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, v["depth"])
        patch = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_ENC_EMBD_PATCH]
        for name, data in weights.items():
            if not name.startswith("model.visual."):
                continue
            hf = name.replace("model.visual.", "visual.")
            arr = np.ascontiguousarray(data, dtype=np.float32)
            if hf == "visual.patch_embed.proj.weight":  # the 3-D kernel as two 2-D ones
                w.add_tensor(patch + ".weight", np.ascontiguousarray(arr[:, :, 0]))
                w.add_tensor(patch + ".weight.1", np.ascontiguousarray(arr[:, :, 1]))
                continue
            new = _mmproj_name(hf, nmap)
            w.add_tensor(new, arr)


def _mmproj_name(hf: str, nmap: gguf.TensorNameMap) -> str:
    tail = hf.rsplit(".", 1)[1]
    if hf == "visual.patch_embed.proj.bias":
        return gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_ENC_EMBD_PATCH] + ".bias"
    if hf.startswith("visual.deepstack_merger_list."):
        k, part = hf.split(".")[2:4]
        kind = {"norm": "V_DS_NORM", "linear_fc1": "V_DS_FC1", "linear_fc2": "V_DS_FC2"}[part]
        block = DEEPSTACK[int(k)]
        return gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[kind]].format(bid=block) + "." + tail
    if hf.startswith("visual.merger."):
        part = hf.split(".")[2]
        if part == "norm":
            return gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_POST_NORM] + "." + tail
        bid = {"linear_fc1": 0, "linear_fc2": 2}[part]
        return gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_MMPROJ].format(bid=bid) + "." + tail
    new = nmap.get_name(hf, try_suffixes=(".weight", ".bias"))
    assert new is not None, hf
    return new


def model_dir() -> Path:
    return assets_dir() / f"tiny-qwen3vl-v{VERSION}"


def ensure_model() -> tuple[Path, Path, Path]:
    """The HF directory, the model GGUF and the mmproj GGUF (created if missing)."""
    return ensure_vlm(
        model_dir(),
        "qwen3vl",
        make_weights,
        lambda hf, weights: write_hf(hf, weights, CONFIG, PREPROCESSOR),
        write_text_gguf,
        write_mmproj,
    )


if __name__ == "__main__":
    print(*ensure_model())
