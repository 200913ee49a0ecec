"""``modelc generate MODEL PROMPT``: stream generated text to the terminal, no server.

It runs the same engine as ``modelc run`` (same prompt rules, sampling defaults, KV
cache and stop handling), with one request in flight, so a greedy or seeded answer here
is the answer the server gives for the same messages and settings.  Standard output is
the generated text only; progress and statistics go to standard error.  Registered into
the main CLI by ``register(subparsers)`` (``modelc.cli.EXTENSIONS``); ``python -m
modelc.cli.generate`` runs it standalone.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import trio

from modelc.cli.args import add_options, engine_options, sampling_given
from modelc.cli.common import standalone
from modelc.errors import ModelcError, TokenizerError, UsageError


def cmd_generate(args: argparse.Namespace) -> int:
    from modelc.engine import build_engine
    from modelc.engine.api import FinishEvent, GenerationRequest

    if args.max_tokens is not None and args.max_tokens < 0:
        raise UsageError(f"--max-tokens must be >= 0, got {args.max_tokens}")
    t0 = time.perf_counter()
    eng = build_engine(args.model, engine_options(args, max_concurrent=1, queue_size=0))
    if eng.lm is None or eng.prompt is None:
        raise TokenizerError(
            f"{args.model} is a {eng.architecture} model without a tokenizer or an LM head; "
            "it does not generate text (use a llama or gpt2 model)"
        )
    pf = eng.prompt
    if args.chat:
        msgs = [{"role": "system", "content": args.system}] if args.system else []
        msgs.append({"role": "user", "content": args.prompt})
        ids = pf.chat(msgs).ids
    else:
        ids = pf.encode(args.prompt)
    params = pf.defaults.params(
        sampling_given(args), max_tokens=args.max_tokens, stop=args.stop, seed=args.seed
    )
    load_s = time.perf_counter() - t0
    out = sys.stdout.buffer
    finish: list[FinishEvent] = []

    refused: list[ModelcError] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(eng.run)
            try:
                async with eng.submit(GenerationRequest("generate", ids, params)) as handle:
                    async for ev in handle:
                        if ev.text:
                            out.write(ev.text.encode("utf-8", "surrogatepass"))
                            out.flush()
                        if isinstance(ev, FinishEvent):
                            finish.append(ev)
            except ModelcError as e:  # refused at submit (a bad setting, a prompt too long)
                refused.append(e)
            finally:
                nursery.cancel_scope.cancel()

    trio.run(main)
    if refused:
        raise refused[0]
    f = finish[0]
    if f.error:
        raise UsageError(f"generation failed: {f.error}")
    ttft = f.time_to_first_token or 0.0
    decode_s = f.total_time - ttft
    tps = (f.completion_tokens - 1) / decode_s if decode_s > 0 and f.completion_tokens > 1 else 0.0
    sys.stderr.write(
        f"\n[modelc] {eng.architecture}: load {load_s:.2f}s, prompt {f.prompt_tokens} tok "
        f"(first token after {ttft:.2f}s), generated {f.completion_tokens} tok "
        f"({tps:.1f} tok/s), finish: {f.reason.value}\n"
    )
    return 0


def register(subparsers: Any) -> None:
    """Add the ``generate`` subcommand to the main CLI's subparsers."""
    p = subparsers.add_parser("generate", help="generate text from a prompt (no server)")
    p.add_argument("model", metavar="MODEL", help="a model name, catalog name or model path")
    p.add_argument("prompt", metavar="PROMPT", help="taken verbatim")
    add_options(p, "generate")
    p.set_defaults(func=cmd_generate)


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(register, argv)


if __name__ == "__main__":
    sys.exit(main())
