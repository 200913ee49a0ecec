"""The ``modelc`` command line: argument parsing, and printing what the library returns.

Each command is registered by a small ``add_<command>(sub)`` function that adds its
subparser and sets ``func`` (``(args) -> exit status``).  To add a command (``run``,
``generate``, ``bench`` ...), write such a function in your own module and list it as
``"module:function"`` in :data:`EXTENSIONS`, or append the function to :data:`COMMANDS`;
import heavy modules inside the command function, not at the top, so
``modelc --version`` stays fast.  A command's options come from the one table in
:mod:`modelc.cli.options` (each option declared once, tagged with the commands that
take it); :mod:`modelc.cli.args` adds them to a parser and builds the engine's options
from parsed arguments.

The modules: the store commands (``list``, ``rm``, ``cp``, ``switch``, ``search``,
``inspect``, ``verify``, ``tokenize``) in :mod:`modelc.cli.store`; ``pack``/``pull``/
``export`` in :mod:`modelc.cli.pack`; ``run`` in :mod:`modelc.cli.run`; ``generate``,
``chat``, ``bench``, ``compile``, ``containerize``/``deploy`` each in its own module;
``completions`` in :mod:`modelc.cli.completions`; the helpers they share in
:mod:`modelc.cli.common`.

Every :class:`~modelc.errors.ModelcError` is printed as one line
``modelc: error: <message>`` on stderr with exit status 2 (its ``exit_code``);
argparse usage errors also exit 2; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import modelc
from modelc.cli.completions import add_completions
from modelc.cli.options import QUANTIZE_CHOICES
from modelc.cli.pack import add_export, add_pack, add_pull
from modelc.cli.store import (
    add_cp,
    add_inspect,
    add_list,
    add_rm,
    add_search,
    add_switch,
    add_tokenize,
    add_verify,
    cmd_tokenize,
)
from modelc.errors import ModelcError

__all__ = ["COMMANDS", "EXTENSIONS", "QUANTIZE_CHOICES", "Parser", "build_parser", "main"]

CommandFn = Callable[[argparse.Namespace], int]


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)


COMMANDS: list[Callable[[Any], None]] = [
    add_pack,
    add_pull,
    add_list,
    add_rm,
    add_cp,
    add_switch,
    add_search,
    add_inspect,
    add_verify,
    add_export,
    add_tokenize,
    add_completions,
]

# "module:function" registration functions of commands defined elsewhere (run, generate, bench)
EXTENSIONS: list[str] = [
    "modelc.cli.generate:register",
    "modelc.cli.run:register",
    "modelc.cli.bench:register",
    "modelc.cli.chat:register",
    "modelc.cli.compile:register",
    "modelc.cli.ship:register",
]


def build_parser() -> Parser:
    parser = Parser(prog="modelc", description="Pack, store, inspect and serve language models.")
    parser.add_argument("--version", action="version", version=f"modelc {modelc.__version__}")
    parser.set_defaults(root_parser=parser)  # `modelc completions` describes the whole parser
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub)
    for spec in EXTENSIONS:
        mod, _, fn = spec.partition(":")
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
            continue  # that command is not installed
        getattr(module, fn)(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbatim = len(argv) == 3 or (len(argv) > 3 and argv[2] != "--")
    if verbatim and argv[0] == "tokenize" and not argv[1].startswith("-"):
        # `tokenize MODEL TEXT...`: every TEXT verbatim, even "-x" or "--help" (argparse
        # would parse them); `tokenize MODEL -- TEXT...` goes through argparse
        args = argparse.Namespace(func=cmd_tokenize, model=argv[1], text=argv[2:])
    else:
        args = build_parser().parse_args(argv)
    func: CommandFn = args.func
    try:
        return func(args)
    except ModelcError as e:
        msg = " ".join(str(e).split("\n"))
        sys.stderr.write(f"modelc: error: {msg}\n")
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("modelc: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        sys.stderr.write(f"modelc: error: {e.strerror or e}{where}\n")
        return 2
