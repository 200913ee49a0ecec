"""A tiny randomly initialised Qwen3-VL-MoE, made with numpy only.

``tests/gen_qwen3vl.py``'s model (the same seed: the same vision tower, attention and norms,
so its ``mmproj-qwen3vl.gguf`` is this model's projector too) with each layer's FFN a
mixture of 4 experts of width 48, 2 per token (the release's 128 of 768, 8 per token),
stored as the Hub's ``Qwen/Qwen3-VL-30B-A3B-Instruct`` stores them: a router
``mlp.gate`` (4, 64) and the fused ``mlp.experts.gate_up_proj`` (4, 64, 2 * 48) and
``down_proj`` (4, 48, 64).  Written to the test-asset cache as an HF directory and
``qwen3vlmoe.gguf`` (the text model as ``convert_hf_to_gguf.py`` writes ``qwen3vlmoe``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests import gen_qwen3vl as base
from tests.assets import assets_dir, cache_lock
from tests.gen_qwen25vl import write_hf

VERSION = 2  # bump when the weights or the layout change
N_EXPERT, N_USED, FF = 4, 2, 48  # 2 * FF != d: transformers transposes the stacks by their shape
TEXT: dict[str, Any] = {
    **base.TEXT,
    "model_type": "qwen3_vl_moe_text",
    "num_experts": N_EXPERT,
    "num_experts_per_tok": N_USED,
    "moe_intermediate_size": FF,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
CONFIG: dict[str, Any] = {
    **base.CONFIG,
    "architectures": ["Qwen3VLMoeForConditionalGeneration"],
    "model_type": "qwen3_vl_moe",
    "text_config": TEXT,
    "vision_config": {**base.VISION, "model_type": "qwen3_vl_moe"},
}


def make_weights() -> dict[str, np.ndarray[Any, Any]]:
    """Qwen3-VL's weights with each dense FFN replaced by a mixture (a second seed)."""
    rng = np.random.default_rng(base.SEED + 1)
    d = TEXT["hidden_size"]
    out = {k: v for k, v in base.make_weights().items() if "_proj" not in k or ".mlp." not in k}
    for i in range(TEXT["num_hidden_layers"]):
        p = f"model.language_model.layers.{i}.mlp."
        out[p + "gate.weight"] = (0.5 * rng.standard_normal((N_EXPERT, d))).astype(np.float32)
        gu = 0.25 * rng.standard_normal((N_EXPERT, d, 2 * FF))
        out[p + "experts.gate_up_proj"] = gu.astype(np.float32)
        dn = 0.25 * rng.standard_normal((N_EXPERT, FF, d))
        out[p + "experts.down_proj"] = dn.astype(np.float32)
    return out


def model_dir() -> Path:
    return assets_dir() / f"tiny-qwen3vlmoe-v{VERSION}"


def ensure_model() -> tuple[Path, Path, Path]:
    """The HF directory, the model GGUF and the mmproj GGUF (Qwen3-VL's) (created if missing)."""
    mm = base.ensure_model()[2]
    dest = model_dir()
    hf, gg = dest / "hf", dest / "qwen3vlmoe.gguf"
    with cache_lock(dest.name):
        if gg.exists() and (hf / "model.safetensors").exists():
            return hf, gg, mm
        weights = make_weights()
        write_hf(hf, weights, CONFIG, base.PREPROCESSOR)
        base.write_text_gguf(weights, gg, TEXT)
    return hf, gg, mm


if __name__ == "__main__":
    print(*ensure_model())
