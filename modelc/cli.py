"""The ``modelc`` command line: argument parsing, and printing what the library returns.

Each command is registered by a small ``add_<command>(sub)`` function that adds its
subparser and sets ``func`` (``(args) -> exit status``).  To add a command (``run``,
``generate``, ``bench`` ...), write such a function in your own module and list it as
``"module:function"`` in :data:`EXTENSIONS`, or append the function to :data:`COMMANDS`;
import heavy modules inside the command function, not at the top, so
``modelc --version`` stays fast.

Every :class:`~modelc.errors.ModelcError` is printed as one line
``modelc: error: <message>`` on stderr with exit status 2 (its ``exit_code``);
argparse usage errors also exit 2; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import modelc
from modelc.errors import ModelcError, TokenizerError, UsageError

if TYPE_CHECKING:
    from modelc.artifact import Artifact, PackOptions
    from modelc.config import Config
    from modelc.store import ModelEntry, Store

CommandFn = Callable[[argparse.Namespace], int]


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)


# ----------------------------------------------------------------------------- helpers
@functools.cache
def _config() -> Config:
    from modelc.config import load_config

    return load_config()


def _store() -> Store:
    from modelc.store import Store

    return Store(_config().store_dir)


def human_bytes(n: float) -> str:
    from modelc.artifact.inspect import human_bytes as hb  # lazy: keeps `modelc --version` fast

    return hb(n)


def human_count(n: int) -> str:
    from modelc.artifact.inspect import human_count as hc

    return hc(n)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    return "\n".join(lines)


def _tty() -> bool:
    return sys.stderr.isatty()


class _Bars:
    """Rich progress bars on stderr, one live display for all tasks of a command."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress

    def pack(self, label: str) -> Callable[[int, int, str], None]:
        task = self.progress.add_task(label, total=None)

        def update(done: int, total: int, name: str) -> None:
            self.progress.update(
                task, completed=done, total=total, description=f"{label} {name[:24]:24s}"
            )

        return update

    def download(self, label: str) -> Callable[[int, int | None], None]:
        task = self.progress.add_task(label, total=None)

        def update(done: int, total: int | None) -> None:
            self.progress.update(task, completed=done, total=total)

        return update


@contextmanager
def progress_bars() -> Iterator[_Bars | None]:
    """Progress bars when stderr is a terminal, else None (no output at all)."""
    if not _tty():
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as prog:
        yield _Bars(prog)


@contextmanager
def pack_progress(label: str) -> Iterator[Callable[[int, int, str], None] | None]:
    with progress_bars() as bars:
        yield bars.pack(label) if bars else None


def _pack_options(args: argparse.Namespace) -> PackOptions:
    from modelc.artifact import PackOptions

    cfg = _config().pack
    return PackOptions(
        compress=cfg.compress if args.compress is None else args.compress,
        compression_level=args.level if args.level is not None else cfg.compression_level,
        quantize=args.quantize if args.quantize is not None else cfg.quantize,
        prune=args.prune,
    )


# = modelc.artifact.format.QUANT_METHODS (kept here so building the parser imports no numpy)
QUANTIZE_CHOICES = ("fp16", "int8", "int4", "q8_0", "q4_0")


def _add_pack_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--compress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="zstd-compress each tensor (default from config)",
    )
    p.add_argument(
        "--level", type=int, default=None, metavar="N", help="zstd level 1..22 (default 3)"
    )
    p.add_argument(
        "--quantize",
        choices=list(QUANTIZE_CHOICES),
        default=None,
        help="quantize weight matrices (int4 is stored as GGML Q4_1 blocks)",
    )
    p.add_argument(
        "--prune",
        type=float,
        default=None,
        metavar="T",
        help="zero weights with |w| < T before quantizing",
    )


# ----------------------------------------------------------------------------- commands
def cmd_pack(args: argparse.Namespace) -> int:
    from modelc.artifact import is_artifact, load_artifact, write_artifact
    from modelc.formats import load_model
    from modelc.pull import derive_name
    from modelc.store import parse_ref

    src = Path(args.src)
    opts = _pack_options(args)
    opts.check()
    if args.output and args.name:
        raise UsageError("give either -o FILE or --name NAME, not both")
    if not args.output:
        parse_ref(args.name or derive_name(src))  # check the name before the slow part
    # a .modelc source is re-packed (e.g. to quantize or compress it)
    ir = load_artifact(src) if is_artifact(src) else load_model(src)
    with pack_progress(f"packing {src.name}") as prog:
        if args.output:
            out = Path(args.output)
            m = write_artifact(ir, out, opts, progress=prog)
            dest, label = out, str(out)
        else:
            ref = args.name or derive_name(src)
            dest = _store().add(ir, ref, opts, progress=prog)
            label = f"{parse_ref(ref)[0]}:{dest.name[: -len('.modelc')]}"
            from modelc.artifact import open_artifact

            art = open_artifact(dest)
            m = art.manifest
            art.close()
    print(
        f"packed {label}: {m.architecture}, {len(m.tensors)} tensors, {human_bytes(dest.stat().st_size)}"
    )
    return 0


