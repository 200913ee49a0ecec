"""Goldens for the tiny random families of ``tests/gen_families.py`` (qwen2, qwen3, mistral,
gemma2, gemma3, phi3).

Run with the reference venv (torch + transformers + tokenizers), from the root:

    /root/.cache/modelc-ref-venv/bin/python scripts/make_tiny_families.py [qwen2] [qwen3] [mistral]

The models themselves are numpy-made by the project venv (``python -m
tests.gen_families``: HF directory + GGUF in the test-asset cache), so this script and
the tests load the very same files.  Per family, ``tests/golden/family_<family>.json``:
for each token-id prompt the top-10 next-token log-probabilities and a 16-token greedy
continuation from transformers in f32 (EOS does not stop it); the ids of a text and of a
chat prompt from the HF tokenizer; under ``scalings`` the same records for the family's
weights with another RoPE scaling or config change (``config`` is what to merge into
config.json): YaRN on qwen2, linear and llama3 on mistral, ``query_pre_attn_scalar`` on
gemma2/gemma3, long LongRoPE factors on phi3 (transformers' eager attention for these).

``--tokenizer`` trains the shared byte-level BPE again (384 tokens on this repository's
README, Qwen2's pre-tokenizer regex, ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``)
into ``tests/fixtures/families/``; BPE training breaks ties differently from run to run,
so the committed file is the one the goldens were made with.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "families"
GOLDEN = ROOT / "tests" / "golden"
N_VOCAB = 384
TOP_N = 10
N_GREEDY = 16
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_PRE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROMPTS = [
    [5],
    [17, 200, 31, 99],
    [300, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
    [383, 0, 250, 250, 250, 64, 128],
    list(range(100, 140)),
    [42] * 20,
]
FAMILIES = ["qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3"]


def train_tokenizer() -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRE), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=N_VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([(ROOT / "README.md").read_text()], trainer)
    assert tok.get_vocab_size() == N_VOCAB, tok.get_vocab_size()
    FIX.mkdir(parents=True, exist_ok=True)
    tok.save(str(FIX / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (FIX / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")


def project_python(code: str) -> str:
    """Run ``code`` in the project venv (numpy-made models), return its stdout."""
    py = ROOT / ".venv" / "bin" / "python"
    out = subprocess.run([str(py), "-c", code], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr)
    return out.stdout.strip()


# RoPE scalings checked end to end: the family's weights under another config.json
SCALINGS: dict[str, list[dict[str, Any]]] = {
    "qwen2": [{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}],
    "mistral": [
        {"rope_type": "linear", "factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ],
}


# config.json changes checked end to end on the HF directory only (GGUF has no key for
# query_pre_attn_scalar; llama.cpp picks LongRoPE's factors by context size, not length)
PHI3_LONG = [1.0, 1.5, 2.5, 4.0, 8.0, 16.0, 32.0, 64.0]
PHI3_SHORT = [1.0, 1.25, 1.5, 2.0, 3.0, 4.5, 7.0, 12.0]
VARIANTS: dict[str, list[dict[str, Any]]] = {
    "gemma2": [{"query_pre_attn_scalar": 64}],
    "gemma3": [{"query_pre_attn_scalar": 8}],
    "phi3": [
        {  # prompts past 16 tokens rotate with the long factors, as transformers switches
            "original_max_position_embeddings": 16,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": PHI3_SHORT,
                "long_factor": PHI3_LONG,
            },
        }
    ],
}


def load(hf_dir: Path) -> Any:
    """transformers' f32 model; eager attention (gemma2's soft-capping needs it)."""
    return AutoModelForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def variant(hf_dir: Path, patch: dict[str, Any]) -> dict[str, Any]:
    """Records of the model in ``hf_dir`` with ``patch`` merged into its config.json."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "m"
        shutil.copytree(hf_dir, d)
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, **patch}))
        return {"config": patch, "records": records(load(d))}


def records(model: Any) -> list[dict[str, Any]]:
    out = []
    for ids in PROMPTS:
        x = torch.tensor([ids])
        with torch.no_grad():
            logits = model(x).logits[0, -1].double()
        lp = torch.log_softmax(logits, -1)
        top = torch.topk(lp, TOP_N)
        with torch.no_grad():
            gen = model.generate(
                x,
                attention_mask=torch.ones_like(x),  # id 0 is the pad id: not masked here
                max_new_tokens=N_GREEDY,
                min_new_tokens=N_GREEDY,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        out.append(
            {
                "prompt_ids": ids,
                "top_ids": [int(i) for i in top.indices],
                "top_logprobs": [round(float(v), 6) for v in top.values],
                "greedy": [int(i) for i in gen[0, len(ids) :]],
            }
        )
    return out


def scaled(model: Any, rope: dict[str, Any]) -> dict[str, Any]:
    """Records of ``model``'s weights with ``rope`` as its RoPE parameters."""
    cfg = copy.deepcopy(model.config)
    params = {"rope_theta": 10000.0, **rope}
    cfg.rope_parameters = params
    other = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    other.load_state_dict(model.state_dict())
    return {"config": {"rope_parameters": params}, "records": records(other)}


def goldens(family: str, hf_dir: Path) -> None:
    import transformers

    model = load(hf_dir) if family in VARIANTS else None
    model = model or AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    fast = PreTrainedTokenizerFast.from_pretrained(hf_dir)
    text = "The model compiler packs a file."
    chat = [{"role": "user", "content": "What works?"}]
    chat_ids = fast.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    if not isinstance(chat_ids, list):  # a BatchEncoding in transformers 5
        chat_ids = list(chat_ids["input_ids"])
    doc = {
        "model": f"tests/gen_families.py {family}",
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, f32",
        "text": text,
        "text_ids": fast(text)["input_ids"],
        "chat_ids": chat_ids,
        "records": records(model),
        "scalings": [scaled(model, r) for r in SCALINGS.get(family, [])]
        + [variant(hf_dir, p) for p in VARIANTS.get(family, [])],
    }
    (GOLDEN / f"family_{family}.json").write_text(json.dumps(doc, indent=1) + "\n")


def main(argv: list[str]) -> None:
    if "--tokenizer" in argv:
        train_tokenizer()
    for family in [a for a in argv if not a.startswith("--")] or FAMILIES:
        paths = project_python(
            f"from tests.gen_families import ensure_family; print(*ensure_family({family!r}))"
        )
        goldens(family, Path(paths.split()[0]))
        print(family, paths)


if __name__ == "__main__":
    main(sys.argv[1:])
