"""``modelc bench``: offline model benchmark, or ``--url`` load test of a running server.

Registered into the main CLI by ``register(subparsers)`` (``modelc.cli.EXTENSIONS``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from modelc.cli.args import add_options, sampling_given
from modelc.errors import UsageError


def _ints(flag: str, s: str) -> list[int]:
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError as e:
        raise UsageError(f"{flag} takes comma-separated integers, got {s!r}") from e
    if not vals or any(v < 1 for v in vals):
        raise UsageError(f"{flag} takes positive integers, got {s!r}")
    return vals


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.url:
        return _cmd_load(args)
    if not args.model:
        raise UsageError("give a MODEL to benchmark offline, or --url URL to load-test a server")
    if sampling_given(args):
        raise UsageError(
            "--temperature, --top-k, --top-p and --min-p set a load test's requests (--url); "
            "the offline benchmark times steps, not sampling"
        )
    from modelc.bench.offline import run_offline
    from modelc.bench.report import offline_table

    err = _console()
    with err.status("benchmarking") as status:
        res = run_offline(
            args.model,
            prompt_lens=_ints("--prompt-lens", args.prompt_lens),
            batches=_ints("--batches", args.batches),
            steps=args.steps,
            reps=args.reps,
            threads=args.threads,
            matmul=args.matmul,
            kv_cache=args.kv_cache or "f16",
            device=args.device or "cpu",
            n_gpu_layers="auto" if args.n_gpu_layers is None else args.n_gpu_layers,  # -ngl 0 too
            progress=lambda s: status.update(s),
            n_cpu_moe=args.n_cpu_moe or 0,
        )
    if args.json:
        sys.stdout.write(json.dumps(res.to_json(), indent=2) + "\n")
    else:
        from rich.console import Console

        Console().print(offline_table(res))
    return 0


def _check_plot(path: Path) -> None:
    """Fail now, not after the load test, if ``--plot`` cannot be drawn or written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot
    except ImportError as e:
        raise UsageError(
            f"--plot needs matplotlib, which cannot be imported ({e}); "
            "install it with: pip install 'modelc[bench]'"
        ) from e
    where = path.expanduser().parent
    if not where.is_dir():
        raise UsageError(f"--plot: directory {where} does not exist; create it first")


def _cmd_load(args: argparse.Namespace) -> int:
    if args.plot:
        _check_plot(Path(args.plot))
    import trio
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from modelc.bench.loadgen import RequestTrace, probe, run_load
    from modelc.bench.report import load_json, load_markdown, load_table, plot_load

    levels = _ints("--concurrency", args.concurrency)
    for flag, v in (
        ("--requests", args.requests),
        ("--prompt-len", args.prompt_len),
        ("--max-tokens", args.max_tokens),
    ):
        if v < 1:
            raise UsageError(f"{flag} must be >= 1, got {v}")
    listed = trio.run(probe, args.url)  # reachable? (one-line error, exit 2, if not)
    name = args.model_name or args.model or listed
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("errors {task.fields[errors]}"),
        TimeElapsedColumn(),
        console=_console(),
        transient=args.json or args.markdown,
    )
    tasks = {
        c: progress.add_task(f"concurrency {c}", total=args.requests, errors=0) for c in levels
    }
    errors = dict.fromkeys(levels, 0)

    def on_done(c: int, tr: RequestTrace) -> None:
        errors[c] += 0 if tr.ok else 1
        progress.update(tasks[c], advance=1, errors=errors[c])

    with progress:
        res = trio.run(
            lambda: run_load(
                args.url,
                concurrency=levels,
                requests=args.requests,
                prompt_len=args.prompt_len,
                max_tokens=args.max_tokens,
                model=name,
                chat=args.chat,
                timeout=args.timeout,
                on_done=on_done,
                turns=args.turns,
                header=args.conversation_header,
                sampling=sampling_given(args),
            )
        )
    if args.plot:
        plot_load(res, Path(args.plot))
    if args.json:
        sys.stdout.write(json.dumps(load_json(res), indent=2) + "\n")
    elif args.markdown:
        sys.stdout.write(load_markdown(res) + "\n")
    else:
        from rich.console import Console

        Console().print(load_table(res))
        if args.plot:
            sys.stderr.write(f"plot written to {args.plot}\n")
    for lv in res.levels:
        for e in lv.error_samples:
            sys.stderr.write(f"modelc bench: concurrency {lv.concurrency}: {e}\n")
    return 0


def register(subparsers: Any) -> None:
    """Add the ``bench`` subcommand to the main CLI's subparsers."""
    p = subparsers.add_parser(
        "bench", help="benchmark a model offline, or load-test a server with --url"
    )
    p.add_argument(
        "model", metavar="MODEL", nargs="?", default=None, help="model to measure offline"
    )
    add_options(p, "bench")
    p.set_defaults(func=cmd_bench)
