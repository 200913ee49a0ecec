"""Goldens for the tiny random Gemma 4 models (dense, mixture) of ``tests/gen_gemma4.py``.

Run with the reference venv (torch + transformers 5.23), from the root:

    MODELC_PY=<the project venv's python> /root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_gemma4

``--tokenizer`` builds the model's 384-token Gemma-style tokenizer again into
``tests/fixtures/gemma4/`` (BPE over ``▁``-escaped text with byte fallback, as Gemma 4's
``tokenizer.json``: Gemma 4's special tokens, the 256 ``<0xXX>`` bytes, then pieces
trained on this repository's README line by line, so no merge crosses a newline; Gemma
4's real chat template).  The families' byte-level BPE will not do: the converter's
``Gemma4Model`` reads the vocabulary with ``LlamaHfVocab``, which takes only that kind.

The model is numpy-made by the project venv (``python -m tests.gen_gemma4``: HF directory +
GGUF in the test-asset cache), so this script and the tests load the very same files.
``tests/golden/family_gemma4.json`` and ``family_gemma4moe.json``: per token-id prompt the top-10 next-token
log-probabilities and a 16-token greedy continuation from transformers in f32 (eager
attention), as ``make_tiny_families.py`` records them, and the token ids of a text and
of a chat prompt (Gemma 4's template; ``enable_thinking`` unset, and true as llama.cpp's
server renders it) from the HF tokenizer.
``tests/golden/gemma4_converter.json``: llama.cpp's ``convert_hf_to_gguf.py`` (the
llama-cpp-python 0.3.36 sdist's, ``LLAMA_CPP``) run on the same HF directory with
``--outtype f32`` and ``q8_0``, each GGUF's metadata and per tensor its type, shape and
the sha256 of its bytes (``tests.gen_gemma4.manifest``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from scripts.make_tiny_families import GOLDEN, ROOT, records

LLAMA_CPP = Path(os.environ.get("LLAMA_CPP", "/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp"))
PROJECT_PY = os.environ.get("MODELC_PY", str(ROOT / ".venv" / "bin" / "python"))


FIX4 = ROOT / "tests" / "fixtures" / "gemma4"
TEMPLATE = ROOT / "tests" / "fixtures" / "templates" / "google-gemma-4-31B-it.jinja"
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
CHAT_TOKENS = [
    "<|turn>",
    "<turn|>",
    "<|think|>",
    "<|channel>",
    "<channel|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
]
N_VOCAB = 384


def make_tokenizer() -> None:
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    specials = SPECIALS + CHAT_TOKENS
    n_pieces = N_VOCAB - len(specials) - 256
    trainer = trainers.BpeTrainer(vocab_size=n_pieces, limit_alphabet=48, show_progress=False)
    lines = [ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.strip()]
    probe = Tokenizer(models.BPE())
    probe.normalizer = normalizers.Replace(" ", "\u2581")
    probe.train_from_iterator(lines, trainer)
    learned = json.loads(probe.to_str())["model"]
    pieces = sorted(learned["vocab"], key=lambda t: learned["vocab"][t])[:n_pieces]
    vocab = {t: i for i, t in enumerate(specials)}
    vocab |= {f"<0x{b:02X}>": len(specials) + b for b in range(256)}
    vocab |= {t: len(vocab) + i for i, t in enumerate(pieces)}
    assert len(vocab) == N_VOCAB, len(vocab)
    keep = set(pieces)
    merges = [m for m in learned["merges"] if "".join(m) in keep and m[0] in keep and m[1] in keep]
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=[tuple(m) for m in merges],
            byte_fallback=True,
            fuse_unk=True,
            unk_token="<unk>",
        )
    )
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    tok.add_special_tokens(specials)
    FIX4.mkdir(parents=True, exist_ok=True)
    tok.save(str(FIX4 / "tokenizer.json"))
    config = {
        "tokenizer_class": "GemmaTokenizer",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "mask_token": "<mask>",
        "add_bos_token": True,
        "add_eos_token": False,
        "extra_special_tokens": CHAT_TOKENS,
        "chat_template": TEMPLATE.read_text(),
    }
    (FIX4 / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")


def project(code: str) -> str:
    """Run ``code`` in the project venv (numpy-made model, the manifest), return its stdout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [PROJECT_PY, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def converter_manifests(hf: Path) -> dict[str, object]:
    """llama.cpp's own ``convert_hf_to_gguf.py`` on the HF directory (f32 and q8_0): each
    GGUF's metadata and tensors, as ``tests.gen_gemma4.manifest`` records them."""
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("f32", "q8_0"):
            dest = Path(tmp) / f"{kind}.gguf"
            cmd = [sys.executable, "convert_hf_to_gguf.py", "--outtype", kind]
            subprocess.run([*cmd, "--outfile", str(dest), str(hf)], cwd=LLAMA_CPP, check=True)
            code = f"import json; from tests.gen_gemma4 import manifest; print(json.dumps(manifest({str(dest)!r})))"
            out[kind] = json.loads(project(code))
    return out


def goldens(variant: str) -> dict[str, object]:
    """``tests/golden/family_<variant>.json``; the converter's manifests, returned."""
    code = f"from tests.gen_gemma4 import ensure_gemma4; print(*ensure_gemma4({variant!r}))"
    hf = Path(project(code).split()[0])
    model = AutoModelForCausalLM.from_pretrained(
        hf, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    fast = AutoTokenizer.from_pretrained(hf)
    text = "The model compiler packs a file."
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What works?"}]

    def chat_ids(**kw: object) -> list[int]:
        ids = fast.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, **kw)
        return ids if isinstance(ids, list) else list(ids["input_ids"])  # a BatchEncoding

    doc = {
        "model": f"tests/gen_gemma4.py {variant}",
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, f32",
        "text": text,
        "text_ids": fast(text)["input_ids"],
        "chat": chat,
        "chat_ids": chat_ids(),  # enable_thinking unset
        "chat_ids_thinking": chat_ids(enable_thinking=True),  # as llama.cpp's server renders
        "records": records(model),
    }
    (GOLDEN / f"family_{variant}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(variant, hf)
    return converter_manifests(hf)


def main() -> None:
    conv: dict[str, object] = {"converter": f"{LLAMA_CPP}/convert_hf_to_gguf.py"}
    for variant in ("gemma4", "gemma4moe"):
        conv[variant] = goldens(variant)
    (GOLDEN / "gemma4_converter.json").write_text(json.dumps(conv, indent=1) + "\n")


if __name__ == "__main__":
    if "--tokenizer" in sys.argv:
        make_tokenizer()
    main()
