"""Regenerate the small committed LoRA fixtures under ``tests/fixtures/lora/``.

Run with the reference venv (torch + transformers + peft)::

    /root/.cache/modelc-ref-venv/bin/python scripts/make_lora_fixtures.py

The base models are the tiny Hugging Face fixtures of ``scripts/make_format_fixtures.py``
(``tests/fixtures/formats/llama-st`` and ``gpt2-st``).  For each adapter below a PEFT
``LoraConfig`` wraps the base model, every ``lora_A``/``lora_B`` is filled with seeded
random values (PEFT initialises ``lora_B`` to zero, which would make the adapter a no-op),
the adapter is saved with ``save_pretrained`` (``adapter_config.json`` +
``adapter_model.safetensors``), and ``golden.npz`` records, for ``SEQUENCES``, the logits
of every position from PEFT's ``merge_and_unload()`` model (``merged_i``) and from the
base model (``base_i``), plus the token ids (``tokens_i``).

* ``llama/``: r=4, alpha=8 on q_proj, k_proj, v_proj, o_proj, gate_proj;
* ``llama-rslora/``: rsLoRA (alpha/sqrt(r)) with a ``rank_pattern``/``alpha_pattern``
  override for layer 1's v_proj, on q_proj and v_proj;
* ``gpt2/``: r=4, alpha=8 on c_attn and c_proj (GPT-2 ``Conv1D``: PEFT sets
  ``fan_in_fan_out``; both attention and MLP ``c_proj`` match).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "tests" / "fixtures" / "formats"
OUT = ROOT / "tests" / "fixtures" / "lora"
SEQUENCES = [[5, 17, 42, 99, 3, 250], [1, 2, 3], [200, 7, 7, 7, 64, 12, 31, 8, 150]]


def make(name: str, base: str, seed: int, **lora: Any) -> None:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(BASE / base, dtype=torch.float32).eval()
    with torch.no_grad():
        base_logits = [model(torch.tensor([s])).logits[0].numpy() for s in SEQUENCES]
    peft_model = get_peft_model(model, LoraConfig(**lora))
    with torch.no_grad():
        for pname, p in peft_model.named_parameters():
            if ".lora_A." in pname or ".lora_B." in pname:
                p.copy_(torch.randn_like(p) * 0.1)
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    peft_model.save_pretrained(d)
    cfg_path = d / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = f"tests/fixtures/formats/{base}"  # not this machine's path
    cfg["target_modules"] = sorted(cfg["target_modules"])  # PEFT keeps a set: fix the order
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    with torch.no_grad():
        unmerged = [peft_model(torch.tensor([s])).logits[0].numpy() for s in SEQUENCES]
        merged_model = peft_model.merge_and_unload().eval()
        merged = [merged_model(torch.tensor([s])).logits[0].numpy() for s in SEQUENCES]
    for u, m, b in zip(unmerged, merged, base_logits, strict=True):
        assert np.abs(u - m).max() < 1e-4, "PEFT merged and unmerged logits disagree"
        assert np.abs(m - b).max() > 1e-2, "the adapter does not change the logits"
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    for i, s in enumerate(SEQUENCES):
        arrays[f"tokens_{i}"] = np.array(s, np.int64)
        arrays[f"merged_{i}"] = merged[i]
        arrays[f"base_{i}"] = base_logits[i]
    np.savez(d / "golden.npz", **arrays)
    (d / "README.md").unlink(missing_ok=True)  # PEFT's model card template


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    make(
        "llama",
        "llama-st",
        10,
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj"],
        lora_dropout=0.0,
    )
    make(
        "llama-rslora",
        "llama-st",
        11,
        r=4,
        lora_alpha=6,
        use_rslora=True,
        target_modules=["q_proj", "v_proj"],
        rank_pattern={"model.layers.1.self_attn.v_proj": 2},
        alpha_pattern={"model.layers.1.self_attn.v_proj": 16},
        lora_dropout=0.0,
    )
    make(
        "gpt2",
        "gpt2-st",
        12,
        r=4,
        lora_alpha=8,
        target_modules=["c_attn", "c_proj"],
        fan_in_fan_out=True,
        lora_dropout=0.0,
    )
    for p in sorted(OUT.rglob("*")):
        if p.is_file():
            assert p.stat().st_size < 300_000, p
            print(f"{p.stat().st_size:>8}  {p.relative_to(OUT)}")


if __name__ == "__main__":
    main()
