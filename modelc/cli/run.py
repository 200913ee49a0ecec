"""``modelc run [MODEL ...]``: serve models over HTTP (OpenAI, native, llama.cpp and Ollama APIs).

Registered into the main CLI by ``register(subparsers)`` (``modelc.cli.EXTENSIONS``).
With no MODEL it serves the configured ``default_model`` (``smollm2-135m``); a catalog
name or an ``hf.co/USER/REPO[:QUANT]`` name not yet in the store is pulled first, with
progress bars on a terminal.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from modelc.cli.args import add_options, engine_options
from modelc.errors import UsageError


def _resolve(arg: str) -> Path:
    from modelc.catalog import CATALOG
    from modelc.cli.common import _config, _store, progress_bars
    from modelc.hub import is_hub_ref, parse_hub_ref
    from modelc.resolve import resolve_model

    store = _store()
    with progress_bars() as bars:
        catalog = arg in CATALOG and not store.versions(arg) and not Path(arg).exists()
        if catalog or (is_hub_ref(arg) and not store.exists(parse_hub_ref(arg).store_ref)):
            from modelc.pull import pull

            dl = bars.download(f"pulling {arg}") if bars and catalog else None
            pk = bars.pack(f"packing {arg}") if bars else None
            fp = bars.files() if bars and not catalog else None
            _, path = pull(arg, store, download_progress=dl, pack_progress=pk, file_progress=fp)
            return path
        return resolve_model(
            arg,
            store=store,
            config=_config(),
            progress=bars.pack(f"packing {arg}") if bars else None,
        )


def _model_id(arg: str) -> str:
    p = Path(arg).expanduser()
    if p.exists():
        return p.stem if p.is_file() else p.name
    return arg


def cmd_run(args: argparse.Namespace) -> int:
    from modelc.cli.common import _config
    from modelc.server.serve import ServedModel, ServeOptions, check_bind, serve

    cfg = _config()
    args_models: list[str] = args.model or list(cfg.models) or [cfg.default_model]
    for flag, v, lo in (
        ("--rate-limit", args.rate_limit, 0),
        ("--grace", args.grace, 0),
        ("--ping-interval", args.ping_interval, 0.01),
        ("--http-keep-alive", args.http_keep_alive, 0.01),
    ):
        if v < lo:
            raise UsageError(f"{flag} must be >= {lo}, got {v}")
    if args.port is not None and not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    engine = engine_options(args)
    if len(args.alias) > len(args_models):
        raise UsageError(
            f"{len(args.alias)} --alias flags for {len(args_models)} model(s); give one "
            "--alias NAME[,NAME...] per model, in the models' order"
        )
    host = args.host or cfg.server.host
    port = cfg.server.port if args.port is None else args.port
    check_bind(host, port)  # before loading anything: a busy port is one line, at once
    models = []
    for k, arg in enumerate(args_models):
        aliases = [a for a in args.alias[k].split(",") if a] if k < len(args.alias) else []
        name = aliases[0] if aliases else _model_id(arg)
        models.append(ServedModel(_resolve(arg), name, arg, aliases))
    if len({m.name for m in models}) < len(models):
        raise UsageError("two models have the same name; give them --alias names")
    opts = ServeOptions(
        models=models,
        store_dir=cfg.store_dir,
        host=host,
        port=port,
        api_key=args.api_key,
        cors_origins=[o.strip() for o in (args.cors_origins or "").split(",") if o.strip()],
        rate_limit=args.rate_limit,
        grace=args.grace,
        ping_interval=args.ping_interval,
        http_keep_alive=args.http_keep_alive,
        lora_dirs=[Path(d).expanduser() for d in args.lora_dir],
        engine=engine,
    )
    return serve(opts)


def register(subparsers: Any) -> None:
    """Add the ``run`` subcommand to the main CLI's subparsers."""
    p = subparsers.add_parser("run", help="serve a model over HTTP (OpenAI / native / Ollama APIs)")
    p.add_argument(
        "model",
        metavar="MODEL",
        nargs="*",
        default=[],
        help="store names, catalog names or model paths, each served by its own engine "
        "(default: config models, else default_model); requests may also name any store model, "
        "loaded on first use",
    )
    add_options(p, "run")
    p.set_defaults(func=cmd_run)
