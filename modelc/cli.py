"""The ``modelc`` command line: argument parsing, and printing what the library returns.

Each command is registered by a small ``add_<command>(sub)`` function that adds its
subparser and sets ``func`` (``(args) -> exit status``).  To add a command (``run``,
``generate``, ``bench`` ...), write such a function in your own module and list it as
``"module:function"`` in :data:`EXTENSIONS`, or append the function to :data:`COMMANDS`;
import heavy modules inside the command function, not at the top, so
``modelc --version`` stays fast.  This module holds the store commands (``list``,
``rm``, ``cp``, ``switch``, ``search``), ``inspect``, ``verify`` and ``tokenize``;
``pack``/``pull``/``export`` are in :mod:`modelc.cli_pack`, ``completions`` in
:mod:`modelc.cli_completions`, and the helpers they share in :mod:`modelc.cli_common`.

Every :class:`~modelc.errors.ModelcError` is printed as one line
``modelc: error: <message>`` on stderr with exit status 2 (its ``exit_code``);
argparse usage errors also exit 2; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import modelc
from modelc.cli_common import (  # noqa: F401  (_config, _store, progress_bars: for cli_run)
    _config,
    _resolve,
    _store,
    _table,
    human_bytes,
    human_count,
    pack_progress,
    progress_bars,
)
from modelc.cli_completions import add_completions, completion_script  # noqa: F401
from modelc.cli_pack import QUANTIZE_CHOICES, add_export, add_pack, add_pull  # noqa: F401
from modelc.errors import ModelcError, TokenizerError, UsageError

if TYPE_CHECKING:
    from modelc.artifact import Artifact
    from modelc.store import ModelEntry

CommandFn = Callable[[argparse.Namespace], int]


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)


# ----------------------------------------------------------------------------- commands
def _entry_json(e: ModelEntry) -> dict[str, Any]:
    return {
        "name": e.name,
        "version": e.version,
        "current": e.current,
        "path": str(e.path),
        "architecture": e.architecture,
        "n_params": e.n_params,
        "size": e.size,
        "quantization": e.quantization,
        "compression": e.compression,
        "created": e.created,
        "error": e.error,
    }


def _print_entries(entries: list[ModelEntry], as_json: bool) -> None:
    if as_json:
        print(json.dumps([_entry_json(e) for e in entries], indent=2))
        return
    if not entries:
        print("no models", file=sys.stderr)
        return
    rows = [
        [
            e.name,
            e.version + (" *" if e.current else ""),
            e.architecture,
            human_count(e.n_params),
            human_bytes(e.size),
            e.quantization,
            e.compression,
        ]
        for e in entries
    ]
    print(_table(rows, ["NAME", "VERSION", "ARCH", "PARAMS", "SIZE", "QUANT", "COMPRESSION"]))


def cmd_list(args: argparse.Namespace) -> int:
    if args.names:
        for name in _store().names():
            print(name)
        return 0
    _print_entries(_store().list_models(), args.json)
    return 0


def add_list(sub: Any) -> None:
    p = sub.add_parser(
        "list", aliases=["ls"], help="list models in the store (* = current version)"
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true")
    g.add_argument(
        "--names", action="store_true", help="model names only, one a line (shell completion)"
    )
    p.set_defaults(func=cmd_list)


def cmd_rm(args: argparse.Namespace) -> int:
    for ref in _store().rm(args.model, force=args.force, all_versions=args.all):
        print(f"removed {ref}")
    return 0


def add_rm(sub: Any) -> None:
    p = sub.add_parser("rm", help="remove a model (NAME:VERSION removes one version)")
    p.add_argument("model", metavar="NAME[:VERSION]")
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--force", action="store_true", help="remove the model even if it has several versions"
    )
    g.add_argument("--all", action="store_true", help="remove every version of the model")
    p.set_defaults(func=cmd_rm)


def cmd_cp(args: argparse.Namespace) -> int:
    dest = _store().cp(args.src, args.dst)
    print(f"copied {args.src} -> {args.dst.split(':')[0]}:{dest.name[: -len('.modelc')]}")
    return 0


def add_cp(sub: Any) -> None:
    p = sub.add_parser("cp", help="copy a model to a new name or version")
    p.add_argument("src", metavar="SRC[:VERSION]")
    p.add_argument("dst", metavar="DST[:VERSION]")
    p.set_defaults(func=cmd_cp)


def cmd_switch(args: argparse.Namespace) -> int:
    _store().switch(args.name, args.version)
    print(f"{args.name} -> {args.version}")
    return 0


def add_switch(sub: Any) -> None:
    p = sub.add_parser("switch", help="make VERSION the current version of NAME")
    p.add_argument("name", metavar="NAME")
    p.add_argument("version", metavar="VERSION")
    p.set_defaults(func=cmd_switch)


def cmd_search(args: argparse.Namespace) -> int:
    _print_entries(_store().search(" ".join(args.query)), args.json)
    return 0


def add_search(sub: Any) -> None:
    p = sub.add_parser(
        "search",
        help="find models: name substring, architecture, arch:X, quant:X, >100M (params), <1GB (size)",
    )
    p.add_argument("query", nargs="+", metavar="QUERY")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_search)


def cmd_inspect(args: argparse.Namespace) -> int:
    from modelc.artifact import inspect as insp
    from modelc.artifact import open_artifact

    art: Artifact = open_artifact(_resolve(args.model))
    try:
        # sampling defaults mean something for a model that generates text
        generates = art.manifest.tokenizer is not None and not art.manifest.hparams.pooling
        sampling = _sampling_defaults(art) if generates else None
        if args.readme:
            print(insp.model_card(art, args.model))
        elif args.quant_sizes:
            print(insp.quant_sizes_table(art))
        elif args.json:
            doc = insp.summary(art, args.model, tensors=args.tensors, sampling=sampling)
            print(json.dumps(doc, indent=2))
        else:
            print(insp.summary_text(art, args.model, tensors=args.tensors, sampling=sampling))
    finally:
        art.close()
    return 0


def _sampling_defaults(art: Artifact) -> dict[str, Any]:
    """The sampling defaults ``modelc run`` would use for this model, with their sources."""
    from modelc.runtime.prompt import SamplingDefaults, model_sampling

    cfg = _config()
    m = art.manifest
    d = SamplingDefaults.resolve(
        model_sampling(m.generation, m.metadata),
        cfg.sampling.given(),
        max_tokens=cfg.sampling.max_tokens or SamplingDefaults.resolve().max_tokens,
    )
    return {**d.as_dict(), "sources": dict(d.origin)}


def add_inspect(sub: Any) -> None:
    p = sub.add_parser(
        "inspect", aliases=["show"], help="show a model's architecture, size, quantization ..."
    )
    p.add_argument("model", metavar="MODEL")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="machine-readable summary")
    g.add_argument("--readme", action="store_true", help="a markdown model card")
    g.add_argument(
        "--quant-sizes", action="store_true", help="sizes of the model in each quantization"
    )
    p.add_argument("--tensors", action="store_true", help="include the tensor table")
    p.set_defaults(func=cmd_inspect)


def cmd_verify(args: argparse.Namespace) -> int:
    from modelc.artifact import verify_artifact

    if args.all:
        if args.model:
            raise UsageError("give MODEL or --all, not both")
        results = _store().verify_all()
        bad = 0
        for ref, err in results:
            if err is None:
                print(f"ok {ref}")
            else:
                bad += 1
                print(f"FAILED {ref}: {err}")
        if bad:
            raise _VerifyFailed(f"{bad} of {len(results)} models failed verification")
        if not results:
            print("no models", file=sys.stderr)
        return 0
    if not args.model:
        raise UsageError("give MODEL or --all")
    rep = verify_artifact(_resolve(args.model))
    print(f"ok {args.model}: {rep.tensors} tensors, {human_bytes(rep.bytes_checked)} checked")
    return 0


class _VerifyFailed(ModelcError):
    pass


def add_verify(sub: Any) -> None:
    p = sub.add_parser("verify", help="check a model's header and every tensor checksum")
    p.add_argument("model", nargs="?", metavar="MODEL")
    p.add_argument("--all", action="store_true", help="verify every model in the store")
    p.set_defaults(func=cmd_verify)


def cmd_tokenize(args: argparse.Namespace) -> int:
    from modelc.resolve import load_ir
    from modelc.runtime.tokenizer import Tokenizer

    ir = load_ir(args.model, store=_store(), config=_config())
    if ir.tokenizer is None:
        raise TokenizerError(f"{args.model} has no tokenizer")
    ids = Tokenizer(ir.tokenizer).encode(args.text, add_special=True)
    print(json.dumps([int(i) for i in ids]))
    return 0


def add_tokenize(sub: Any) -> None:
    p = sub.add_parser("tokenize", help="print the token ids of TEXT as a JSON list")
    p.add_argument("model", metavar="MODEL", help="any MODEL, or a (vocab-only) GGUF path")
    p.add_argument(
        "text",
        metavar="TEXT",
        help="taken verbatim (no escape processing), even if it starts with '-'",
    )
    p.set_defaults(func=cmd_tokenize)


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
    "modelc.cli_generate:register",
    "modelc.cli_run:register",
    "modelc.cli_bench:register",
    "modelc.cli_chat:register",
    "modelc.cli_compile:register",
    "modelc.cli_ship:register",
]


def build_parser() -> Parser:
    parser = Parser(prog="modelc", description="Pack, store, inspect and serve language models.")
    parser.add_argument("--version", action="version", version=f"modelc {modelc.__version__}")
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
    if len(argv) == 3 and argv[0] == "tokenize" and not argv[1].startswith("-"):
        # `tokenize MODEL TEXT`: TEXT verbatim, even "-x" or "--help" (argparse would parse it)
        args = argparse.Namespace(func=cmd_tokenize, model=argv[1], text=argv[2])
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


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
