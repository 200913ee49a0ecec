"""The Trio scheduler: one task that owns every request from arrival to its last token.

``await nursery.start(engine.run)`` starts it.  ``engine.submit(req)`` (from any task
of the same Trio run) validates the request, compiles its constraint, looks up the
prefix cache and queues it in the :class:`~modelc.engine.policy.Policy`, or raises at
once (CapacityError: queue full; UsageError: bad prompt, constraint or settings).  Its
events come through a channel of ``max_tokens + 1``: delivering never blocks the loop.

Each loop iteration:

1. requests cancelled (``handle.cancel()``, the reader gone) or past their deadline
   leave: their KV cache is freed and they get their :class:`FinishEvent`;
2. running decoders get speculative drafts, and context limits are applied;
3. ``policy.schedule()`` plans the step; :meth:`~modelc.engine.runner.ModelRunner.execute`
   runs it on the step thread (prefix-cache loads, one batched ``model.forward``,
   masks, sampling / draft checks, prefix-cache inserts), started without yielding so
   responses are written while it computes;
4. the new tokens are detokenized, checked against stop tokens / strings / limits and
   handed out (:func:`~modelc.engine.options.release_held`); ``policy.update``.

A stop token (in ``stop_token_ids``, or the end of generation a completed grammar
allows) ends the request without a TokenEvent, counted in ``completion_tokens``; text
held back for a possible stop string comes in the FinishEvent.

A request cancelled while a step runs leaves right after it (its tokens from that step
dropped).  Its images (``req.images``, :mod:`modelc.vision`) ride with its sequence.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
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
from modelc.engine.batch_depth import BatchDepth
from modelc.engine.constraints import ConstraintState, build_lltokenizer
from modelc.engine.handle import Handle
from modelc.engine.keepalive import KeepAlive
from modelc.engine.lora_stack import LoraStack
from modelc.engine.options import AUTO_STREAM_BUSY, EngineOptions, release_held
from modelc.engine.output import TextOutput
from modelc.engine.policy import Policy, SeqResult, StepPlan, StepResult
from modelc.engine.request import RequestState as _Request
from modelc.engine.runner import ModelRunner, StepOutput
from modelc.engine.speculative import MLPDraftWeights
from modelc.engine.step_thread import StepThread
from modelc.errors import ModelcError, UnsupportedError, UsageError
from modelc.runtime.lora import load_adapter, scale_adapter
from modelc.runtime.model import EmbeddingModel, LanguageModel
from modelc.runtime.prompt import PromptFormat
from modelc.runtime.sampling import Sample, Sampler
from modelc.vision import VisionModel


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
        vision: VisionModel | None = None,
    ) -> None:
        options.validate()
        self.model = model
        self.vision = vision  # the images' tower (--mmproj); None: takes no images
        self.prompt = prompt  # tokenizer, chat template, end-of-generation ids, defaults
        self.tok = prompt.tokenizer if prompt is not None else None
        self.opt = options
        self.model_name = model_name
        self.architecture = model.architecture
        self._lock = trio.Lock()  # one compute at a time (steps and embeddings)
        self._stepper = StepThread()
        self._reqs: dict[str, _Request] = {}
        self._keepalive = KeepAlive(self._reqs)
        self._wake = trio.Event()
        self._stats = EngineStats()
        self._lltok: Any = None
        # end-of-generation ids: end every request, and a grammar allows them once complete
        self._eog: frozenset[int] = prompt.eog_ids if prompt is not None else frozenset()
        self._running = False
        self.loras = LoraStack(model)
        if not isinstance(model, LanguageModel):
            self.lm: LanguageModel | None = None
            self.runner: ModelRunner | None = None
            return
        self.lm = model
        self.runner = runner = ModelRunner(model, options, mlp_draft=mlp_draft)
        self.max_context, self.mode, self.kv_cost = runner.max_context, runner.mode, runner.kv_cost
        self.kv_budget, self.prefix = runner.kv_budget, runner.prefix
        self.policy = Policy(
            max_concurrent=options.max_concurrent,
            queue_size=options.queue_size,
            max_context=self.max_context,
            step_tokens=options.step_tokens,
            prefill_chunk=options.prefill_chunk,
            kv_budget=self.kv_budget.limit,
            kv_cost=self.kv_cost,
        )
        self._n_dec = 1  # sequences decoding in the step being planned / run
        self.depth = BatchDepth(options.scheduler_steps)  # steps a batch (--scheduler-steps)
        self._busy = False  # a batch ran and no idle wait came since

    # -- the server's side ------------------------------------------------------------
    def stats(self) -> EngineStats:
        s = self._stats
        if self.runner is not None:
            s.running, s.waiting = len(self.policy.running), len(self.policy.waiting)
            self.runner.report(s)
            s.extra.update(batch_depth=self.depth.steps(), **self.depth.secs)  # see BatchDepth
        return s

    async def load_lora(self, path: Path, scale: float = 1.0) -> None:
        """Merge a PEFT adapter into the weights between two steps (hot swap)."""
        adapter = await trio.to_thread.run_sync(load_adapter, path)
        if scale != 1.0:
            adapter = scale_adapter(adapter, scale)
        async with self._lock:
            await trio.to_thread.run_sync(self.loras.apply, adapter)
            self._reweighted()

    async def unload_lora(self, path: str | None = None) -> None:
        """Remove one adapter (by path) or all of them, newest first; base weights come back exactly."""
        async with self._lock:
            self.loras.remove(path)
            self._reweighted()

    def _reweighted(self) -> None:
        if self.runner is not None:
            self.runner.prefix.salt = self.loras.salt

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

    def submit(self, req: GenerationRequest) -> Handle:
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
            if not self.opt.context_shift or req.images:
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
            return Handle(req.request_id, recv0, self._cancel, self._keep_alive)
        runner = self.runner
        assert runner is not None
        seq = runner.new_seq(
            prompt,
            sampler,
            constraint=constraint,
            prompt_logprobs=req.prompt_logprobs,
            speculative=req.speculative,
            images=req.images,
        )
        try:
            self.policy.add(req.request_id, len(prompt), max_new, seq.cached_tokens, seq.spans)
        except ModelcError:
            runner.drop(seq)
            raise
        # every token, a prompt event, progress events (one a prefill chunk at most), the
        # finish event and a keep-alive event (one unread at most) fit: delivering never blocks
        chunks = -(-len(prompt) // max(self.opt.prefill_chunk, 1)) + 1 if req.progress else 0
        send, recv = trio.open_memory_channel[Event](max_new + 4 + chunks)
        r = _Request(
            req,
            send,
            seq,
            n_prompt,
            max_new,
            frozenset() if req.ignore_eos else self._eog | frozenset(p.stop_token_ids),
            trio.current_time(),
            TextOutput(self.tok.incremental_decoder() if self.tok is not None else None, p.stop),
        )
        seq.max_new, seq.stop_ids = max_new, r.stop_ids  # for the runner's steps on its own
        runner.add(req.request_id, seq)
        self._reqs[req.request_id] = r
        self._stats.prompt_tokens += n_prompt
        self._wake.set()
        return Handle(req.request_id, recv, self._cancel, self._keep_alive)

    def _llg_tokenizer(self) -> Any:
        if self._lltok is None:
            if self.tok is None or self.lm is None:
                raise UnsupportedError("constrained decoding needs the model's tokenizer")
            self._lltok = build_lltokenizer(self.tok, self.lm.n_vocab, set(self._eog))
        return self._lltok

    def _max_new(self, requested: int | None, n_prompt: int) -> int:
        """Tokens it may generate: max_tokens or the cap, within the context unless it shifts."""
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

    def _keep_alive(self, request_id: str, seconds: float) -> None:
        r = self._reqs.get(request_id)
        if r is not None:
            self._keepalive.ask(r, seconds)

    # -- the loop ---------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The scheduler task: ``await nursery.start(engine.run)``; runs until cancelled."""
        self._running = True
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._keepalive.run)
                await self._loop()
        finally:
            self._running = False
            self._stepper.close()
            for rid in list(self._reqs):
                self._finish(rid, FinishReason.ERROR, error="the engine stopped")

    async def _loop(self) -> None:
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

    async def _step(self, plan: StepPlan) -> StepOutput:
        """Run ``plan`` on the step thread, holding the compute lock; neither starting it
        nor taking a free lock yields to other tasks."""
        if self._lock.locked():  # a LoRA swap or an embedding batch is computing
            await self._lock.acquire()
        else:
            self._lock.acquire_nowait()
        try:
            assert self.runner is not None  # several steps a batch, unless one is being let in
            k = 1 if self.policy.admitting else self.runner.steps_for(plan, self.depth.steps())
            st, self._busy, busy = self._stepper, True, self._busy
            called = time.perf_counter()
            out = await st.run(self.runner.execute, plan, self._n_dec, k)
            self.depth.observe(called, st.started_at, st.ended_at, self.runner.last_steps, busy)
            return out
        finally:
            self._lock.release()

    async def _idle(self) -> None:
        deadlines = [r.req.deadline for r in self._reqs.values() if r.req.deadline is not None]
        if any(r.paused_at is not None for r in self._reqs.values()):
            deadlines.append(trio.current_time() + 0.05)  # see whether the readers caught up
        self._wake = trio.Event()
        self._busy = False
        with trio.move_on_at(min(deadlines, default=math.inf)):
            await self._wake.wait()

    def _pace(self, rid: str, r: _Request) -> bool:
        """Pause a decoder whose reader fell ``max_unread`` events behind (no compute while
        nobody reads), resume it when the reader catches up, cancel it after
        ``stall_timeout`` paused.  False if the request ended."""
        if r.paused_at is None and r.unread < self.opt.max_unread:
            return True  # cannot be behind (see RequestState.behind): nothing to do
        behind = r.behind(self.opt.max_unread)
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
        runner = self.runner
        assert runner is not None
        # rows of this step's decodes before drafts (each controller weighs its draft
        # against the time it adds to all of them)
        running, max_context = self.policy.running, self.max_context
        n_dec = sum(1 for st in running.values() if not st.prefilling and not st.paused)
        self._n_dec = max(n_dec, 1)
        for rid, st in list(running.items()):
            r = self._reqs[rid]
            seq = r.seq
            if st.prefilling or seq.cache is None:
                continue
            if not self._pace(rid, r) or r.paused_at is not None:
                continue
            fits = len(seq.tokens) <= max_context
            if fits and seq.drafter is None and not seq.draft:
                continue  # nothing to draft, nothing to clear (what draft() would find)
            if not fits:  # the next decode would not fit
                discard = runner.shift(rid, self.opt.anchor_tokens) if self.opt.context_shift else 0
                if discard < 1:
                    self._finish(rid, FinishReason.LENGTH)
                    continue
                self.policy.shifted(rid, discard)
            room = min(
                self.opt.spec_gamma,
                r.max_new - r.completion - 1,
                self.max_context - len(seq.tokens),
            )
            allowed = len(self.policy.running) <= self.opt.spec_max_running
            n = runner.draft(rid, room, n_dec, allowed=allowed)
            if seq.drafter is not None and allowed:
                self.policy.set_draft(rid, n)

    def _deliver(self, plan: StepPlan, out: StepOutput) -> None:
        results = []
        now = trio.current_time()
        busy = self._n_dec >= AUTO_STREAM_BUSY
        for s, samples in zip(plan.seqs, out, strict=True):
            r = self._reqs.get(s.request_id)
            if r is None or r.seq.cache is None:
                continue
            seq = r.seq
            if r.cancelled:
                self._finish(s.request_id, FinishReason.CANCELLED)
                continue
            if isinstance(samples, ModelcError):
                self._finish(s.request_id, FinishReason.ERROR, error=str(samples))
                continue
            if s.n_draft:
                self._stats.spec_drafted += s.n_draft
                self._stats.spec_accepted += max(0, len(samples) - 1)
            if r.req.progress and s.start < seq.prompt_len:
                done = min(seq.n_computed, seq.prompt_len)
                r.send_event(
                    ProgressEvent(done, r.prompt_tokens, seq.cached_tokens, now - r.submitted)
                )
            if r.req.prompt_logprobs is not None and samples and not r.prompt_lp_sent:
                r.prompt_lp_sent = True
                lps = (None, *(lp for lp, _ in seq.prompt_lp))
                r.send_event(PromptEvent(lps, ((), *(top for _, top in seq.prompt_lp))))
            # the runner appended every sample; those after the one that ends it go back
            reason, n = None, len(samples)
            for i, smp in enumerate(samples):
                reason = self._emit(r, smp, now, len(seq.tokens) - (n - 1 - i))
                if reason is not None:
                    assert self.runner is not None
                    self.runner.trim(s.request_id, n - 1 - i)
                    break
            if reason is not None:
                self._finish(s.request_id, reason)
                continue
            # none handed out yet (every generated token held): the first goes at once
            first, age = len(r.held) == r.completion, now - r.held_since
            if release_held(len(r.held), first, age, busy, self.opt.stream_interval):
                r.release()
            results.append(SeqResult(s.request_id, seq.n_computed, len(samples)))
        self.policy.update(StepResult(tuple(results)))
        self._stats.steps += self.runner.last_steps if self.runner is not None else 1
        self._stats.last_batch_size = len(plan.seqs)

    def _emit(self, r: _Request, smp: Sample, now: float, length: int) -> FinishReason | None:
        """Deliver one token (the sequence ``length`` tokens long with it); the finish
        reason if it ends the request."""
        tok, seq = smp.token, r.seq
        r.completion += 1
        self._stats.tokens_generated += 1
        if r.first_token_at is None:
            r.first_token_at = now
        done = seq.constraint is not None and seq.constraint.done  # a complete grammar
        grammar_eos = done and tok in self._eog
        if grammar_eos or tok in r.stop_ids:
            lp = None if math.isnan(smp.logprob) else smp.logprob
            r.stop_token = TokenEvent(tok, "", lp, smp.top)
            return FinishReason.STOP
        text = r.output.push(tok)
        reason = None
        if r.output.matched or done:
            reason = FinishReason.STOP
        elif r.completion >= r.max_new or (
            length > self.max_context and not self.opt.context_shift
        ):
            reason = FinishReason.LENGTH
        lp = None if math.isnan(smp.logprob) else smp.logprob
        if not r.held:
            r.held_since = now
        r.held.append(TokenEvent(tok, text, lp, smp.top))  # out in _deliver or _finish
        return reason

    def _finish(self, rid: str, reason: FinishReason, *, error: str | None = None) -> None:
        r = self._reqs.pop(rid, None)
        if r is None:
            return
        seq = r.seq
        completed = reason in (FinishReason.STOP, FinishReason.LENGTH)
        if self.runner is not None:
            self.policy.abort(rid)
            self.runner.remove(rid, keep=completed)
        # held-back text is released unless it completes a stop string
        tail = r.output.close() if completed else ""
        now = trio.current_time()
        r.release()
        r.send_event(
            FinishEvent(
                reason,
                tail,
                stop_word=r.output.stops.word,
                stop_token=r.stop_token,
                prompt_tokens=r.prompt_tokens,
                completion_tokens=r.completion,
                cached_tokens=seq.cached_tokens if seq.prefix_loaded else 0,
                time_to_first_token=None
                if r.first_token_at is None
                else r.first_token_at - r.submitted,
                total_time=now - r.submitted,
                spec_drafted=seq.spec_drafted,
                spec_accepted=seq.spec_accepted,
                error=error,
            ),
        )
        r.send.close()
