"""``modelc run``: Hypercorn serving the app, and the engine, in one trio nursery.

Life cycle: the HTTP server starts first (``/health`` answers 503 ``loading``), the
engine is built in a worker thread and started with ``nursery.start(engine.run)``,
then ``/health`` turns 200.  SIGINT/SIGTERM: ``/health`` says ``shutting down``,
Hypercorn stops accepting and gives running requests and streams ``grace`` seconds
to finish; then the engine is cancelled and the process exits 0.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from modelc.engine.api import Engine
from modelc.engine.options import EngineOptions
from modelc.runtime.model import TensorModel
from modelc.server import logging as slog
from modelc.server.app import create_app
from modelc.server.state import ServerState, load_model_info


@dataclass(slots=True)
class ServeOptions:
    model_path: Path
    model_id: str
    model_arg: str
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    rate_limit: int = 0
    grace: float = 30.0
    ping_interval: float = 10.0
    lora_dirs: list[Path] = field(default_factory=list)
    engine: EngineOptions = field(default_factory=EngineOptions)


def _say(msg: str) -> None:
    sys.stderr.write(f"modelc: {msg}\n")
    sys.stderr.flush()


async def _load(opts: ServeOptions, state: ServerState, nursery: trio.Nursery) -> None:
    from modelc.engine import build_engine

    info = await trio.to_thread.run_sync(load_model_info, opts.model_path, opts.model_id)
    engine: Engine
    if info.architecture == "mlp":  # arrays in, arrays out: /infer only
        engine = await trio.to_thread.run_sync(_tensor_engine, opts.model_path, opts.model_id)
    else:
        engine = await trio.to_thread.run_sync(
            partial(build_engine, opts.model_path, opts.engine, model_name=opts.model_id)
        )
    if opts.engine.max_context:
        info.n_ctx = min(info.n_ctx, opts.engine.max_context)
    info.prompt = engine.prompt  # one tokenizer, template and set of defaults: the engine's
    await nursery.start(engine.run)
    state.info, state.engine = info, engine
    _say(f"model {opts.model_id} ({info.architecture}) ready")


class _InFlight:
    """ASGI wrapper counting HTTP requests whose handler (or stream) is still running."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.in_flight = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


def _tensor_engine(path: Path, name: str) -> Engine:
    from modelc.artifact import load_artifact
    from modelc.runtime.arch import build
    from modelc.server.tensor import TensorEngine

    model = build(load_artifact(path))
    assert isinstance(model, TensorModel)
    return TensorEngine(model, name)


async def _signals(shutdown: trio.Event, state: ServerState, nursery: trio.Nursery) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for sig in signals:
            if shutdown.is_set():
                _say("second signal: stopping now")
                nursery.cancel_scope.cancel()
                return
            _say(f"{signal.Signals(sig).name}: finishing running requests, then exiting")
            state.draining = True
            shutdown.set()


async def serve_async(opts: ServeOptions) -> None:
    state = ServerState(
        model_arg=opts.model_arg,
        api_key=opts.api_key,
        rate_limit=opts.rate_limit,
        max_concurrent=opts.engine.max_concurrent,
        lora_dirs=list(opts.lora_dirs),
        ping_interval=opts.ping_interval,
    )
    app = create_app(state)
    cfg = HypercornConfig()
    host = f"[{opts.host}]" if ":" in opts.host else opts.host
    cfg.bind = [f"{host}:{opts.port}"]
    cfg.graceful_timeout = opts.grace
    cfg.accesslog = None
    cfg.errorlog = "-"
    cfg.loglevel = "WARNING"
    shutdown = trio.Event()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_signals, shutdown, state, nursery)

        async def http(task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
            with trio.CancelScope() as scope:
                http_scope.append(scope)
                await hypercorn_serve(
                    counted, cfg, shutdown_trigger=shutdown.wait, task_status=task_status
                )
            nursery.cancel_scope.cancel()  # streams are done (or out of grace): stop the engine

        async def drain() -> None:
            # Hypercorn keeps idle keep-alive connections open until its graceful timeout;
            # end as soon as no request is in flight instead.
            await shutdown.wait()
            with trio.move_on_after(opts.grace):
                while counted.in_flight:
                    await trio.sleep(0.05)
            http_scope[0].cancel()

        http_scope: list[trio.CancelScope] = []
        counted = _InFlight(app)
        nursery.start_soon(drain)
        binds = await nursery.start(http)
        for b in binds:
            _say(f"listening on {b}")
        nursery.start_soon(_load, opts, state, nursery)


def serve(opts: ServeOptions) -> int:
    """Run until SIGINT/SIGTERM; 0 after a clean shutdown."""
    from modelc.errors import ModelcError

    slog.configure()
    try:
        trio.run(serve_async, opts)
    except BaseExceptionGroup as eg:  # a load error surfaces as itself (one line, exit 2)
        match, _ = eg.split(ModelcError)
        if match is None:
            raise
        first: BaseException = match
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from eg
    _say("stopped")
    return 0
