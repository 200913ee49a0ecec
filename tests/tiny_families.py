"""Every tiny random family of the test generators (``tests/gen_*.py``), as one table: the
name a test parametrizes by -> a function giving its GGUF (written to the test-asset cache
on first use, a pure function of each generator's seed).  The backend tests run each
family through every backend from here, so a family added with its generator is added to
them by one line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests import (
    gen_deepseek2,
    gen_gemma4,
    gen_glm4moe,
    gen_gpt2,
    gen_gptoss,
    gen_granite4,
    gen_lfm2,
    gen_lfm2moe,
    gen_llama4,
    gen_mistral3,
    gen_olmo2,
    gen_olmo3,
    gen_phi4mini,
    gen_qwen25vl,
    gen_qwen35,
    gen_smollm3,
)
from tests.gen_families import CONFIGS, ensure_family


def _family(name: str) -> Callable[[], Path]:
    return lambda: ensure_family(name)[1]


TINY: dict[str, Callable[[], Path]] = {
    **{f: _family(f) for f in CONFIGS},  # qwen2, qwen3, mistral, gemma2/3, phi3, moe
    "gpt2": lambda: gen_gpt2.ensure_gpt2_random(),
    "gptoss": lambda: gen_gptoss.ensure_gptoss("f32")[1],
    "gptoss-mxfp4": lambda: gen_gptoss.ensure_gptoss("mxfp4")[1],
    "qwen35": lambda: gen_qwen35.ensure_qwen35("qwen35")[1],
    "qwen35moe": lambda: gen_qwen35.ensure_qwen35("qwen35moe")[1],
    "qwen3next": lambda: gen_qwen35.ensure_qwen35("qwen3next")[1],
    "gemma4": lambda: gen_gemma4.ensure_gemma4("gemma4")[1],
    "gemma4moe": lambda: gen_gemma4.ensure_gemma4("gemma4moe")[1],
    "deepseek2": lambda: gen_deepseek2.ensure_model("v2lite")[1],
    "deepseek3": lambda: gen_deepseek2.ensure_model("v3")[1],
    "glm4moe": lambda: gen_glm4moe.ensure_model()[1],
    "lfm2": lambda: gen_lfm2.ensure_model()[1],
    "lfm2moe": lambda: gen_lfm2moe.ensure_model()[1],
    "granite4": lambda: gen_granite4.ensure_model("granite4")[1],
    "granite4moe": lambda: gen_granite4.ensure_model("granite4moe")[1],
    "smollm3": lambda: gen_smollm3.ensure_model()[1],
    "olmo2": lambda: gen_olmo2.ensure_model()[1],
    "olmo3": lambda: gen_olmo3.ensure_model()[1],
    "mistral3": lambda: gen_mistral3.ensure_model()[1],
    "llama4": lambda: gen_llama4.ensure_model()[1],
    "phi4mini": lambda: gen_phi4mini.ensure_model()[1],
    "qwen2vl": lambda: gen_qwen25vl.ensure_model()[1],
}
