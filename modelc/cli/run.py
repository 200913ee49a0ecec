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
        ("--reasoning-budget", args.reasoning_budget, -1),
    ):
        if v < lo:
            raise UsageError(f"{flag} must be >= {lo}, got {v}")
    if args.port is not None and not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    fit_context = args.max_context == "auto"
    if fit_context:
        args.max_context = None  # each model's own, fitted to the budget at load
    engine = engine_options(args)
    limits = _limits(args, fit_context, engine)
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
        allow_image_urls=args.allow_image_urls,
        reasoning_budget=args.reasoning_budget,
        reasoning_budget_message=args.reasoning_budget_message or "",
        rate_limit=args.rate_limit,
        grace=args.grace,
        ping_interval=args.ping_interval,
        http_keep_alive=args.http_keep_alive,
        lora_dirs=[Path(d).expanduser() for d in args.lora_dir],
        engine=engine,
        limits=limits,
    )
    return serve(opts)


def _limits(args: argparse.Namespace, fit_context: bool, engine: Any) -> Any:
    """The server's memory budget from --max-memory / --max-loaded-models / --max-context
    auto, and on a GPU (``--device cuda``, or ``auto`` where CuPy sees one) from
    --max-gpu-memory."""
    from modelc.server.memory import parse_size
    from modelc.server.models import MemoryLimits, default_limits

    if args.max_loaded_models < 0:
        raise UsageError(f"--max-loaded-models must be >= 0, got {args.max_loaded_models}")
    limit = parse_size(args.max_memory) if args.max_memory else default_limits().limit
    gpu_limit = 0
    if engine.device in ("cuda", "auto") and engine.n_gpu_layers != 0:
        from modelc.runtime.backends.cuda import gpu_memory

        got = gpu_memory()
        if got is not None:
            free, total = got
            gpu_limit = free
            if args.max_gpu_memory:
                gpu_limit = parse_size(
                    args.max_gpu_memory, flag="--max-gpu-memory", of="the GPU", total=total
                )
    if args.max_gpu_memory and not gpu_limit:
        raise UsageError(
            "--max-gpu-memory needs a GPU the server computes on (--device cuda, or auto "
            "with CuPy and a GPU); this server runs on the CPU"
        )
    return MemoryLimits(limit, args.max_loaded_models, fit_context, gpu_limit)


def cmd_ps(args: argparse.Namespace) -> int:
    """The models a running server holds, as ``ollama ps`` shows them."""
    import datetime
    import json

    import httpx

    from modelc.cli.common import _config, human_bytes
    from modelc.net import ssl_context

    cfg = _config()
    url = (args.url or f"http://{cfg.server.host}:{cfg.server.port}").rstrip("/")
    try:
        r = httpx.get(f"{url}/api/ps", timeout=10, verify=ssl_context())
        r.raise_for_status()
    except httpx.HTTPError as e:
        raise UsageError(
            f"no modelc server answers at {url} ({e}); start one with `modelc run` or give --url"
        ) from e
    models = r.json()["models"]
    if args.json:
        print(json.dumps(models, indent=1))
        return 0
    rows = [("NAME", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL")]
    now = datetime.datetime.now(datetime.UTC)
    for m in models:
        until = datetime.datetime.fromisoformat(m["expires_at"])
        left = (until - now).total_seconds()
        when = (
            "Forever" if left > 100 * 365 * 86400 else f"{max(0, left) / 60:.0f} minutes from now"
        )
        rows.append(
            (
                m["name"],
                human_bytes(m["size"]),
                f"GPU {human_bytes(m['size_vram'])}" if m.get("size_vram") else "CPU",
                str(m.get("context_length", "")),
                when,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def register(subparsers: Any) -> None:
    """Add the ``run`` and ``ps`` subcommands to the main CLI's subparsers."""
    ps = subparsers.add_parser(
        "ps", help="the models a running server holds (memory, context, until when)"
    )
    add_options(ps, "ps")
    ps.set_defaults(func=cmd_ps)
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
