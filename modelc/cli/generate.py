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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelc.cli.args import add_options, engine_options, sampling_given
from modelc.cli.common import standalone
from modelc.errors import ModelcError, TokenizerError, UsageError

if TYPE_CHECKING:
    from modelc.engine import LLMEngine
    from modelc.runtime.model import ImageSpan


def cmd_generate(args: argparse.Namespace) -> int:
    import trio

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
    images: tuple[ImageSpan, ...] = ()
    if args.image and not args.chat:
        raise UsageError("--image goes through the chat template: add --chat")
    if args.chat:
        ids, images = _chat(eng, args)
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
                req = GenerationRequest("generate", ids, params, images=images)
                async with eng.submit(req) as handle:
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


def _chat(eng: LLMEngine, args: argparse.Namespace) -> tuple[list[int], tuple[ImageSpan, ...]]:
    """PROMPT as a user message after the --image images (each one's embeddings placed
    at its marker, as the server does); the ids and the images' spans."""
    from modelc.vision import no_vision

    pf = eng.prompt
    assert pf is not None
    msgs: list[dict[str, Any]] = [{"role": "system", "content": args.system}] if args.system else []
    parts = [{"type": "image", "data": _read(p)} for p in args.image]
    text = [{"type": "text", "text": args.prompt}]
    msgs.append({"role": "user", "content": [*parts, *text] if parts else args.prompt})
    chat = pf.chat(msgs)
    if not chat.images:
        return chat.ids, ()
    if eng.vision is None:
        raise no_vision(str(args.model))
    vision = eng.vision
    embeds = [vision.embed(d, f"--image {p}") for d, p in zip(chat.images, args.image, strict=True)]

    def encode(t: str) -> list[int]:
        return pf.tokenizer.encode(t, add_special=False, parse_special=True)

    placed = vision.place(chat.ids, chat.media, embeds, encode)
    return placed.ids, placed.images


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"--image {path}: {e.strerror or e}") from e


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
