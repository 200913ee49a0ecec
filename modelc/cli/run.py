"""``modelc run [MODEL ...]``: serve models over HTTP (OpenAI, native, llama.cpp and Ollama APIs).

Registered into the main CLI by ``register(subparsers)`` (``modelc.cli.EXTENSIONS``).
With no MODEL it serves the configured ``default_model`` (``smollm2-135m``); a catalog
name not yet in the store is pulled first, with a progress bar on a terminal.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from modelc.errors import UsageError


def _resolve(arg: str) -> Path:
    from modelc.catalog import CATALOG
    from modelc.cli.common import _config, _store, progress_bars
    from modelc.resolve import resolve_model

    store = _store()
    with progress_bars() as bars:
        if arg in CATALOG and not store.versions(arg) and not Path(arg).exists():
            from modelc.pull import pull

            dl = bars.download(f"pulling {arg}") if bars else None
            pk = bars.pack(f"packing {arg}") if bars else None
            _, path = pull(arg, store, download_progress=dl, pack_progress=pk)
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
    from modelc.engine.options import EngineOptions
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
    given = {
        "max_concurrent": args.max_concurrent,
        "queue_size": args.queue_size,
        "max_context": args.max_context,
        "kv_cache": args.kv_cache,
        "anchor_tokens": args.anchor_tokens,
        "prefill_chunk": args.prefill_chunk,
        "threads": args.threads,
        "device": args.device,
        "spec_gamma": args.spec_max,
        "spec_min_prompt": args.spec_min_prompt,
        "stream_interval": args.stream_interval,
    }
    engine = EngineOptions(**{k: v for k, v in given.items() if v is not None})
    engine.context_shift = args.context_shift
    engine.swa_full = args.swa_full
    engine.speculative = args.speculate != "off"
    engine.spec_adaptive = args.speculate == "auto"
    engine.sampling = cfg.sampling.given()
    max_tokens = args.max_tokens if args.max_tokens is not None else cfg.sampling.max_tokens
    if max_tokens is not None:
        engine.max_tokens = max_tokens
    engine.validate()
    if engine.device == "cuda":  # one line now, not a failed load later
        from modelc.runtime.backends.cuda import require_cuda

        require_cuda()
    if engine.device in ("webgpu", "metal"):  # likewise: a usable adapter, or one line
        from modelc.runtime.backends.webgpu_device import find_adapter

        find_adapter("Metal" if engine.device == "metal" else None)
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
    p.add_argument(
        "--alias",
        action="append",
        default=[],
        metavar="NAME[,NAME...]",
        help="names requests may use for a model (the first is the id responses report); "
        "one --alias per model, in order",
    )
    p.add_argument("--host", default=None, help="bind address (default from config: 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=None, help="port (default from config: 8080; 0 = any free port)"
    )
    p.add_argument(
        "--max-concurrent",
        type=int,
        default=None,
        metavar="N",
        help="sequences generating at once (engine default 8)",
    )
    p.add_argument(
        "--queue-size",
        type=int,
        default=None,
        metavar="N",
        help="requests waiting beyond those; more get 503 (engine default 64)",
    )
    p.add_argument(
        "--api-key", default=None, metavar="KEY", help="require 'Authorization: Bearer KEY'"
    )
    p.add_argument(
        "--rate-limit",
        type=int,
        default=0,
        metavar="N",
        help="at most N requests per minute per client address (0 = off)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="a request without max_tokens stops at the end of its turn or after N tokens "
        "(default 4096, or [sampling] max_tokens in config.toml)",
    )
    p.add_argument(
        "--max-context",
        type=int,
        default=None,
        metavar="N",
        help="tokens per sequence (default: the model's)",
    )
    p.add_argument(
        "--kv-cache",
        default=None,
        choices=["f32", "f16", "int8", "mixed"],
        help="KV-cache storage (default f16; f32 is exact, int8/mixed are smaller)",
    )
    p.add_argument(
        "--anchor-tokens",
        type=int,
        default=None,
        metavar="N",
        help="tokens kept at the start on a context shift",
    )
    p.add_argument(
        "--context-shift",
        action="store_true",
        help="drop old tokens instead of stopping at the context",
    )
    p.add_argument(
        "--swa-full",
        action="store_true",
        help="sliding-window layers keep every position in the KV cache (more memory; as llama.cpp's --swa-full)",
    )
    p.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        metavar="N",
        help="prompt tokens per sequence per step (0 = whole prompt)",
    )
    p.add_argument(
        "--threads", type=int, default=None, metavar="N", help="kernel threads (default: all cores)"
    )
    p.add_argument(
        "--speculate",
        default="auto",
        choices=["auto", "fixed", "off"],
        help="speculative decoding by prompt lookup: auto (default) drafts for prompts of "
        "--spec-min-prompt tokens or more, as many tokens as the measured acceptance makes "
        "worth verifying, none when it does not pay; fixed always drafts --spec-max tokens "
        "when the prompt has them; off never (a request can opt out with "
        '"speculative": false)',
    )
    p.add_argument(
        "--spec-max",
        type=int,
        default=None,
        metavar="N",
        help="longest draft verified in one step (default 8)",
    )
    p.add_argument(
        "--spec-min-prompt",
        type=int,
        default=None,
        metavar="N",
        help="auto: prompts shorter than N tokens never draft (default 128)",
    )
    p.add_argument(
        "--stream-interval",
        type=int,
        default=None,
        metavar="N",
        help="tokens a streamed response gets at a time (as vLLM's and SGLang's "
        "--stream-interval): 0 = auto (default): every token while fewer than 4 requests "
        "decode, every second token when more do, so a busy server spends its cores on "
        "the model rather than on writing frames; the first token always goes at once",
    )
    p.add_argument(
        "--device",
        default=None,
        metavar="auto|cpu|cuda|webgpu|metal",
        help="where the model computes: cuda (NVRTC kernels through CuPy), cpu, or auto "
        "(cuda when CuPy sees a GPU and the architecture runs there; default); webgpu "
        "(WGSL shaders through wgpu on a Metal/Vulkan/D3D12 adapter) or metal (the same, "
        "on a Metal adapter only)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds running streams get to finish on SIGINT/SIGTERM (30)",
    )
    p.add_argument(
        "--ping-interval",
        type=float,
        default=10.0,
        metavar="S",
        help="send an SSE ': ping' comment after S seconds without a token (10)",
    )
    p.add_argument(
        "--http-keep-alive",
        type=float,
        default=30.0,
        metavar="S",
        help="close a client's idle keep-alive connection after S seconds (30)",
    )
    p.add_argument(
        "--lora-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="allow /lora/load of adapters under DIR (repeatable)",
    )
    p.set_defaults(func=cmd_run)
