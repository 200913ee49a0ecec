"""Regenerate the numeric golden references in tests/golden/ with Hugging Face transformers.

Run with the reference venv (torch 2.13 + transformers 5.x), from the repository root:

    /root/.cache/modelc-ref-venv/bin/python scripts/make_goldens.py \
        [smollm2] [chat] [gpt2] [minilm] [gemma3]

(no argument: all five).

The test assets are located (and fetched if needed) by the project venv
(``.venv/bin/python -m tests.assets`` / ``-m tests.gen_gpt2``), so this script and the
tests use the same files.

* smollm2: the real Q4_1 GGUF, dequantized to f32 by transformers (``gguf_file=``, which
  also undoes the GGUF Q/K RoPE permutation); per prompt the top-10 next-token ids and
  log-probabilities, and a 32-token greedy continuation (EOS does not stop it).
* chat: the same SmolLM2 model on the cases of ``tests/fixtures/chat_cases.json``
  (``tests/golden/smollm2_chat.json``): per chat the prompt rendered by the GGUF's own chat
  template (``apply_chat_template(..., add_generation_prompt=True)``), its ids, and a greedy
  answer of at most ``max_new_tokens`` tokens that stops after EOS (``<|im_end|>``, kept as
  the last id), with ``finish`` ("stop"/"length") and the per-step top-1/top-2 logit
  margins; the same for each raw prompt, tokenized with ``add_special_tokens=True``.
* gpt2: the numpy-generated random GPT-2 of ``tests/gen_gpt2.py`` loaded into
  ``GPT2LMHeadModel``; same outputs.  Also checks that the torch-free
  ``pytorch_model.bin`` copy (``<assets>/gpt2-random-bin/``) loads in torch bit for bit.
* gemma3: the real Gemma 3 270M Q4_K_M GGUF (``tests.assets.gemma3_gguf()``, no chat
  template), dequantized to f32 by transformers; the raw prompts below and chats rendered
  with llama.cpp's ChatML fallback (the text modelc and llama.cpp's server feed such a
  model), ids from transformers' GGUF tokenizer with its BOS; same fields as smollm2, with
  the per-step margins.
* minilm: all-MiniLM-L6-v2 ``BertModel``, mean-pooled over the attention mask and
  L2-normalised (the sentence-transformers recipe).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
CHAT_CASES = ROOT / "tests" / "fixtures" / "chat_cases.json"
TOP_N = 10
N_GREEDY = 32

SMOLLM2_RAW_PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a",
    "def fibonacci(n):\n",
    "The quick brown fox jumps over the",
    "1, 2, 3, 4, 5,",
    "Water boils at a temperature of",
    "In 1492, Christopher Columbus",
    "The three primary colors are",
    "import numpy as np\n\nx = np.",
    "Photosynthesis is the process by which",
    "Q: What is 12 times 12?\nA:",
    "My favourite food is",
    "The largest planet in the solar system is",
    "<html>\n<head>\n<title>",
    "Machine learning is a field of",
    "Le chat est sur la",
    "To make a cup of tea, first",
    "SELECT name, age FROM users WHERE",
    "The mitochondria is the",
    "Roses are red, violets are",
    "A",
    "Hello! How are you doing today? I am",
]
SMOLLM2_CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of Germany?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three fruits."},
    ],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you?"},
        {"role": "user", "content": "Tell me a fun fact about cats."},
    ],
]

MINILM_SENTENCES = [
    "This is an example sentence.",
    "Each sentence is converted into a vector.",
    "The cat sits outside.",
    "A man is playing guitar.",
    "I love pasta with tomato sauce!",
    "The new movie is awesome.",
    "Quantum computers use qubits instead of bits.",
    "How do I reset my password?",
    "Paris",
    "The weather today is sunny with a light breeze from the west, perfect for a long walk in the park.",
]


def project_python(code: str) -> str:
    """Run a snippet in the project venv (which knows where the test assets live)."""
    out = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-c", code],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def next_token_record(logits: torch.Tensor) -> dict[str, Any]:
    logp = torch.log_softmax(logits.double(), dim=-1)
    top = torch.topk(logp, TOP_N)
    return {
        "top_ids": [int(i) for i in top.indices],
        "top_logprobs": [round(float(v), 6) for v in top.values],
    }


@torch.no_grad()
def greedy(
    model: Any, ids: list[int], n: int = N_GREEDY, eos: int | None = None
) -> tuple[list[int], list[float]]:
    """Greedy decoding with an explicit KV cache: up to ``n`` new tokens, stopping after
    ``eos`` (kept as the last id) when given; and the top-1/top-2 logit margin of each step."""
    out = model(torch.tensor([ids]), use_cache=True)
    past = out.past_key_values
    logits = out.logits[0, -1]
    gen: list[int] = []
    margins: list[float] = []
    while True:
        top2 = torch.topk(logits, 2).values
        margins.append(float(top2[0] - top2[1]))
        tok = int(torch.argmax(logits))
        gen.append(tok)
        if len(gen) == n or tok == eos:
            return gen, margins
        out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1]


@torch.no_grad()
def lm_record(model: Any, ids: list[int], **extra: Any) -> dict[str, Any]:
    logits = model(torch.tensor([ids])).logits[0, -1]
    gen, margins = greedy(model, ids)
    return {
        **extra,
        "prompt_ids": ids,
        **next_token_record(logits),
        "greedy": gen,
        "min_greedy_margin": round(min(margins), 5),
    }


def answer_record(tok: Any, model: Any, ids: list[int], n: int) -> dict[str, Any]:
    """Greedy answer of at most ``n`` tokens that stops after EOS (the chat golden's fields)."""
    gen, margins = greedy(model, ids, n, eos=tok.eos_token_id)
    stopped = gen[-1] == tok.eos_token_id
    return {
        "answer_ids": gen,
        "answer_text": tok.decode(
            gen[:-1] if stopped else gen,
            skip_special_tokens=False,
            clean_up_tokenization_spaces=False,
        ),
        "finish": "stop" if stopped else "length",
        "min_margin": round(min(margins), 5),
        "margins": [round(m, 4) for m in margins],
    }


def write(name: str, data: dict[str, Any]) -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    path = GOLDEN / name
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def load_smollm2() -> tuple[Path, Any, Any]:
    """The SmolLM2 test GGUF's path, and its tokenizer and f32-dequantized model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(project_python("from tests.assets import smollm2_gguf; print(smollm2_gguf())"))
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    return gguf, tok, model


GEMMA3_RAW_PROMPTS = [
    *SMOLLM2_RAW_PROMPTS[:12],
    "The Eiffel Tower was built in",
    "A recipe for pancakes:\n1.",
    "The speed of light is approximately",
    "for i in range(10):\n   ",
    "Dear Sir or Madam,\n\nI am writing to",
    "The French Revolution began in",
    "Monday, Tuesday, Wednesday,",
    "The human heart has four",
    "SELECT * FROM orders WHERE",
    "Shakespeare wrote many plays, including",
    "The first man on the moon was",
    "To be or not to be,",
    "Apples are a good source of",
    "The chemical symbol for gold is",
    "In the beginning God created",
    "January, February, March,",
    "The Pacific Ocean is the",
    "Python is a programming language that",
    "The Great Wall of China is",
    "My name is John and I",
    "class Stack:\n    def __init__(self):\n",
    "The theory of relativity was developed by",
    "Once there lived a king who",
    "The most popular sport in the world is",
    "Bananas are yellow because",
    "The sun rises in the",
    "An atom consists of",
    "The meaning of life is",
]


def chatml(messages: list[dict[str, str]]) -> str:
    """llama.cpp's fallback template (``modelc.runtime.chat_template.DEFAULT_TEMPLATE``)."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def make_gemma3() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(project_python("from tests.assets import gemma3_gguf; print(gemma3_gguf())"))
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    prompts: list[tuple[str, str, Any]] = [("raw", p, None) for p in GEMMA3_RAW_PROMPTS]
    prompts += [("chat", chatml(c), c) for c in SMOLLM2_CHATS]
    records = []
    for kind, text, messages in prompts:
        ids = tok(text, add_special_tokens=True).input_ids
        logits = model(torch.tensor([ids])).logits[0, -1]
        gen, margins = greedy(model, ids, 24)
        records.append(
            {
                "kind": kind,
                "prompt": text,
                "prompt_ids": ids,
                **next_token_record(logits),
                "greedy": gen,
                "greedy_text": tok.decode(gen, skip_special_tokens=False),
                "margins": [round(m, 4) for m in margins],
                **({"messages": messages} if messages else {}),
            }
        )
        print(kind, repr(text[:40]), "->", repr(records[-1]["greedy_text"][:60]))
    write(
        "gemma3_270m.json",
        {
            "model": f"{gguf.name} (sha256 a5fd3b62...), transformers f32",
            "eos_ids": sorted({int(tok.eos_token_id), 106}),
            "records": records,
        },
    )


def make_smollm2() -> None:
    gguf, tok, model = load_smollm2()
    records = []
    for p in SMOLLM2_RAW_PROMPTS:
        ids = tok(p, add_special_tokens=False).input_ids
        rec = lm_record(model, ids, prompt=p)
        rec["greedy_text"] = tok.decode(
            rec["greedy"], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        records.append(rec)
    for msgs in SMOLLM2_CHATS:
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False).input_ids
        records.append(lm_record(model, ids, chat=msgs, prompt=text))
        print(repr(text))
    write(
        "smollm2.json",
        {
            "model": gguf.name,
            "reference": f"transformers {__import__('transformers').__version__}, "
            f"torch {torch.__version__}, f32 dequantized GGUF",
            "records": records,
        },
    )


def make_chat() -> None:
    cases = json.loads(CHAT_CASES.read_text())
    n = cases["max_new_tokens"]
    gguf, tok, model = load_smollm2()
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2, (
        tok.eos_token,
        tok.eos_token_id,
    )
    chats = []
    for case in cases["chats"]:
        msgs = case["messages"]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False).input_ids
        direct = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        direct = direct if isinstance(direct, list) else direct["input_ids"]
        assert list(direct) == ids, (case["id"], direct, ids)
        rec = {
            "id": case["id"],
            "prompt": text,
            "prompt_ids": ids,
            **answer_record(tok, model, ids, n),
        }
        chats.append(rec)
        print(f"{case['id']}: {rec['finish']} {rec['min_margin']} {rec['answer_text']!r}")
    raw = []
    for p in cases["raw"]:
        ids = tok(p, add_special_tokens=True).input_ids
        plain = tok(p, add_special_tokens=False).input_ids
        rec = {"prompt": p, "prompt_ids": ids}
        if plain != ids:  # the tokenizer added special tokens (a BOS) of its own
            rec["prompt_ids_no_special"] = plain
        rec.update(answer_record(tok, model, ids, n))
        raw.append(rec)
        print(f"{p!r}: {rec['finish']} {rec['min_margin']} {rec['answer_text']!r}")
    write(
        "smollm2_chat.json",
        {
            "model": gguf.name,
            "reference": f"transformers {__import__('transformers').__version__}, "
            f"torch {torch.__version__}, f32 dequantized GGUF, greedy with KV cache",
            "max_new_tokens": n,
            "eos_id": tok.eos_token_id,
            "chats": chats,
            "raw": raw,
        },
    )


