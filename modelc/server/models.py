"""The models one server serves: loaded at start or on first use, unloaded when idle.

``modelc run A B`` serves A and B, each with its own engine (and KV budget) in its own
cancel scope of the server's nursery, loaded at start and kept loaded.  A request may
also name any model of the local store: it is loaded on first use and unloaded after
``keep_alive`` of idle time (Ollama's rule: 5 minutes by default, ``0`` unloads right
after the request, a negative value keeps it loaded; ``"10m"``, ``"1h30m"``, ``"45s"``
or a number of seconds).  A request's own ``keep_alive`` sets the model's expiry after
that request, for any model.

Every load is planned inside the server's memory budget (:mod:`modelc.server.memory`:
``--max-memory``, ``--max-loaded-models``, ``--max-context auto``): idle models are unloaded
for a new one, least recently used first; loads happen one at a time, so each is measured.

A model is routed by any of its names (:attr:`ModelSlot.aliases`: the id, the name on
the command line, ``--alias`` names, the store ref with and without ``:latest``, the
file name).  A request without a model goes to the first model of the command line.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

import trio

from modelc.engine.api import Engine
from modelc.engine.options import EngineOptions
from modelc.errors import ModelcError, ModelNotFoundError, UsageError
from modelc.hub import is_hub_ref, parse_hub_ref
from modelc.server import memory
from modelc.server.errors import LoadingError, MemoryBudgetError, ParamError
from modelc.server.logging import logger
from modelc.server.state import ModelInfo, load_model_info
from modelc.store import Store

DEFAULT_KEEP_ALIVE = 300.0  # seconds an on-demand model stays loaded after its last use
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def freeze_heap() -> None:
    """Keep the objects alive now (modules, the loaded models' tokenizers and weights'
    wrappers) out of the cyclic collector's reach: its full collections walked them all,
    up to 65 ms with the whole event loop stopped (a 32,000-token model, 64 streams:
    500 ms of collections in a 6 s run).  Called after each load; an unload lets them
    back in (:meth:`ModelRegistry.unload`)."""
    gc.collect()
    gc.freeze()


def parse_keep_alive(value: str | int | float | None) -> float | None:
    """Seconds to stay loaded after a request (math.inf: forever); None: not given."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return math.inf if value < 0 else float(value)
    v = value.strip()
    try:
        n = float(v)
        return math.inf if n < 0 else n
    except ValueError:
        pass
    if v.startswith("-"):
        return math.inf
    parts = _DURATION.findall(v)
    if not parts or "".join(a + u for a, u in parts) != v:
        raise ParamError(
            f'keep_alive {value!r} is not a duration; use e.g. 300, "5m", "1h30m", 0 (unload '
            "now) or -1 (keep loaded)",
            param="keep_alive",
        )
    return sum(float(a) * _UNIT[u] for a, u in parts)


@dataclass(eq=False)
class ModelSlot:
    """One servable model and its engine while loaded."""

    name: str  # the id responses report
    ref: str  # what the path resolves from (a command-line argument or a store ref)
    path: Path | None = None  # known for command-line models; store models resolve at load
    aliases: set[str] = field(default_factory=set)
    pinned: bool = False  # named on the command line (kept loaded; not removable over HTTP)
    default_keep_alive: float = DEFAULT_KEEP_ALIVE  # math.inf for a pinned model
    keep_alive: float = DEFAULT_KEEP_ALIVE  # now: a request's keep_alive lasts while loaded
    info: ModelInfo | None = None
    engine: Engine | None = None
    scope: trio.CancelScope | None = None
    loading: trio.Event | None = None
    error: ModelcError | None = None  # the last load failure
    active: int = 0  # requests using the engine now
    expires: float = math.inf  # trio.current_time() after which an idle slot unloads
    loaded_at: float = 0.0
    last_used: float = 0.0  # trio.current_time() of the last acquire or release
    cost: int = 0  # bytes of the memory budget it holds while loaded (modelc.server.memory)
    gpu_cost: int = 0  # bytes of the GPU's memory it holds while loaded
    stopped: trio.Event | None = None  # set once its engine's task has ended

    @property
    def loaded(self) -> bool:
        return self.engine is not None and self.info is not None

    def names(self) -> set[str]:
        """Every name a request may use: the id, aliases, the command-line argument (a
        file's name and stem too) and the store ref with and without ``:latest``."""
        out = {self.name, self.ref, *self.aliases}
        for n in list(out):
            if n.endswith(":latest"):
                out.add(n.removesuffix(":latest"))
            elif ":" not in n and "/" not in n:
                out.add(f"{n}:latest")
        if "/" in self.ref or Path(self.ref).suffix:  # a path: its file or directory name
            p = Path(self.ref.rstrip("/"))
            out |= {p.name, p.stem}
        return out


