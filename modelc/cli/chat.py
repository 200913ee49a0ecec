"""``modelc chat MODEL``: an interactive chat in the terminal, as ``ollama run MODEL``.

Every turn goes the way ``modelc generate --chat`` goes: the engine's prompt format
renders the whole conversation (``pf.chat(messages).ids``), ``pf.defaults.params``
fills the sampling settings the user left out, and ``engine.submit`` streams the
answer.  The engine is built once and its scheduler runs for the whole session (so
its prefix cache makes each new turn cost only the new tokens).

Threads: the scheduler runs in one ``trio.run`` on a worker thread; the main thread
keeps the terminal, so ``input()`` with ``readline`` line editing and Ctrl-C behave as
usual: Ctrl-C at the prompt prints a hint, Ctrl-C during an answer cancels that
request (the engine drops it at its next step) and returns to the prompt.  With a
pipe on standard input the lines are read without a prompt and only the answers (and
any command output) are printed, so ``echo hi | modelc chat MODEL`` answers once.
The line protocol and the commands are in :mod:`modelc.cli.chat_session`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from modelc.cli.args import add_options, engine_options, sampling_given
from modelc.cli.common import standalone
from modelc.errors import TokenizerError, UsageError

if TYPE_CHECKING:
    from modelc.cli.chat_session import ChatState
    from modelc.cli.engine_thread import EngineThread
    from modelc.engine import LLMEngine

HINT = "Use Ctrl + d or /bye to exit."
HISTORY_LINES = 1000


def write(text: str) -> None:
    """Text to standard output at once (UTF-8, lone surrogates passed through)."""
    sys.stdout.flush()
    sys.stdout.buffer.write(text.encode("utf-8", "surrogatepass"))
    sys.stdout.buffer.flush()


def _build_engine(args: argparse.Namespace) -> LLMEngine:
    from modelc.engine import build_engine

    # one request at a time; one may wait while a cancelled one leaves the batch
    eng = build_engine(args.model, engine_options(args, max_concurrent=1, queue_size=1))
    if eng.lm is None or eng.prompt is None:
        raise TokenizerError(
            f"{args.model} is a {eng.architecture} model without a tokenizer or an LM head; "
            "it does not chat (use a llama or gpt2 model)"
        )
    return eng


def _pipe_reader(stream: TextIO) -> Callable[[str], str]:
    def read_line(prompt: str) -> str:
        line = stream.readline()
        if not line:
            raise EOFError
        return line.removesuffix("\n").removesuffix("\r")

    return read_line


def _history_file() -> Path:
    from modelc.config import modelc_home

    return modelc_home() / "chat_history"


def _load_history() -> Callable[[], None]:
    """Turn on readline (if this Python has it) with the saved input history; returns
    the function that saves it."""
    try:
        import readline
    except ImportError:
        return lambda: None
    path = _history_file()
    with contextlib.suppress(OSError):  # none yet
        readline.read_history_file(path)
    readline.set_history_length(HISTORY_LINES)

    def save() -> None:
        with contextlib.suppress(OSError):  # a read-only home: no history, no error
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)

    return save


def chat_loop(
    engine: EngineThread,
    state: ChatState,
    read_line: Callable[[str], str],
    *,
    interactive: bool,
) -> int:
    """Read entries and answer them until /bye or the end of input; the exit status."""
    from modelc.cli.chat_session import read_entry, run_command
    from modelc.engine.api import GenerationRequest

    pf = engine.engine.prompt
    assert pf is not None
    turns = 0
    while True:
        try:
            try:
                entry = read_entry(read_line)
            except EOFError:
                if interactive:
                    write("\n")
                return 0
            if entry is None:
                continue
            if entry.command:
                reply = run_command(entry.text, state, pf.defaults, pf.tokenizer.n_vocab)
                if reply.text:
                    write(reply.text + "\n")
                if reply.exit:
                    return 0
                continue
            turns += 1
            ids = pf.chat(state.messages(entry.text)).ids
            req = GenerationRequest(f"chat-{turns}", ids, state.params(pf.defaults))
            turn = engine.answer(req, write)
            if turn.refused is not None:
                raise turn.refused
            if turn.finish is not None and turn.finish.error:
                raise UsageError(f"generation failed: {turn.finish.error}")
            write("\n\n" if interactive else "\n")
            if not turn.interrupted:  # a stopped answer is dropped with its question
                state.add_turn(entry.text, "".join(turn.text))
        except KeyboardInterrupt:
            write(f"\n{HINT}\n")


def cmd_chat(args: argparse.Namespace) -> int:
    """``modelc chat``: build the engine, then chat until /bye or the end of input."""
    from modelc.cli.chat_session import ChatState
    from modelc.cli.engine_thread import EngineThread

    if args.max_tokens is not None and args.max_tokens < 0:
        raise UsageError(f"--max-tokens must be >= 0, got {args.max_tokens}")
    if args.temperature is not None and not args.temperature >= 0:
        raise UsageError(f"--temperature must be >= 0, got {args.temperature}")
    eng = _build_engine(args)
    assert eng.prompt is not None
    state = ChatState(system=args.system, seed=args.seed, max_tokens=args.max_tokens)
    state.sampling.update(sampling_given(args))
    interactive = sys.stdin.isatty()
    save_history = _load_history() if interactive else (lambda: None)
    runner = EngineThread(eng)
    runner.start()
    try:
        return chat_loop(
            runner,
            state,
            input if interactive else _pipe_reader(sys.stdin),
            interactive=interactive,
        )
    finally:
        runner.stop()
        save_history()


def register(subparsers: Any) -> None:
    """Add the ``chat`` subcommand to the main CLI's subparsers."""
    p = subparsers.add_parser("chat", help="chat with a model in the terminal (no server)")
    p.add_argument("model", metavar="MODEL", help="a model name, catalog name or model path")
    add_options(p, "chat")
    p.set_defaults(func=cmd_chat)


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(register, argv)


if __name__ == "__main__":
    sys.exit(main())
