"""``modelc run``: Hypercorn serving the app, and the engine, in one trio nursery.

Life cycle: the HTTP server starts first (``/health`` answers 503 ``loading``), the
models of the command line are loaded (each engine built in a worker thread and
started in a scope of its own, :mod:`modelc.server.models`), then ``/health`` turns
200.  SIGINT/SIGTERM: ``/health`` says ``shutting down``,
Hypercorn stops accepting and gives running requests and streams ``grace`` seconds
to finish; then the engine is cancelled and the process exits 0.
"""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from modelc.engine.api import Engine
from modelc.engine.options import EngineOptions
from modelc.errors import ModelcError, UsageError
from modelc.runtime.model import TensorModel
from modelc.server import keepalive
from modelc.server import logging as slog
from modelc.server.app import create_app
from modelc.server.models import MemoryLimits, ModelRegistry, ModelSlot
from modelc.server.state import ServerState, load_model_info
from modelc.store import Store


@dataclass(slots=True)
class ServedModel:
    """A model named on the command line: where it is and what it is called."""

    path: Path
    name: str  # the id in responses
    arg: str  # as given (a store name, catalog name or path)
    aliases: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ServeOptions:
    models: list[ServedModel]
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    rate_limit: int = 0
    grace: float = 30.0
    ping_interval: float = 10.0
    http_keep_alive: float = keepalive.DEFAULT_KEEP_ALIVE
    lora_dirs: list[Path] = field(default_factory=list)
    cors_origins: list[str] = field(default_factory=list)  # browser origins allowed; "*": any
    allow_image_urls: bool = False  # fetch http(s) image URLs (server.image_urls)
    reasoning_budget: int = -1  # tokens of thinking trace before its end is forced (-1: any)
    reasoning_budget_message: str = ""  # written before the forced end of the trace
    engine: EngineOptions = field(default_factory=EngineOptions)
    store_dir: Path | None = None  # models requests may load on demand
    limits: MemoryLimits | None = None  # the memory budget; default 80% of the RAM
    # (artifact path, model name, engine options) -> its engine; default make_engine
    engine_factory: Callable[[Path, str, EngineOptions], Engine] | None = None


def _say(msg: str) -> None:
    sys.stderr.write(f"modelc: {msg}\n")
    sys.stderr.flush()


def make_engine(path: Path, name: str, options: EngineOptions) -> Engine:
    """The engine for an artifact: the scheduler, or /infer's tensor engine for an MLP."""
    from modelc.engine import build_engine

    if load_model_info(path, name).architecture == "mlp":  # arrays in, arrays out
        return _tensor_engine(path, name)
    return build_engine(path, options, model_name=name)


def registry(opts: ServeOptions) -> ModelRegistry:
    """The command line's models (kept loaded) and the store's (loaded on demand)."""
    slots = [
        ModelSlot(
            m.name,
            m.arg,
            m.path,
            {m.arg, *m.aliases},
            pinned=True,
            default_keep_alive=math.inf,
            keep_alive=math.inf,
        )
        for m in opts.models
    ]
    store = Store(opts.store_dir) if opts.store_dir is not None else None
    make = opts.engine_factory or make_engine
    first = opts.models[0].name if opts.models else None

    def factory(path: Path, name: str, options: EngineOptions) -> Engine:
        if options.mmproj is not None and name != first:  # the first model's projector
            options = dataclasses.replace(options, mmproj=None)
        return make(path, name, options)

    return ModelRegistry(slots, opts.engine, factory, store, _say, opts.limits)


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
        models=registry(opts),
        api_key=opts.api_key,
        rate_limit=opts.rate_limit,
        max_concurrent=opts.engine.max_concurrent,
        lora_dirs=list(opts.lora_dirs),
        ping_interval=opts.ping_interval,
        cors_origins=list(opts.cors_origins),
        allow_image_urls=opts.allow_image_urls,
        reasoning_budget=opts.reasoning_budget,
        reasoning_budget_message=opts.reasoning_budget_message,
    )
    app = create_app(state)
    cfg = HypercornConfig()
    host = f"[{opts.host}]" if ":" in opts.host else opts.host
    cfg.bind = [f"{host}:{opts.port}"]
    cfg.graceful_timeout = opts.grace
    cfg.keep_alive_timeout = opts.http_keep_alive
    keepalive.install()
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
        await nursery.start(state.models.run)


def check_bind(host: str, port: int) -> None:
    """UsageError unless ``host:port`` can be listened on (checked before loading models)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise UsageError(f"--host {host!r} is not an address of this machine ({e})") from e
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as e:
            hint = "choose another --port" if e.errno == errno.EADDRINUSE else "check --host"
            raise UsageError(f"cannot listen on {host}:{port}: {e.strerror}; {hint}") from e


def serve(opts: ServeOptions) -> int:
    """Run until SIGINT/SIGTERM; 0 after a clean shutdown.  ``MODELC_SWITCH_INTERVAL_MS``
    (for measurements): Python's switch interval, the longest a thread waiting for the GIL
    (the step thread after each CUDA call) waits on one running Python (the event loop)."""
    slog.configure()
    if ms := os.environ.get("MODELC_SWITCH_INTERVAL_MS"):
        try:
            sys.setswitchinterval(float(ms) / 1000)
        except ValueError as e:
            raise UsageError(f"MODELC_SWITCH_INTERVAL_MS={ms!r}: give milliseconds > 0") from e
    try:
        trio.run(serve_async, opts)
    except BaseExceptionGroup as eg:  # a load error surfaces as itself (one line, exit 2)
        match, _ = eg.split((ModelcError, OSError))
        if match is None:
            raise
        first: BaseException = match
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        if isinstance(first, OSError):  # the port was taken between the check and the bind
            raise UsageError(f"cannot listen on {opts.host}:{opts.port}: {first}") from eg
        raise first from eg
    _say("stopped")
    return 0