Need = Literal["text", "embed", "any"]
EngineFactory = Callable[[Path, str, EngineOptions], Engine]
MEMORY_WAIT = 300.0  # seconds a load waits for busy models to free memory, then 503


@dataclass(frozen=True, slots=True)
class MemoryLimits:
    """The server's memory budget (see :mod:`modelc.server.memory`)."""

    limit: int  # bytes for the whole process (--max-memory)
    max_loaded: int = 0  # models loaded at once; 0: as many as fit (--max-loaded-models)
    fit_context: bool = False  # --max-context auto
    gpu_limit: int = 0  # bytes of the GPU's memory for models (--max-gpu-memory); 0: no GPU


def default_limits() -> MemoryLimits:
    return MemoryLimits(int(memory.total_ram() * memory.DEFAULT_SHARE))


class ModelRegistry:
    """Every model the server knows; see the module docstring."""

    def __init__(
        self,
        slots: list[ModelSlot],
        options: EngineOptions,
        make_engine: EngineFactory,
        store: Store | None = None,
        announce: Callable[[str], None] | None = None,
        limits: MemoryLimits | None = None,
    ) -> None:
        if not slots:
            raise UsageError("no model to serve")
        self.slots = list(slots)
        self.options = options
        self.make_engine = make_engine
        self.store = store
        self.announce = announce or (lambda msg: None)  # a line for the operator
        self._nursery: trio.Nursery | None = None
        self.changed = trio.Event()  # set whenever a slot loads, unloads or is released
        self.started = False  # the command line's models have loaded (``/health``)
        self.limits = limits or default_limits()
        self.base = memory.rss()  # the process's own memory, measured again at run()
        self._load_lock = trio.Lock()  # one load at a time: each is planned and measured

    # -- lookup ----------------------------------------------------------------------
    @property
    def default(self) -> ModelSlot:
        return self.slots[0]

    def find(self, requested: str | None) -> ModelSlot | None:
        if not requested:
            return self.default
        for s in self.slots:
            if requested in s.names():
                return s
        return None

    def lookup(self, requested: str | None) -> ModelSlot:
        """The slot for ``requested`` (a new on-demand slot for a store model), or 404."""
        slot = self.find(requested)
        if slot is not None:
            return slot
        assert requested
        ref = parse_hub_ref(requested).store_ref if is_hub_ref(requested) else requested
        if self._in_store(ref):  # a Hub name (hf.co/USER/REPO:QUANT) is its pull's store ref
            slot = ModelSlot(requested, ref)
            self.slots.append(slot)
            return slot
        served = ", ".join(repr(s.name) for s in self.slots)
        raise ModelNotFoundError(
            f"the model {requested!r} is not served here and not in the local store; this "
            f"server serves {served} (see /v1/models; `modelc pull` or /api/pull adds a model)"
        )

    def _in_store(self, ref: str) -> bool:
        try:
            return self.store is not None and self.store.exists(ref)
        except ModelcError:  # not a valid store name
            return False

    def loaded(self) -> Iterator[ModelSlot]:
        return (s for s in self.slots if s.loaded)

    def listing(self) -> list[tuple[str, ModelInfo]]:
        """(name, facts) of every model a request may name: the served ones, then the
        store's (facts from the manifest for a model not loaded; no weights are read)."""
        out: list[tuple[str, ModelInfo]] = []
        seen: set[str] = set()
        for s in self.slots:
            info = s.info
            if info is None and s.path is not None:
                info = load_model_info(s.path, s.name)
            if info is not None:
                out.append((s.name, info))
                seen |= s.names()
        if self.store is not None:
            for e in self.store.list_models():
                if e.current and not e.error and e.name not in seen and e.ref not in seen:
                    try:
                        out.append((e.name, load_model_info(e.path, e.name)))
                    except ModelcError:  # unreadable: `modelc verify` says why
                        continue
        return out

    # -- use -------------------------------------------------------------------------
    async def acquire(self, requested: str | None, need: Need = "any") -> ModelSlot:
        """The loaded slot for ``requested`` (loading it first), counted as in use."""
        slot = self.lookup(requested)
        await self.ensure_loaded(slot)
        info = slot.info
        assert info is not None
        if need == "text" and not info.generates:
            raise ParamError(
                f"model {info.model_id!r} is a {info.architecture} model and does not generate "
                "text; name a llama or gpt2 model (e.g. smollm2-135m) for this endpoint",
                param="model",
            )
        if need == "embed" and not info.embeds:
            raise ParamError(
                f"model {info.model_id!r} is a {info.architecture} model; embeddings need an "
                "embedding model (e.g. minilm-l6)",
                param="model",
            )
        slot.active += 1
        slot.last_used = trio.current_time()
        return slot

    def release(self, slot: ModelSlot, keep_alive: float | None = None) -> None:
        """A request is done with ``slot``; it stays loaded ``keep_alive`` seconds more."""
        slot.active = max(0, slot.active - 1)
        if keep_alive is not None:  # until the model unloads (then its default again)
            slot.keep_alive = keep_alive
        slot.last_used = trio.current_time()
        slot.expires = slot.last_used + slot.keep_alive
        self.changed.set()

    async def ensure_loaded(self, slot: ModelSlot) -> None:
        while not slot.loaded:
            if slot.loading is None:
                if self._nursery is None:
                    raise LoadingError("the server is starting; retry in a moment (see /health)")
                slot.loading = trio.Event()
                slot.error = None
                self._nursery.start_soon(self._load, slot)
            event = slot.loading
            await event.wait()
            if slot.error is not None:
                raise slot.error

    async def path(self, slot: ModelSlot) -> Path:
        """The slot's artifact (a store model's current version, looked up once)."""
        if slot.path is None:
            if self.store is None:
                raise ModelNotFoundError(f"no file for model {slot.name!r}")
            slot.path = await trio.to_thread.run_sync(self.store.resolve, slot.ref)
        return slot.path

    async def _load(self, slot: ModelSlot) -> None:
        assert self._nursery is not None and slot.loading is not None
        done = slot.loading
        try:
            path = await self.path(slot)
            info = await trio.to_thread.run_sync(load_model_info, path, slot.name)
            async with self._load_lock:
                options, gpu_want, gpu_prefix = await self._make_room(slot, info)
                before, gpu_before = memory.rss(), self._gpu_free()
                engine = await trio.to_thread.run_sync(
                    partial(self.make_engine, path, slot.name, options)
                )
                # what the load took, and what the engine may still take: its KV budget
                # and prefix cache
                kv = engine.stats().kv_bytes_budget
                host_prefix = self._prefix_bytes(info) - gpu_prefix
                slot.cost = max(0, memory.rss() - before) + kv + host_prefix
                if gpu_before is not None:  # what its load took of the GPU (at least the
                    # estimate of what it reserves when all its layers went there) and
                    # the prefix blocks it may keep there
                    took = max(0, gpu_before - (self._gpu_free() or gpu_before)) + gpu_prefix
                    slot.gpu_cost = took if options.n_gpu_layers == "auto" else max(took, gpu_want)
            if options.max_context:
                info.n_ctx = min(info.n_ctx, options.max_context)
            info.prompt = engine.prompt  # one tokenizer, template and set of defaults
            slot.stopped = trio.Event()
            slot.scope = await self._nursery.start(self._run_engine, engine, slot.stopped)
            slot.info, slot.engine = info, engine
            slot.loaded_at = slot.last_used = trio.current_time()
            slot.expires = slot.loaded_at + slot.keep_alive
            logger().info("model_loaded", model=slot.name, path=str(slot.path), bytes=slot.cost)
            freeze_heap()
            self.announce(f"model {slot.name} ({info.architecture}) ready")
        except ModelcError as e:
            slot.error = e
        except Exception as e:  # a broken file must not take the server down
            logger().error("model_load_failed", model=slot.name, error=repr(e))
            slot.error = ModelcError(f"cannot load model {slot.name!r}: {type(e).__name__}: {e}")
        finally:
            slot.loading = None
            done.set()
            self.changed.set()

    def _gpu_free(self) -> int | None:
        """Free GPU memory now (None when the server has no GPU budget)."""
        if not self.limits.gpu_limit:
            return None
        from modelc.runtime.backends.cuda import gpu_memory

        got = gpu_memory()
        return None if got is None else got[0]

    def _gpu_need(self, info: ModelInfo, kv_default: int) -> int:
        """What the model would take of the GPU's memory (:func:`memory.gpu_need`): its
        weights (the layers ``--n-gpu-layers`` sends there, less the experts ``--n-cpu-moe``
        keeps on the CPU) and their KV, plus scratch; 0 without a GPU budget."""
        if not self.limits.gpu_limit or not info.generates:
            return 0
        return memory.gpu_need(
            info.file_size,
            info.kv_dims[0],
            kv_default,
            self.options.n_gpu_layers,
            expert_bytes=info.expert_bytes,
            n_cpu_moe=self.options.n_cpu_moe,
            ends_bytes=info.ends_bytes,
        )

    def _prefix_bytes(self, info: ModelInfo) -> int:
        return self.options.prefix_cache_bytes if info.generates else 0

    def _prefix_split(self, info: ModelInfo, gpu: int) -> tuple[int, int]:
        """The prefix cache's limit as (host bytes, GPU bytes) (:func:`memory.prefix_split`)."""
        from modelc.runtime.backends.cuda_kv import device_prefix

        return memory.prefix_split(
            self._prefix_bytes(info),
            gpu,
            self.options.n_gpu_layers,
            info.kv_dims[0],
            self.limits.gpu_limit,
            device_blocks=device_prefix(),
        )

    async def _make_room(self, slot: ModelSlot, info: ModelInfo) -> tuple[EngineOptions, int, int]:
        """Unload idle models until ``slot`` fits the budget (waiting for busy ones, at most
        MEMORY_WAIT seconds); its engine options, with the KV budget (and, with
        ``--max-context auto``, the context) fitted to the room it has, and the GPU memory
        it was planned to take (its prefix cache's blocks included, the last figure, where
        they stay there)."""
        opt, lim = self.options, self.limits
        n_ctx = min(info.n_ctx, opt.max_context or info.n_ctx)
        per_token = memory.kv_bytes_per_token(*info.kv_dims, opt.kv_cache, generates=info.generates)
        kv_default = opt.kv_budget_bytes
        if kv_default is None:
            kv_default = opt.max_concurrent * per_token * n_ctx
        gpu = self._gpu_need(info, kv_default)
        host_prefix, gpu_prefix = self._prefix_split(info, gpu)
        auto = opt.n_gpu_layers == "auto"
        need = memory.Need(
            info.file_size, per_token, kv_default, host_prefix, n_ctx, gpu + gpu_prefix, auto
        )
        with trio.move_on_after(MEMORY_WAIT):
            while True:
                loaded = [
                    memory.Loaded(s.name, s.cost, s.active > 0, s.pinned, s.last_used, s.gpu_cost)
                    for s in self.loaded()
                    if s is not slot
                ]
                step = memory.plan(
                    slot.name,
                    need,
                    loaded,
                    limit=lim.limit,
                    base=self.base,
                    max_loaded=lim.max_loaded,
                    fit_context=lim.fit_context,
                    gpu_limit=lim.gpu_limit,
                )
                if isinstance(step, memory.Refuse):
                    raise MemoryBudgetError(step.reason)
                if isinstance(step, memory.Plan):
                    break
                await trio.sleep(0.05)  # busy models hold the memory: wait for a release
        if not isinstance(step, memory.Plan):
            raise MemoryBudgetError(f"{step.reason}; gave up after {MEMORY_WAIT:.0f} s")
        for name in step.unload:
            victim = next(s for s in self.slots if s.name == name)
            self.announce(f"unloading {name} to make room for {slot.name}")
            stopped = victim.stopped
            self.unload(victim)
            if stopped is not None:
                await stopped.wait()  # its engine's task is gone: its memory can go
        if step.unload:
            await trio.to_thread.run_sync(memory.release_memory)
        if step.kv_budget is not None:
            opt = dataclasses.replace(opt, kv_budget_bytes=step.kv_budget)
        if step.n_ctx is not None:
            opt = dataclasses.replace(opt, max_context=step.n_ctx)
        return opt, gpu + gpu_prefix, gpu_prefix

    async def _run_engine(
        self,
        engine: Engine,
        stopped: trio.Event,
        *,
        task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The engine's task in a scope of its own: cancelling it unloads the model."""
        try:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as n:
                    await n.start(engine.run)
                    task_status.started(scope)
        finally:
            del engine
            stopped.set()

    def forget(self, slot: ModelSlot) -> None:
        """A store model was removed: unload it and drop its slot (not a command-line one)."""
        if slot.loaded:
            self.unload(slot)
        if not slot.pinned:
            self.slots.remove(slot)

    def unload(self, slot: ModelSlot) -> None:
        """Stop the slot's engine (its requests end) and forget it until the next use."""
        if slot.scope is not None:
            slot.scope.cancel()
        logger().info("model_unloaded", model=slot.name)
        self.announce(f"model {slot.name} unloaded")
        slot.scope = slot.info = slot.engine = None
        gc.unfreeze()  # what the model held may sit in reference cycles: collectable again
        slot.cost = 0
        slot.expires = math.inf
        slot.keep_alive = slot.default_keep_alive  # a request's keep_alive ends here
        self.changed.set()

    # -- the registry's own task ---------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load the command line's models, then unload idle ones as they expire."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.base = memory.rss()
            task_status.started()
            for s in list(self.slots):
                await self.ensure_loaded(s)  # a failure stops the server (one line)
            self.started = True
            while True:
                self.changed = trio.Event()
                now = trio.current_time()
                for s in self.slots:
                    if s.loaded and s.active == 0 and s.expires <= now:
                        self.unload(s)
                soonest = min(
                    (s.expires for s in self.slots if s.loaded and s.active == 0),
                    default=math.inf,
                )
                with trio.move_on_at(soonest):
                    await self.changed.wait()
