"""How long building a model's tokenizer takes (``Tokenizer(spec)``), for a few vocabularies.

    .venv/bin/python -m bench.tokenizer_load [--root CHECKOUT] [--reps 3]

Builds the tokenizers of llama.cpp's test GGUFs for Llama 3 (byte-level BPE, 128k tokens),
Qwen 2 and GPT-2 and of the real Gemma 3 270M GGUF (SPM, 262k tokens) ``--reps`` times each
in this process and prints, per vocabulary, the first build's seconds (what a model's load
pays) and the best.  ``--root`` runs another checkout's modelc (a worktree of an older
commit, its kernels extension copied in), so two commits compare in fresh processes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose modelc to time")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(args.root.resolve()))
    import modelc
    from modelc.formats.gguf import load_gguf
    from modelc.runtime.tokenizer import Tokenizer
    from tests import assets

    if not Path(modelc.__file__).resolve().is_relative_to(args.root.resolve()):
        raise SystemExit(f"imported {modelc.__file__}, not {args.root}'s modelc")
    files = {
        n: assets.vocab_dir() / f"ggml-vocab-{n}.gguf" for n in ("llama-bpe", "qwen2", "gpt-2")
    }
    files["gemma3"] = assets.gemma3_gguf()
    out = []
    for name, path in files.items():
        spec = load_gguf(path).tokenizer
        assert spec is not None
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            Tokenizer(spec)
            times.append(time.perf_counter() - t0)
        out.append(f"{name} {times[0]:.2f} (best {min(times):.2f})")
    print(f"{args.root}: " + " | ".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
