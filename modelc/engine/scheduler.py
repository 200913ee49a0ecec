"""The Trio scheduler: one task that owns every request from arrival to its last token.

``await nursery.start(engine.run)`` starts it.  ``engine.submit(req)`` (from any task
of the same Trio run) validates the request, compiles its constraint, looks up the
prefix cache and queues it in the :class:`~modelc.engine.policy.Policy`, or raises
at once (CapacityError: queue full; UsageError: bad prompt, constraint or
settings).  It returns a handle whose events arrive through a bounded memory
channel (bounded by the request's own ``max_tokens + 1`` events, so delivering
never blocks the loop on a slow reader).

Each loop iteration:

1. requests cancelled (``handle.cancel()``, the reader gone) or past their deadline
   leave: their KV cache is freed and they get their :class:`FinishEvent`;
2. running decoders get speculative drafts, and context limits are applied;
3. ``policy.schedule()`` plans the step; the step (prefix-cache loads, one batched
   ``model.forward``, constraint masks, sampling / draft verification, prefix-cache
   inserts) runs on the step thread (:mod:`~modelc.engine.step_thread`), one step at a
   time, started without yielding so responses are written while it computes;
4. back on the event loop the new tokens are detokenized, checked against stop
   tokens / stop strings / limits and delivered; ``policy.update`` closes the step.

A stop token (EOS/EOT in ``stop_token_ids``, or the end-of-generation token a
completed grammar allows) ends the request without a TokenEvent of its own; it is
counted in ``completion_tokens``.  Text held back for a possible stop string is
released in the FinishEvent.

A request cancelled while a step runs leaves right after it: its tokens from that
step are dropped.  Nothing else is stopped by it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import trio

from modelc.engine.api import (
    EngineStats,
    Event,
    FinishEvent,
    FinishReason,
    GenerationRequest,
    ProgressEvent,
    PromptEvent,
    TokenEvent,
)
from modelc.engine.constraints import ConstraintState, build_lltokenizer
from modelc.engine.options import AUTO_STREAM_BUSY, EngineOptions
from modelc.engine.output import TextOutput
from modelc.engine.policy import KVCost, Policy, ScheduledSeq, SeqResult, StepPlan, StepResult
from modelc.engine.prefix_cache import Block, PrefixCache
from modelc.engine.spec_control import SpecConfig, SpecController, StepCost
from modelc.engine.speculative import Drafter, MLPDraftWeights, make_drafter, verify
from modelc.engine.step_thread import StepThread
from modelc.errors import ModelcError, UnsupportedError, UsageError
from modelc.runtime.kv_cache import BLOCK, KVBudget, KVCache, KVMode, KVShape
from modelc.runtime.lora import (
    AppliedLora,
    apply_adapter,
    load_adapter,
    remove_adapter,
    scale_adapter,
)
from modelc.runtime.model import EmbeddingModel, LanguageModel, SeqChunk
from modelc.runtime.prompt import PromptFormat
from modelc.runtime.sampling import Sample, Sampler, token_logprobs


@dataclass(eq=False)
class _Request:
    req: GenerationRequest
    send: trio.MemorySendChannel[Event]
    tokens: list[int]  # prompt + generated; tokens[:cache.n] are in the KV cache
    prompt_len: int
    prompt_tokens: int  # as submitted (before any context shift)
    max_new: int  # generated tokens allowed (the request's max_tokens, or the default cap)
    stop_ids: frozenset[int]  # ids that end the request (end of generation + its own)
    sampler: Sampler
    submitted: float
    output: TextOutput
    constraint: ConstraintState | None = None
    drafter: Drafter | None = None
    spec: SpecController | None = None  # adaptive speculation (None: fixed or none)
    cache: KVCache | None = None
    prefix_blocks: list[Block] = field(default_factory=list)
    cached_tokens: int = 0
    prefix_inserted: bool = False
    prefix_loaded: bool = False
    shifted: bool = False  # a context shift happened: the KV no longer matches a fresh run
    draft: list[int] = field(default_factory=list)
    draft_match: int = 0  # how the drafter found it (prompt lookup: the n-gram length)
    completion: int = 0
    first_token_at: float | None = None
    spec_drafted: int = 0
    spec_accepted: int = 0
    cancelled: bool = False
    # the prompt's log-probabilities as prefill computes them (prompt_logprobs requests)
    prompt_lp: list[tuple[float, tuple[tuple[int, float], ...]]] = field(default_factory=list)
    prompt_lp_sent: bool = False
    stop_token: TokenEvent | None = None  # the end-of-generation token that ended it
    paused_at: float | None = None  # trio time its reader fell behind (see _pace)
    held: list[TokenEvent] = field(default_factory=list)  # tokens not handed out yet


class _Handle:
    """What ``submit`` returns: async-iterate the events; ``cancel()`` to stop early."""

    def __init__(
        self, request_id: str, recv: trio.MemoryReceiveChannel[Event], engine: LLMEngine
    ) -> None:
        self.request_id = request_id
        self._recv = recv
        self._engine = engine

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        async for ev in self._recv:
            yield ev
            if isinstance(ev, FinishEvent):
                return

    async def next_event(self) -> Event:
        return await self._recv.receive()

    def event_nowait(self) -> Event | None:
        try:
            return self._recv.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            return None

    def cancel(self) -> None:
        self._engine._cancel(self.request_id)

    async def __aenter__(self) -> _Handle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()
        self._recv.close()


def kv_shape(model: LanguageModel) -> KVShape:
    return model.new_cache(KVMode.F32, max_tokens=1).shape


def kv_cost_fn(
    model: LanguageModel,
    mode: KVMode,
    hot_window: int,
    max_context: int,
    chunk: int = BLOCK,
    *,
    full: bool = False,
) -> KVCost:
    """Bytes a cache of ``n`` tokens holds, fed at most ``chunk`` tokens a step.

    ``KVCache.nbytes_at``: storage grows in BLOCK-token steps (plus the dequantization
    scratch and fixed ring buffers of the quantized modes), except that a windowed layer
    of a sliding-window model stops at its window plus slack (about ``chunk`` more while
    a longer chunk is being fed); ``full``: every layer keeps every position (--swa-full).
    """
    probe = model.new_cache(KVMode.F32, max_tokens=max_context, full=full)  # its windows
    cache = KVCache(probe.shape, max_context, mode, hot_window=hot_window, windows=probe.bounded)

    def cost(n: int) -> int:
        return cache.nbytes_at(min(n, max_context), chunk)

    return cost


class LLMEngine:
    """The engine for a language model (or an embedding model: ``embed`` only)."""

    def __init__(
        self,
        model: LanguageModel | EmbeddingModel,
        prompt: PromptFormat | None,
        options: EngineOptions,
        *,
        model_name: str = "model",
        mlp_draft: MLPDraftWeights | None = None,
    ) -> None:
        options.validate()
        self.model = model
        self.prompt = prompt  # tokenizer, chat template, end-of-generation ids, defaults
        self.tok = prompt.tokenizer if prompt is not None else None
        self.opt = options
        self.model_name = model_name
        self.architecture = model.architecture
        self._lock = trio.Lock()  # one compute at a time (steps and embeddings)
        self._stepper = StepThread()
        self._reqs: dict[str, _Request] = {}
        self._wake = trio.Event()
        self._stats = EngineStats()
        self._lltok: Any = None
        # end-of-generation ids: end every request, and a grammar allows them once complete
        self._eog: frozenset[int] = prompt.eog_ids if prompt is not None else frozenset()
        self._mlp = mlp_draft
        self._running = False
        self._loras: list[AppliedLora] = []  # applied adapters, oldest first
        if not isinstance(model, LanguageModel):
            self.lm: LanguageModel | None = None
            return
        self.lm = model
        self.max_context = min(options.max_context or model.n_ctx, model.n_ctx)
        self.mode = KVMode(options.kv_cache)
        chunk = max(options.prefill_chunk or self.max_context, options.spec_gamma + 1)
        self.kv_cost = kv_cost_fn(
            model,
            self.mode,
            options.kv_hot_window,
            self.max_context,
            chunk,
            full=options.swa_full,
        )
        self.policy = Policy(
            max_concurrent=options.max_concurrent,
            queue_size=options.queue_size,
            max_context=self.max_context,
            step_tokens=options.step_tokens,
            prefill_chunk=options.prefill_chunk,
            kv_budget=options.kv_budget_bytes,
            kv_cost=self.kv_cost,
        )
        self.kv_budget = KVBudget(self.policy.kv_budget)
        # mixed caches would reload exact hot-window rows as dequantized ones: no sharing
        prefix_bytes = 0 if self.mode is KVMode.MIXED else options.prefix_cache_bytes
        self.prefix = PrefixCache(kv_shape(model), prefix_bytes, options.prefix_block_tokens)
        if options.speculative and options.draft == "mlp" and mlp_draft is None:
            raise UsageError("--draft mlp needs draft.* tensors in the model; this one has none")
        self.spec_config = SpecConfig(n_max=options.spec_gamma, min_prompt=options.spec_min_prompt)
        self.step_cost = StepCost()  # decode steps' time by rows fed, for the controllers
        self._n_dec = 1  # sequences decoding in the step being planned / run

    # -- the server's side ------------------------------------------------------------
    def stats(self) -> EngineStats:
        s = self._stats
        if self.lm is not None:
            s.running, s.waiting = len(self.policy.running), len(self.policy.waiting)
            s.kv_bytes_used, s.kv_bytes_budget = self.kv_budget.used, self.kv_budget.limit
            ps = self.prefix.stats
            s.prefix_cache_hits, s.prefix_cache_tokens = ps.hits, ps.hit_tokens
            s.extra.update(
                prefix_cache_bytes=self.prefix.bytes_used,
                prefix_cache_blocks=len(self.prefix.blocks),
                prefix_cache_evicted=ps.evicted_blocks,
                spec_acceptance=s.spec_accepted / s.spec_drafted if s.spec_drafted else 0.0,
                kv_cache=self.mode.value,
            )
        return s

    async def load_lora(self, path: Path, scale: float = 1.0) -> None:
        """Merge a PEFT adapter into the weights between two steps (hot swap)."""
        adapter = await trio.to_thread.run_sync(load_adapter, path)
        if scale != 1.0:
            adapter = scale_adapter(adapter, scale)
        async with self._lock:
            applied = await trio.to_thread.run_sync(apply_adapter, self.model, adapter)
            self._loras.append(applied)
            self._reweighted()

    async def unload_lora(self, path: str | None = None) -> None:
        """Remove one adapter (by path) or all of them, newest first; base weights come back exactly."""
        async with self._lock:
            keep = [a for a in self._loras if path is not None and a.adapter.path != path]
            if path is not None and len(keep) == len(self._loras):
                raise UsageError(f"no adapter {path} is loaded")
            # stacked adapters come off in reverse order: take off everything above the
            # target too, then put the kept ones back on
            for applied in reversed(self._loras):
                remove_adapter(self.model, applied)
            self._loras = []
            for applied in keep:
                self._loras.append(apply_adapter(self.model, applied.adapter))
            self._reweighted()

    def _reweighted(self) -> None:
        if self.lm is not None:
            self.prefix.salt = (
                b"lora:" + ",".join(f"{a.adapter.path}@{id(a)}" for a in self._loras).encode()
            )

    async def embed(
        self, batch: Sequence[Sequence[int]], *, normalize: bool | None = None
    ) -> np.ndarray[Any, Any]:
        if not isinstance(self.model, EmbeddingModel):
            raise UnsupportedError(
                f"{self.model_name} is a {self.architecture} language model; it makes no embeddings"
            )
        model = self.model
        async with self._lock:
            return await trio.to_thread.run_sync(partial(model.embed, batch, normalize=normalize))

    def submit(self, req: GenerationRequest) -> _Handle:
        """Queue ``req``; raises CapacityError / UsageError at once (see module docstring)."""
        if self.lm is None:
            raise UnsupportedError(
                f"{self.model_name} is a {self.architecture} model; it does not generate text"
            )
        if not self._running:
            raise UsageError("the engine is not running; start it with nursery.start(engine.run)")
        lm, p = self.lm, req.sampling
        prompt = [int(t) for t in req.prompt_ids]
        if not prompt:
            raise UsageError(
                "the prompt is empty (no tokens); give some text or a BOS token", param="prompt"
            )
        if min(prompt) < 0 or max(prompt) >= lm.n_vocab:
            raise UsageError(f"prompt token ids must be in 0..{lm.n_vocab - 1}", param="prompt")
        if req.request_id in self._reqs:
            raise UsageError(f"request id {req.request_id!r} is already in use")
        n_prompt = len(prompt)
        if n_prompt >= self.max_context:
            if not self.opt.context_shift:
                raise UsageError(
                    f"the prompt has {n_prompt} tokens but the context holds {self.max_context}; "
                    "shorten it or turn context shifting on",
                    param="prompt",
                )
            keep = min(self.opt.anchor_tokens, self.max_context // 4)
            prompt = prompt[:keep] + prompt[n_prompt - (self.max_context // 2 - keep) :]
        max_new = self._max_new(p.max_tokens, len(prompt))
        if req.ignore_eos:  # as llama.cpp: the end-of-generation ids are never sampled
            p = dataclasses.replace(p, banned_token_ids=sorted(self._eog | set(p.banned_token_ids)))
        sampler = Sampler(p, lm.n_vocab, prompt)
        constraint = None
        if req.constraint is not None:
            constraint = ConstraintState(self._llg_tokenizer(), req.constraint, lm.n_vocab)
        if max_new == 0:  # nothing to generate: finished before it starts
            send0, recv0 = trio.open_memory_channel[Event](1)
            send0.send_nowait(FinishEvent(FinishReason.LENGTH, prompt_tokens=n_prompt))
            send0.close()
            return _Handle(req.request_id, recv0, self)
        # prompt log-probabilities need every prompt row computed: no cached prefix
        blocks = self.prefix.match(prompt) if req.prompt_logprobs is None else []
        cached = min(len(blocks) * self.prefix.block_tokens, len(prompt) - 1)
        try:
            self.policy.add(req.request_id, len(prompt), max_new, cached)
        except ModelcError:
            self.prefix.release(blocks)
            raise
        # every token, a prompt event, progress events (one a prefill chunk at most) and the
        # finish event fit: delivering never blocks
        chunks = -(-len(prompt) // max(self.opt.prefill_chunk, 1)) + 1 if req.progress else 0
        send, recv = trio.open_memory_channel[Event](max_new + 3 + chunks)
        use_spec = (
            self.opt.speculative
            and req.speculative
            and constraint is None
            and req.prompt_logprobs is None
            and self.opt.spec_gamma > 0
        )
        spec = SpecController(self.spec_config, len(prompt)) if self.opt.spec_adaptive else None
        # the controller's choices follow measured step times, and with sampling the
        # draft lengths decide how the RNG is used: a seeded request must repeat, so it
        # does not draft (greedy output is the same whatever the drafts)
        seeded = p.temperature > 0 and p.seed is not None
        if spec is not None and (not spec.enabled or seeded):
            use_spec = False
        r = _Request(
            req,
            send,
            prompt,
            len(prompt),
            n_prompt,
            max_new,
            frozenset() if req.ignore_eos else self._eog | frozenset(p.stop_token_ids),
            sampler,
            trio.current_time(),
            TextOutput(self.tok.incremental_decoder() if self.tok is not None else None, p.stop),
            constraint=constraint,
            drafter=make_drafter(self.opt.draft, self._mlp) if use_spec else None,
            spec=spec if use_spec else None,
            prefix_blocks=blocks,
            cached_tokens=cached,
        )
        self._reqs[req.request_id] = r
        self._stats.prompt_tokens += n_prompt
        self._wake.set()
        return _Handle(req.request_id, recv, self)

    def _llg_tokenizer(self) -> Any:
        if self._lltok is None:
            if self.tok is None or self.lm is None:
                raise UnsupportedError("constrained decoding needs the model's tokenizer")
            self._lltok = build_lltokenizer(self.tok, self.lm.n_vocab, set(self._eog))
        return self._lltok

    def _max_new(self, requested: int | None, n_prompt: int) -> int:
        """Tokens a request may generate: its max_tokens, else the default cap, within the
        context (unless the context shifts)."""
        cap = self.prompt.defaults.max_tokens if self.prompt is not None else self.opt.max_tokens
        n = cap if requested is None else requested
        if n < 0:
            raise UsageError(f"max_tokens must be >= 0, got {n}", param="max_tokens")
        # the last token is sampled, never fed: a full context yields one more
        return n if self.opt.context_shift else min(n, self.max_context - n_prompt + 1)

    def _cancel(self, request_id: str) -> None:
        r = self._reqs.get(request_id)
        if r is not None:
            r.cancelled = True
            self._wake.set()

    # -- the loop ---------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The scheduler task: ``await nursery.start(engine.run)``; runs until cancelled."""
        self._running = True
        task_status.started()
        try:
            while True:
                # no yield here: the step below starts before the readers its last tokens
                # woke run (they write while it computes); each step and each idle wait
                # is a checkpoint of its own
                await trio.lowlevel.checkpoint_if_cancelled()
                self._reap()
                plan = StepPlan(())
                if self.lm is not None and self.policy.has_work:
                    self._prepare()
                    plan = self.policy.schedule()
                if not plan:
                    await self._idle()
                    continue
                try:
                    out = await self._step(plan)
                except Exception as e:  # a failed step ends its requests, not the engine
                    msg = str(e) if isinstance(e, ModelcError) else f"{type(e).__name__}: {e}"
                    for s in plan.seqs:
                        self._finish(s.request_id, FinishReason.ERROR, error=msg)
                    continue
                self._deliver(plan, out)
        finally:
            self._running = False
            self._stepper.close()
            for rid in list(self._reqs):
                self._finish(rid, FinishReason.ERROR, error="the engine stopped")

    async def _step(self, plan: StepPlan) -> list[list[Sample] | ModelcError]:
        """Run ``plan`` on the step thread, holding the compute lock; neither starting it
        nor taking a free lock yields to other tasks."""
        if self._lock.locked():  # a LoRA swap or an embedding batch is computing
            await self._lock.acquire()
        else:
            self._lock.acquire_nowait()
        try:
            return await self._stepper.run(self._step_sync, plan)
        finally:
            self._lock.release()

    async def _idle(self) -> None:
        deadlines = [r.req.deadline for r in self._reqs.values() if r.req.deadline is not None]
        if any(r.paused_at is not None for r in self._reqs.values()):
            deadlines.append(trio.current_time() + 0.05)  # see whether the readers caught up
        self._wake = trio.Event()
        with trio.move_on_at(min(deadlines, default=math.inf)):
            await self._wake.wait()

    def _pace(self, rid: str, r: _Request) -> bool:
        """Pause a decoder whose reader fell ``max_unread`` events behind (no compute while
        nobody reads), resume it when the reader catches up, cancel it after
        ``stall_timeout`` paused.  False if the request ended."""
        behind = r.send.statistics().current_buffer_used >= self.opt.max_unread
        now = trio.current_time()
        if behind and r.paused_at is None:
            r.paused_at = now
            self.policy.pause(rid, True)
        elif not behind and r.paused_at is not None:
            r.paused_at = None
            self.policy.pause(rid, False)
        if r.paused_at is not None and now - r.paused_at >= self.opt.stall_timeout:
            self._finish(rid, FinishReason.CANCELLED, error="the client stopped reading")
            return False
        return True

    def _reap(self) -> None:
        now = trio.current_time()
        for rid, r in list(self._reqs.items()):
            if r.cancelled:
                self._finish(rid, FinishReason.CANCELLED)
            elif r.req.deadline is not None and now >= r.req.deadline:
                self._finish(rid, FinishReason.TIMEOUT)

    def _prepare(self) -> None:
        """Context limits and speculative drafts of the running decoders."""
        lm, gamma = self.lm, self.opt.spec_gamma
        assert lm is not None
        # rows of this step's decodes before drafts (each controller weighs its draft
        # against the time it adds to all of them)
        n_dec = sum(1 for st in self.policy.running.values() if not st.prefilling and not st.paused)
        self._n_dec = max(n_dec, 1)
        for rid, st in list(self.policy.running.items()):
            r = self._reqs[rid]
            if st.prefilling or r.cache is None:
                continue
            if not self._pace(rid, r) or r.paused_at is not None:
                continue
            if len(r.tokens) > self.max_context:  # the next decode would not fit
                if not self.opt.context_shift:
                    self._finish(rid, FinishReason.LENGTH)
                    continue
                keep = min(self.opt.anchor_tokens, r.cache.n - 1)
                # a windowed layer must still hold what its window reaches after the shift
                discard = min(max(1, (r.cache.n - keep) // 2), r.cache.max_discard(keep))
                if discard < 1:
                    self._finish(rid, FinishReason.LENGTH)
                    continue
                lm.shift_context(r.cache, keep, discard)
                del r.tokens[keep : keep + discard]
                if r.drafter is not None:  # its index held the dropped tokens
                    r.drafter = make_drafter(self.opt.draft, self._mlp)
                self.policy.shifted(rid, discard)
                r.shifted = True
            r.draft = []
            if r.drafter is not None and len(self.policy.running) <= self.opt.spec_max_running:
                room = min(
                    gamma,
                    r.max_new - r.completion - 1,
                    self.max_context - len(r.tokens),
                )
                if room > 0:
                    draft, r.draft_match = r.drafter.lookup(r.tokens, room)
                    k = len(draft)
                    if r.spec is not None:
                        k = r.spec.draft_len(r.draft_match, k, self._cost_fn(n_dec), n_dec)
                    r.draft = draft[: min(k, room)]
                self.policy.set_draft(rid, len(r.draft))

    def _cost_fn(self, rows: int) -> Callable[[int], float]:
        per_row = self.step_cost.per_row(rows)  # one fit per step, not one per k tried
        return lambda k: 1.0 + per_row * k

    def _step_sync(self, plan: StepPlan) -> list[list[Sample] | ModelcError]:
        """Worker thread: one batched forward and the sampling it feeds; a decode-only
        step's time goes to ``step_cost``."""
        t0 = time.perf_counter()
        out = self._step_compute(plan)
        decode_only = all(
            s.sample and not s.admitted and s.n_tokens - s.n_draft == 1 for s in plan.seqs
        )
        if decode_only:
            self.step_cost.observe(plan.n_tokens, time.perf_counter() - t0)
        return out

    def _step_compute(self, plan: StepPlan) -> list[list[Sample] | ModelcError]:
        lm = self.lm
        assert lm is not None
        batch, reqs = [], []
        for s in plan.seqs:
            r = self._reqs[s.request_id]
            if s.admitted:
                r.cache = lm.new_cache(
                    self.mode,
                    max_tokens=self.max_context,
                    hot_window=self.opt.kv_hot_window,
                    budget=self.kv_budget,
                    full=self.opt.swa_full,
                )
                self.prefix.load(
                    r.prefix_blocks[: r.cached_tokens // self.prefix.block_tokens], r.cache
                )
                self.prefix.release(r.prefix_blocks)
                r.prefix_blocks = []
                r.prefix_loaded = True
            assert r.cache is not None and r.cache.n == s.start, (s, r.cache and r.cache.n)
            feed = r.tokens[s.start : s.start + s.n_tokens - s.n_draft] + r.draft[: s.n_draft]
            rows = tuple(range(len(feed) - s.n_draft - 1, len(feed))) if s.sample else ()
            if r.req.prompt_logprobs is not None and s.start < r.prompt_len:
                rows = tuple(range(len(feed)))  # every prompt row's next-token logits
            batch.append(SeqChunk(r.cache, feed, rows))
            reqs.append(r)
        logits = lm.forward(batch)  # (sum of rows, n_vocab)
        out: list[list[Sample] | ModelcError] = []
        row = 0
        for s, r, chunk in zip(plan.seqs, reqs, batch, strict=True):
            assert r.cache is not None
            if not r.prefix_inserted and r.cache.n >= r.prompt_len:
                self.prefix.insert(r.tokens[: r.prompt_len], r.cache)
                r.prefix_inserted = True
            mine = logits[row : row + len(chunk.rows())]
            row += len(chunk.rows())
            if r.req.prompt_logprobs is not None and s.start < r.prompt_len:
                n = min(len(mine), r.prompt_len - 1 - s.start)  # rows predicting prompt tokens
                nxt = r.tokens[s.start + 1 : s.start + 1 + n]
                r.prompt_lp += token_logprobs(mine[:n], nxt, r.req.prompt_logprobs)
            if not s.sample:
                out.append([])
                continue
            try:
                out.append(self._sample(r, s, mine))
            except ModelcError as e:  # this request's constraint / sampler failed: it alone ends
                out.append(e)
        return out

    def _sample(self, r: _Request, s: ScheduledSeq, logits: np.ndarray[Any, Any]) -> list[Sample]:
        assert r.cache is not None
        if s.n_draft:
            samples = verify(r.sampler, logits, r.draft[: s.n_draft])
            # keep the KV of the known token and the accepted drafts only
            r.cache.truncate(s.start + s.n_tokens - s.n_draft + len(samples) - 1)
            r.spec_drafted += s.n_draft
            r.spec_accepted += len(samples) - 1
            if r.spec is not None:
                n_dec = self._n_dec
                r.spec.update(
                    r.draft_match, s.n_draft, len(samples) - 1, self._cost_fn(n_dec), n_dec
                )
            return samples
        x = logits[-1]
        if r.constraint is not None:
            x = x.copy()  # masked in place
            r.constraint.mask(x)
        smp = r.sampler.sample(x)
        r.sampler.accept(smp.token)
        if r.constraint is not None:
            r.constraint.accept(smp.token)
        return [smp]

    def _deliver(self, plan: StepPlan, out: list[list[Sample] | ModelcError]) -> None:
        results = []
        now = trio.current_time()
        interval = self.opt.stream_interval or (1 if self._n_dec < AUTO_STREAM_BUSY else 2)
        for s, samples in zip(plan.seqs, out, strict=True):
            r = self._reqs.get(s.request_id)
            if r is None or r.cache is None:
                continue
            if r.cancelled:
                self._finish(s.request_id, FinishReason.CANCELLED)
                continue
            if isinstance(samples, ModelcError):
                self._finish(s.request_id, FinishReason.ERROR, error=str(samples))
                continue
            self._stats.spec_drafted += s.n_draft
            self._stats.spec_accepted += max(0, len(samples) - 1) if s.n_draft else 0
            if r.req.progress and s.start < r.prompt_len:
                done = min(r.cache.n, r.prompt_len)
                self._send(
                    r, ProgressEvent(done, r.prompt_tokens, r.cached_tokens, now - r.submitted)
                )
            if r.req.prompt_logprobs is not None and samples and not r.prompt_lp_sent:
                r.prompt_lp_sent = True
                lps = (None, *(lp for lp, _ in r.prompt_lp))
                self._send(r, PromptEvent(lps, ((), *(top for _, top in r.prompt_lp))))
            reason = None
            for smp in samples:
                reason = self._emit(r, smp, now)
                if reason is not None:
                    break
            if reason is not None:
                self._finish(s.request_id, reason)
                continue
            # none handed out yet (every generated token held): the first goes at once
            if r.held and (len(r.held) >= interval or len(r.held) == r.completion):
                self._release(r)
            results.append(SeqResult(s.request_id, r.cache.n, len(samples)))
        self.policy.update(StepResult(tuple(results)))
        self._stats.steps += 1
        self._stats.last_batch_size = len(plan.seqs)

    def _emit(self, r: _Request, smp: Sample, now: float) -> FinishReason | None:
        """Deliver one token; the finish reason if it ends the request."""
        tok = smp.token
        r.tokens.append(tok)
        r.completion += 1
        self._stats.tokens_generated += 1
        if r.first_token_at is None:
            r.first_token_at = now
        grammar_eos = r.constraint is not None and r.constraint.done and tok in self._eog
        if grammar_eos or tok in r.stop_ids:
            lp = None if math.isnan(smp.logprob) else smp.logprob
            r.stop_token = TokenEvent(tok, "", lp, smp.top)
            return FinishReason.STOP
        text = r.output.push(tok)
        reason = None
        if r.output.matched or (r.constraint is not None and r.constraint.done):
            reason = FinishReason.STOP
        elif r.completion >= r.max_new or (
            len(r.tokens) > self.max_context and not self.opt.context_shift
        ):
            reason = FinishReason.LENGTH
        top = smp.top
        lp = None if math.isnan(smp.logprob) else smp.logprob
        r.held.append(
            TokenEvent(tok, text, lp, top)
        )  # out in _deliver (stream_interval) or _finish
        return reason

    def _release(self, r: _Request) -> None:
        """Hand the request's held tokens to its response."""
        for ev in r.held:
            self._send(r, ev)
        r.held.clear()

    def _send(self, r: _Request, ev: Event) -> None:
        try:
            r.send.send_nowait(ev)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
            r.cancelled = True  # nobody reads any more

    def _finish(self, rid: str, reason: FinishReason, *, error: str | None = None) -> None:
        r = self._reqs.pop(rid, None)
        if r is None:
            return
        if self.lm is not None:
            self.policy.abort(rid)
        if r.cache is not None:
            if reason in (FinishReason.STOP, FinishReason.LENGTH) and not r.shifted:
                # prompt + answer: the next turn of a chat starts with both
                self.prefix.insert(r.tokens, r.cache)
            r.cache.free()
            r.cache = None
        self.prefix.release(r.prefix_blocks)
        r.prefix_blocks = []
        # held-back text is released unless it completes a stop string
        tail = r.output.close() if reason in (FinishReason.STOP, FinishReason.LENGTH) else ""
        now = trio.current_time()
        self._release(r)
        self._send(
            r,
            FinishEvent(
                reason,
                tail,
                stop_word=r.output.stops.word,
                stop_token=r.stop_token,
                prompt_tokens=r.prompt_tokens,
                completion_tokens=r.completion,
                cached_tokens=r.cached_tokens if r.prefix_loaded else 0,
                time_to_first_token=None
                if r.first_token_at is None
                else r.first_token_at - r.submitted,
                total_time=now - r.submitted,
                spec_drafted=r.spec_drafted,
                spec_accepted=r.spec_accepted,
                error=error,
            ),
        )
        r.send.close()
