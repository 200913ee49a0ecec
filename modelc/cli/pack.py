"""``modelc pack``, ``pull`` and ``export``: model files into the store or a file, and back.

Registered in :data:`modelc.cli.COMMANDS`; heavy modules are imported inside the
command functions so building the parser stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelc.cli.args import add_options
from modelc.cli.common import _config, _resolve, _store, human_bytes, pack_progress, progress_bars
from modelc.errors import UsageError

if TYPE_CHECKING:
    from modelc.artifact import Manifest, PackOptions


def _pack_options(args: argparse.Namespace) -> PackOptions:
    from modelc.artifact import PackOptions

    cfg = _config().pack
    return PackOptions(
        compress=cfg.compress if args.compress is None else args.compress,
        compression_level=args.level if args.level is not None else cfg.compression_level,
        quantize=args.quantize if args.quantize is not None else cfg.quantize,
        prune=args.prune,
        imatrix=args.imatrix,
    )


def output_path(arg: str, default_name: str, suffix: str) -> Path:
    """Where ``-o ARG`` writes: ARG, or ``ARG/<default_name><suffix>`` if ARG is a directory.

    The directory must exist: a typo in ``-o`` should not create a tree of directories.
    """
    out = Path(arg).expanduser()
    if out.is_dir():
        return out / f"{default_name}{suffix}"
    where = out if arg.endswith("/") else out.parent
    if not where.is_dir():
        what = "is not a directory" if where.exists() else "does not exist"
        raise UsageError(
            f"output directory {where} {what}; create it first (mkdir -p {where}) "
            "or give another -o"
        )
    return out


def _pack_note(m: Manifest) -> str:
    p = m.pack
    if not p.requantized_tensors:
        return ""
    return f" ({p.requantized_tensors} tensors requantized from {', '.join(p.requantized_from)})"


def cmd_pack(args: argparse.Namespace) -> int:
    from modelc.artifact import is_artifact, load_artifact, open_artifact, write_artifact
    from modelc.formats import load_model
    from modelc.pull import derive_name
    from modelc.store import parse_ref

    src = Path(args.src)
    opts = _pack_options(args)
    opts.check()
    if args.output and args.name:
        raise UsageError("give either -o FILE or --name NAME, not both")
    out = output_path(args.output, derive_name(src), ".modelc") if args.output else None
    if out is None:
        parse_ref(args.name or derive_name(src))  # check the name before the slow part
    # a .modelc source is re-packed (e.g. to quantize or compress it)
    ir = load_artifact(src) if is_artifact(src) else load_model(src)
    with pack_progress(f"packing {src.name}") as prog:
        if out is not None:
            m = write_artifact(ir, out, opts, progress=prog)
            dest, label = out, str(out)
        else:
            ref = args.name or derive_name(src)
            dest = _store().add(ir, ref, opts, progress=prog)
            label = f"{parse_ref(ref)[0]}:{dest.name[: -len('.modelc')]}"
            art = open_artifact(dest)
            m = art.manifest
            art.close()
    print(
        f"packed {label}: {m.architecture}, {len(m.tensors)} tensors, "
        f"{human_bytes(dest.stat().st_size)}{_pack_note(m)}"
    )
    return 0


def add_pack(sub: Any) -> None:
    p = sub.add_parser("pack", help="pack a model file or HF directory into a .modelc artifact")
    p.add_argument(
        "src", metavar="SRC", help="GGUF, safetensors, PyTorch .bin, ONNX file or HF directory"
    )
    add_options(p, "pack")
    p.set_defaults(func=cmd_pack)


def cmd_pull(args: argparse.Namespace) -> int:
    from modelc.hub import is_hub_ref
    from modelc.pull import pull

    hub = is_hub_ref(args.model)  # a bar per file, added as each starts
    with progress_bars() as bars:
        dprog = bars.download(f"pulling {args.model}") if bars and not hub else None
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
            file_progress=bars.files() if bars and hub else None,
        )
    print(f"pulled {ref} ({human_bytes(path.stat().st_size)})")
    return 0


def add_pull(sub: Any) -> None:
    p = sub.add_parser(
        "pull", help="fetch a catalog model, a Hugging Face model or a URL into the store"
    )
    p.add_argument(
        "model",
        metavar="NAME|URL",
        help="a catalog name, hf.co/USER/REPO[:QUANT] (also huggingface.co/..., hf://...), "
        "or an http://, https:// or file:// URL",
    )
    add_options(p, "pull")
    p.set_defaults(func=cmd_pull)


def cmd_export(args: argparse.Namespace) -> int:
    from modelc.artifact import export_safetensors, load_artifact
    from modelc.pull import derive_name

    out = output_path(args.output, derive_name(args.model.replace(":", "-")), ".safetensors")
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
    add_options(p, "export")
    p.set_defaults(func=cmd_export)