def make_gpt2() -> None:
    from transformers import GPT2LMHeadModel

    d = Path(
        project_python("from tests.gen_gpt2 import ensure_gpt2_random; print(ensure_gpt2_random())")
    )
    model = GPT2LMHeadModel.from_pretrained(d, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(7)
    records = []
    for i, n in enumerate([1, 2, 3, 5, 8, 13, 17, 21, 30, 40, 4, 9, 11, 16, 25, 33, 6, 7, 12, 50]):
        while True:
            ids = [int(t) for t in torch.randint(0, 50257, (n,), generator=gen)]
            if i % 4 == 0:  # some prompts of common (low-id) tokens
                ids = [int(t) % 2000 for t in ids]
            rec = lm_record(model, ids)
            # a random model has near-ties no f32 implementation decides reliably: redraw
            if rec["min_greedy_margin"] >= 2e-3:
                break
        records.append(rec)
    write(
        "gpt2_random.json",
        {
            "model": "tests/gen_gpt2.py SEED weights",
            "reference": f"transformers {__import__('transformers').__version__}, "
            f"torch {torch.__version__}, GPT2LMHeadModel f32",
            "records": records,
        },
    )
    # the torch-free .bin copy (tests/gen_gpt2.py) must be what torch.load reads
    bin_dir = Path(
        project_python(
            "from tests.gen_gpt2 import ensure_gpt2_random_bin; print(ensure_gpt2_random_bin())"
        )
    )
    sd = torch.load(bin_dir / "pytorch_model.bin", weights_only=True)
    ref = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert set(sd) == set(ref) and all(torch.equal(sd[k], ref[k]) for k in ref), "bad .bin"
    print(f"checked {bin_dir / 'pytorch_model.bin'} with torch.load")


@torch.no_grad()
def make_minilm() -> None:
    from transformers import AutoTokenizer, BertModel

    d = Path(project_python("from tests.assets import minilm_dir; print(minilm_dir())"))
    tok = AutoTokenizer.from_pretrained(d)
    model = BertModel.from_pretrained(d, dtype=torch.float32).eval()
    enc = tok(MINILM_SENTENCES, padding=True, return_tensors="pt")
    hidden = model(**enc).last_hidden_state  # (batch, seq, 384)
    mask = enc["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    emb = torch.nn.functional.normalize(pooled, p=2, dim=1)
    records = []
    for i, s in enumerate(MINILM_SENTENCES):
        n = int(enc["attention_mask"][i].sum())
        records.append(
            {
                "sentence": s,
                "input_ids": [int(t) for t in enc["input_ids"][i, :n]],
                "token_type_ids": [int(t) for t in enc["token_type_ids"][i, :n]],
                "embedding": [round(float(v), 7) for v in emb[i]],
            }
        )
    write(
        "minilm.json",
        {
            "model": "all-MiniLM-L6-v2",
            "reference": f"transformers {__import__('transformers').__version__}, "
            f"torch {torch.__version__}, BertModel f32, mean pooling + L2 normalisation",
            "records": records,
        },
    )


def main() -> None:
    torch.set_grad_enabled(False)
    which = sys.argv[1:] or ["smollm2", "chat", "gpt2", "minilm", "gemma3"]
    makers = {
        "smollm2": make_smollm2,
        "chat": make_chat,
        "gpt2": make_gpt2,
        "minilm": make_minilm,
        "gemma3": make_gemma3,
    }
    for w in which:
        makers[w]()


if __name__ == "__main__":
    main()
