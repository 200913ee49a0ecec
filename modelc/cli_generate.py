"""``modelc generate MODEL PROMPT``: stream generated text to the terminal, no server.

Standard output is the generated text only, exactly as the tokenizer decodes it;
progress and statistics go to standard error.  Registered into the main CLI by
``register(subparsers)`` (``modelc.cli.EXTENSIONS``); ``python -m modelc.cli_generate``
runs it standalone.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from modelc.errors import ModelcError, TokenizerError, UnsupportedError, UsageError


def cmd_generate(args: argparse.Namespace) -> int:
    from modelc.resolve import load_ir
    from modelc.runtime.arch import GPT2, Llama, build
    from modelc.runtime.chat_template import render_chat
    from modelc.runtime.generate import generate
    from modelc.runtime.sampling import SamplingParams
    from modelc.runtime.tokenizer import Tokenizer

    if args.max_tokens < 0:
        raise UsageError(f"--max-tokens must be >= 0, got {args.max_tokens}")
    t0 = time.perf_counter()
    ir = load_ir(args.model)
    if ir.tokenizer is None:
        raise TokenizerError(f"{args.model} has no tokenizer, so it cannot generate text")
    model = build(ir)
    if not isinstance(model, (Llama, GPT2)):
        raise UnsupportedError(
            f"{args.model} is a {ir.architecture} model, which does not generate text "
            "(use a llama or gpt2 model)"
        )
    spec = ir.tokenizer
    tok = Tokenizer(spec)
    if args.chat:

        def token_text(i: int | None) -> str:
            return spec.tokens[i] if i is not None and 0 <= i < len(spec.tokens) else ""

        text = render_chat(
            ir.chat_template,
            [{"role": "user", "content": args.prompt}],
            add_generation_prompt=True,
            bos_token=token_text(spec.bos_id),
            eos_token=token_text(spec.eos_id),
        )
        ids = tok.encode(text, add_special=False, parse_special=True)
    else:
        ids = tok.encode(args.prompt, add_special=True)
    stop_ids = sorted(tok.eot_ids)
    params = SamplingParams(
        temperature=args.temperature,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop_token_ids=stop_ids,
    )
    load_s = time.perf_counter() - t0
    gen = generate(model, tok, ids, params)
    out = sys.stdout.buffer
    for _, delta in gen:
        if delta:
            out.write(delta.encode("utf-8", "surrogatepass"))
            out.flush()
    st = gen.stats
    sys.stderr.write(
        f"\n[modelc] {ir.architecture} via {model.be.name}: load {load_s:.2f}s, "
        f"prompt {st.prompt_tokens} tok in {st.prefill_s:.2f}s ({st.prefill_tps:.1f} tok/s), "
        f"generated {st.generated_tokens} tok ({st.decode_tps:.1f} tok/s), "
        f"finish: {gen.finish_reason}\n"
    )
    return 0


def register(subparsers: Any) -> None:
    """Add the ``generate`` subcommand to the main CLI's subparsers."""
    p = subparsers.add_parser("generate", help="generate text from a prompt (no server)")
    p.add_argument("model", metavar="MODEL", help="a model name, catalog name or model path")
    p.add_argument("prompt", metavar="PROMPT", help="taken verbatim")
    p.add_argument(
        "--chat", action="store_true", help="wrap PROMPT as a user message in the chat template"
    )
    p.add_argument(
        "--max-tokens", type=int, default=256, metavar="N", help="stop after N tokens (256)"
    )
    p.add_argument(
        "--temperature", type=float, default=0.8, metavar="T", help="0 = greedy (default 0.8)"
    )
    p.add_argument(
        "--seed", type=int, default=None, metavar="S", help="RNG seed (same seed, same text)"
    )
    p.set_defaults(func=cmd_generate)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="modelc")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ModelcError as e:
        sys.stderr.write(f"modelc: error: {e}\n")
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