def add_pack(sub: Any) -> None:
    p = sub.add_parser("pack", help="pack a model file or HF directory into a .modelc artifact")
    p.add_argument(
        "src", metavar="SRC", help="GGUF, safetensors, PyTorch .bin, ONNX file or HF directory"
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE.modelc",
        help="write this file instead of adding to the store",
    )
    p.add_argument(
        "--name", metavar="NAME[:VERSION]", help="store name (default: from the file name)"
    )
    _add_pack_flags(p)
    p.set_defaults(func=cmd_pack)


def cmd_pull(args: argparse.Namespace) -> int:
    from modelc.pull import pull

    with progress_bars() as bars:
        dprog = bars.download(f"pulling {args.model}") if bars else None
        pprog = bars.pack("packing") if bars else None
        ref, path = pull(
            args.model,
            _store(),
            name=args.name,
            sha256=args.sha256,
            opts=_pack_options(args),
            download_progress=dprog,
            pack_progress=pprog,
            quiet=True,
        )
    print(f"pulled {ref} ({human_bytes(path.stat().st_size)})")
    return 0


def add_pull(sub: Any) -> None:
    p = sub.add_parser("pull", help="download a catalog model or a URL into the store")
    p.add_argument("model", metavar="NAME|URL")
    p.add_argument(
        "--name", metavar="NAME[:VERSION]", help="store name (default: catalog name or file name)"
    )
    p.add_argument("--sha256", metavar="HEX", help="expected sha256 of the downloaded file")
    _add_pack_flags(p)
    p.set_defaults(func=cmd_pull)


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
    _print_entries(_store().list_models(), args.json)
    return 0


def add_list(sub: Any) -> None:
    p = sub.add_parser(
        "list", aliases=["ls"], help="list models in the store (* = current version)"
    )
    p.add_argument("--json", action="store_true")
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


def _resolve(arg: str) -> Path:
    from modelc.resolve import resolve_model

    with pack_progress(f"packing {Path(arg).name}") as prog:
        return resolve_model(arg, store=_store(), config=_config(), progress=prog, quiet=True)


def cmd_inspect(args: argparse.Namespace) -> int:
    from modelc.artifact import inspect as insp
    from modelc.artifact import open_artifact

    art: Artifact = open_artifact(_resolve(args.model))
    try:
        sampling = _sampling_defaults(art) if art.manifest.tokenizer is not None else None
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


def cmd_export(args: argparse.Namespace) -> int:
    from modelc.artifact import export_safetensors, load_artifact

    out = Path(args.output)
    if out.suffix != ".safetensors":
        raise UsageError(
            f"export writes safetensors: name the output *.safetensors, not {out.name!r}"
        )
    n = export_safetensors(load_artifact(_resolve(args.model)), out)
    print(f"exported {n} tensors to {out} ({human_bytes(out.stat().st_size)})")
    return 0


def add_export(sub: Any) -> None:
    p = sub.add_parser("export", help="write the weights (dequantized) to a .safetensors file")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("-o", "--output", required=True, metavar="OUT.safetensors")
    p.set_defaults(func=cmd_export)


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


def _commands(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Subcommand -> its option strings, for completion scripts."""
    out: dict[str, list[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sp in action.choices.items():
                out[name] = [o for a in sp._actions for o in a.option_strings]
    return out


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """A bash, zsh or fish script completing modelc's commands and their options."""
    cmds = _commands(parser)
    if shell == "fish":
        lines = ["complete -c modelc -f"]
        for c, opts in cmds.items():
            lines.append(f"complete -c modelc -n __fish_use_subcommand -a {c}")
            for o in opts:
                flag = f"-l {o[2:]}" if o.startswith("--") else f"-s {o[1:]}"
                lines.append(f"complete -c modelc -n '__fish_seen_subcommand_from {c}' {flag}")
        return "\n".join(lines)
    cases = "\n".join(f'        {c}) opts="{" ".join(o)}" ;;' for c, o in cmds.items())
    bash = f"""_modelc() {{
    local cur cmd opts
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W "{" ".join(cmds)} --version --help" -- "$cur"))
        return
    fi
    cmd="${{COMP_WORDS[1]}}"
    case "$cmd" in
{cases}
        *) opts="" ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -F _modelc modelc"""
    if shell == "zsh":
        return "autoload -U +X bashcompinit && bashcompinit\n" + bash
    return bash


def cmd_completions(args: argparse.Namespace) -> int:
    print(completion_script(build_parser(), args.shell))
    return 0


def add_completions(sub: Any) -> None:
    p = sub.add_parser("completions", help="print a shell completion script")
    p.add_argument("shell", choices=["bash", "zsh", "fish"])
    p.set_defaults(func=cmd_completions)


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
