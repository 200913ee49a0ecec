"""A tiny random OLMo 3 (``tests/gen_olmo2.py``'s layers): Olmo-3-32B's shape scaled down.

OLMo 2's layer (post-norms only, whole-projection Q/K norms) with a sliding window of 8
positions (shorter than the test prompts, so it matters) on three of every four layers
(``layer_types`` as transformers writes them: layer 3 full), grouped-query attention (as
the 32B), RoPE base 500000 on every layer, the release's YaRN (x8, attention factor
0.1 ln 8 + 1) on the full layers only.  The GGUF is what ``convert_hf_to_gguf.py``'s
``Olmo2Model`` writes for it (architecture ``olmo2`` with ``attention.sliding_window`` and
``attention.sliding_window_pattern``).  ``python -m tests.gen_olmo3``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.gen_olmo2 import CONFIG as OLMO2
from tests.gen_olmo2 import olmo_weights, write_gguf
from tests.gen_tiny import Arrays, ensure

VERSION = 3
SEED = 20261205
N_LAYER = 4
CONFIG: dict[str, Any] = {
    **OLMO2,
    "architectures": ["Olmo3ForCausalLM"],
    "model_type": "olmo3",
    "num_hidden_layers": N_LAYER,
    "num_key_value_heads": 2,
    "sliding_window": 8,
    # the release's YaRN (x8 past an original context of 8192), on the full layers only
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 32,
        "attention_factor": 1.2079441541679836,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    },
    "layer_types": [
        "sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(N_LAYER)
    ],
}


def weights() -> Arrays:
    return olmo_weights(CONFIG, SEED)


def _write(ws: Arrays, path: Path) -> None:
    write_gguf(ws, path, "olmo2", CONFIG)


def ensure_model() -> tuple[Path, Path]:
    """The HF directory and the GGUF (made if missing)."""
    return ensure(f"tiny-olmo3-v{VERSION}", CONFIG, weights, _write)


if __name__ == "__main__":
    print(*ensure_model())
