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

from modelc.cli.common import add_seed_and_kv_cache, standalone
from modelc.errors import ModelcError, TokenizerError, UsageError


def cmd_generate(args: argparse.Namespace) -> int:
    from modelc.config import load_config
    from modelc.engine import EngineOptions, build_engine
    from modelc.engine.api import FinishEvent, GenerationRequest

    if args.max_tokens is not None and args.max_tokens < 0:
        raise UsageError(f"--max-tokens must be >= 0, got {args.max_tokens}")
    cfg = load_config()
    t0 = time.perf_counter()
    opt = EngineOptions(max_concurrent=1, queue_size=0, sampling=cfg.sampling.given())
    if args.kv_cache:
        opt.kv_cache = args.kv_cache
    if args.device:
        opt.device = args.device
    if cfg.sampling.max_tokens:
        opt.max_tokens = cfg.sampling.max_tokens
    eng = build_engine(args.model, opt)
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
    given = {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "repetition_penalty": args.repeat_penalty,
    }
    params = pf.defaults.params(given, max_tokens=args.max_tokens, stop=args.stop, seed=args.seed)
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
    p.add_argument(
        "--chat",
        action="store_true",
        help="send PROMPT as a user message through the chat template",
    )
    p.add_argument("--system", default=None, metavar="TEXT", help="with --chat: a system message")
    p.add_argument(
        "--device",
        default=None,
        metavar="auto|cpu|cuda|webgpu|metal",
        help="where the model computes, as for modelc run (default auto)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="stop after N tokens (default: at the end of the turn, at most the server's cap)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        metavar="T",
        help="0 = greedy (default: the model's, else 0.8 as llama-server)",
    )
    p.add_argument("--top-k", type=int, default=None, metavar="K")
    p.add_argument("--top-p", type=float, default=None, metavar="P")
    p.add_argument("--min-p", type=float, default=None, metavar="P")
    p.add_argument("--repeat-penalty", type=float, default=None, metavar="R")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="a stop string")
    add_seed_and_kv_cache(p)
    p.set_defaults(func=cmd_generate)


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(register, argv)


if __name__ == "__main__":
    sys.exit(main())
