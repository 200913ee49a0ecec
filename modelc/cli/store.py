"""The store commands: ``list``, ``rm``, ``cp``, ``switch``, ``search``, and ``inspect``,
``verify``, ``tokenize`` (registered in :data:`modelc.cli.COMMANDS`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelc.cli.args import add_options
from modelc.cli.common import _config, _resolve, _store, _table, human_bytes, human_count
from modelc.errors import ModelcError, TokenizerError, UsageError

if TYPE_CHECKING:
    from modelc.artifact import Artifact
    from modelc.store import ModelEntry


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
    add_options(p, "list")
    p.set_defaults(func=cmd_list)


def cmd_rm(args: argparse.Namespace) -> int:
    for ref in _store().rm(args.model, force=args.force, all_versions=args.all):
        print(f"removed {ref}")
    return 0


def add_rm(sub: Any) -> None:
    p = sub.add_parser("rm", help="remove a model (NAME:VERSION removes one version)")
    p.add_argument("model", metavar="NAME[:VERSION]")
    add_options(p, "rm")
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
    add_options(p, "search")
    p.set_defaults(func=cmd_search)


def cmd_inspect(args: argparse.Namespace) -> int:
    from modelc.artifact import inspect as insp
    from modelc.artifact import open_artifact

    path = _resolve(args.model)
    art: Artifact = open_artifact(path)
    try:
        # sampling defaults mean something for a model that generates text
        generates = art.manifest.tokenizer is not None and not art.manifest.hparams.pooling
        sampling = _sampling_defaults(art) if generates else None
        if args.fit:
            print(_fit(args))
        elif args.readme:
            print(insp.model_card(art, args.model))
        elif args.quant_sizes:
            print(insp.quant_sizes_table(art))
        elif args.json:
            doc = insp.summary(art, args.model, tensors=args.tensors, sampling=sampling)
            if (vision := _vision(path)) is not None:
                doc["vision"] = vision
            print(json.dumps(doc, indent=2))
        else:
            print(insp.summary_text(art, args.model, tensors=args.tensors, sampling=sampling))
            if (vision := _vision(path)) is not None:
                print(
                    f"  vision         {vision['projector']} projector, {vision['layers']} "
                    f"layers {vision['width']} wide: {vision['images']} ({vision['file']})"
                )
    finally:
        art.close()
    return 0


def _vision(artifact: Path) -> dict[str, Any] | None:
    """The vision projector a pull kept beside the model, described (None: none)."""
    from modelc.store import mmproj_beside
    from modelc.vision.mmproj import load_mmproj

    side = mmproj_beside(artifact)
    if side is None:
        return None
    cfg = load_mmproj(side)[0]
    fixed = cfg.projector in ("gemma3", "idefics3")  # a size of their own, else the image's
    if cfg.projector == "gemma3":
        images = f"{cfg.image_size}px images as {cfg.tokens_per_image} tokens"
    elif cfg.projector == "idefics3":
        images = (
            f"images up to {cfg.longest_edge}px in {cfg.image_size}px tiles and the whole, "
            f"{cfg.tokens_per_image} tokens each"
        )
    else:
        square = cfg.patch_size * cfg.n_merge
        images = f"a token per {square}x{square} pixels of the resized image"
    return {
        "file": side.name,
        "projector": cfg.projector,
        "layers": cfg.n_layer,
        "width": cfg.width,
        "image_size": cfg.image_size,
        "tokens_per_image": cfg.tokens_per_image if fixed else None,
        "images": images,
    }


def _fit(args: argparse.Namespace) -> str:
    """``inspect --fit``: the memory plan ``modelc run`` would make for this model alone."""
    from modelc.engine.options import EngineOptions
    from modelc.server import memory
    from modelc.server.state import load_model_info

    info = load_model_info(_resolve(args.model), args.model)
    opt = EngineOptions()
    limit = memory.parse_size(args.max_memory or f"{memory.DEFAULT_SHARE * 100:g}%")
    per_token = memory.kv_bytes_per_token(*info.kv_dims, opt.kv_cache, generates=info.generates)
    kv = opt.max_concurrent * per_token * info.n_ctx
    prefix = opt.prefix_cache_bytes if info.generates else 0
    need = memory.Need(info.file_size, per_token, kv, prefix, info.n_ctx)
    step = memory.plan(info.model_id, need, [], limit=limit, base=memory.rss(), fit_context=True)
    rows = [
        ("memory budget", f"{human_bytes(limit)} (--max-memory; default 80% of the RAM)"),
        ("weights", f"{human_bytes(info.file_size)} (the file)"),
    ]
    if info.generates:
        rows += [
            ("KV per token", f"{human_bytes(per_token)} ({opt.kv_cache})"),
            ("prefix cache", human_bytes(prefix)),
            ("KV budget", f"{human_bytes(kv)} ({opt.max_concurrent} x {info.n_ctx} tokens)"),
        ]
    if isinstance(step, memory.Plan):
        if step.kv_budget is None:
            verdict = f"fits: {opt.max_concurrent} sequences of its {info.n_ctx} tokens at once"
        else:
            n = step.kv_budget // per_token if per_token else 0
            verdict = (
                f"KV budget fitted to {human_bytes(step.kv_budget)}: {n} tokens in all at once "
                f"(--max-context auto: {step.n_ctx} per sequence)"
            )
    else:
        verdict = f"does not fit: {step.reason}"
    rows.append(("modelc run", verdict))
    return "\n".join(f"{k:<14} {v}" for k, v in rows)


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
    add_options(p, "inspect")
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
    add_options(p, "verify")
    p.set_defaults(func=cmd_verify)


def cmd_tokenize(args: argparse.Namespace) -> int:
    from modelc.resolve import load_ir
    from modelc.runtime.tokenizer import Tokenizer

    ir = load_ir(args.model, store=_store(), config=_config())
    if ir.tokenizer is None:
        raise TokenizerError(f"{args.model} has no tokenizer")
    tok = Tokenizer(ir.tokenizer)
    for text in args.text:  # the model loads once for every TEXT
        print(json.dumps([int(i) for i in tok.encode(text, add_special=True)]))
    return 0


def add_tokenize(sub: Any) -> None:
    p = sub.add_parser(
        "tokenize", help="print the token ids of each TEXT as a JSON list, one a line"
    )
    p.add_argument("model", metavar="MODEL", help="any MODEL, or a (vocab-only) GGUF path")
    p.add_argument(
        "text",
        nargs="+",
        metavar="TEXT",
        help="each taken verbatim (no escape processing), even if it starts with '-'",
    )
    p.set_defaults(func=cmd_tokenize)
