"""The scheduling policy: plain bookkeeping, no trio and no model (tested on its own).

Like vLLM's v1 scheduler there is no prefill phase and no decode phase: every sequence
just has ``num_tokens`` (prompt + sampled tokens known so far) and ``num_computed``
(tokens whose keys/values are in its KV cache).  Each step :meth:`Policy.schedule`
hands out ``num_tokens - num_computed`` tokens per sequence under a per-step token
budget, which covers, in one loop:

* decoding (one token, plus any speculative draft tokens),
* chunked prefill (a long prompt is fed ``prefill_chunk`` tokens per step, so the
  streams already running keep getting a token every step),
* prefix caching (a request admitted with ``num_cached`` tokens starts there).

Order within a step: running decodes first (in arrival order), then running
sequences still prefilling, then new admissions from the waiting queue (FIFO) while
fewer than ``max_concurrent`` run and the KV budget has room for the newcomer's whole
sequence (``cost(min(prompt + max_new, max_context))`` bytes are reserved at admission,
so a running sequence never runs out of KV memory and nothing is ever preempted).

The caller then runs the step and reports back with :meth:`Policy.update`.

Request status (ordered):  WAITING -> RUNNING -> FINISHED (removed).
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from modelc.errors import CapacityError, UsageError

KVCost = Callable[[int], int]  # tokens -> bytes of KV memory a sequence of that length holds


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    FINISHED = 2


@dataclass(slots=True)
class SeqState:
    """The policy's view of one request."""

    request_id: str
    prompt_len: int
    max_new: int
    arrival: int
    num_cached: int = 0  # prompt tokens served by the prefix cache at admission
    num_computed: int = 0  # tokens in the KV cache
    num_tokens: int = 0  # prompt + sampled tokens known so far
    draft: int = 0  # speculative tokens to verify this step (set by the engine)
    paused: bool = False  # not scheduled (its reader fell behind); keeps its KV cache
    kv_reserved: int = 0
    status: RequestStatus = RequestStatus.WAITING
    whole: tuple[tuple[int, int], ...] = ()  # prompt spans a chunk never splits (images)

    @property
    def prefilling(self) -> bool:
        return self.num_computed < self.prompt_len


class ScheduledSeq(NamedTuple):
    """Feed tokens ``start .. start + n_tokens - 1`` of one sequence this step.

    The last ``n_draft`` of them are speculative draft tokens (appended by the engine
    after the known tokens).  ``sample``: the chunk reaches the end of the known
    tokens, so the step must return logits for it (all ``n_draft + 1`` last rows).
    (A named tuple, as :class:`SeqResult`: one of each a sequence a step, made a third
    as fast as a frozen dataclass.)
    """

    request_id: str
    start: int
    n_tokens: int
    n_draft: int
    sample: bool
    admitted: bool  # first time scheduled (the engine creates its KV cache)


@dataclass(frozen=True, slots=True)
class StepPlan:
    seqs: tuple[ScheduledSeq, ...]

    @property
    def n_tokens(self) -> int:
        return sum(s.n_tokens for s in self.seqs)

    def __bool__(self) -> bool:
        return bool(self.seqs)


class SeqResult(NamedTuple):
    """What one step did to a sequence: ``num_computed`` after it (speculative
    rollback applied), ``new_tokens`` sampled, and whether it finished."""

    request_id: str
    num_computed: int
    new_tokens: int = 0
    finished: bool = False


@dataclass(frozen=True, slots=True)
class StepResult:
    seqs: tuple[SeqResult, ...]


class Policy:
    """Waiting queue, running set, token budget and KV reservations."""

    def __init__(
        self,
        *,
        max_concurrent: int = 8,
        queue_size: int = 64,
        max_context: int = 2048,
        step_tokens: int = 512,
        prefill_chunk: int = 256,
        kv_budget: int | None = None,
        kv_cost: KVCost | None = None,
    ) -> None:
        """``prefill_chunk=0`` turns chunked prefill off (a prompt is fed whole)."""
        for name, v in (
            ("max_concurrent", max_concurrent),
            ("max_context", max_context),
            ("step_tokens", step_tokens),
        ):
            if v < 1:
                raise UsageError(f"{name} must be at least 1, got {v}")
        if queue_size < 0 or prefill_chunk < 0:
            raise UsageError("queue_size and prefill_chunk must be >= 0")
        self.max_concurrent = max_concurrent
        self.queue_size = queue_size
        self.max_context = max_context
        self.step_tokens = step_tokens
        self.prefill_chunk = prefill_chunk
        self.kv_cost: KVCost = kv_cost or (lambda n: n)
        self.kv_budget = (
            kv_budget if kv_budget is not None else max_concurrent * self.kv_cost(max_context)
        )
        self.kv_reserved = 0
        self.waiting: OrderedDict[str, SeqState] = OrderedDict()
        self.running: OrderedDict[str, SeqState] = OrderedDict()
        self._arrivals = 0

    # -- requests in and out ---------------------------------------------------------
    def seq(self, request_id: str) -> SeqState:
        return self.running.get(request_id) or self.waiting[request_id]

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.running or request_id in self.waiting

    def _need(self, prompt_len: int, max_new: int) -> int:
        return self.kv_cost(min(prompt_len + max_new, self.max_context))

    def add(
        self,
        request_id: str,
        prompt_len: int,
        max_new: int,
        num_cached: int = 0,
        whole: tuple[tuple[int, int], ...] = (),
    ) -> None:
        """Queue a request; CapacityError if the queue is full, UsageError if it can never
        run.  ``whole``: prompt spans (start, end) a prefill chunk takes whole or not at all."""
        if request_id in self:
            raise UsageError(f"request id {request_id!r} is already in use")
        if prompt_len < 1:
            raise UsageError(
                "the prompt is empty (no tokens); give some text or a BOS token", param="prompt"
            )
        if prompt_len >= self.max_context:
            raise UsageError(
                f"the prompt has {prompt_len} tokens but the context holds {self.max_context}; "
                "shorten it or turn context shifting on",
                param="prompt",
            )
        if self._need(prompt_len, max_new) > self.kv_budget:
            raise UsageError(
                f"a sequence of {min(prompt_len + max_new, self.max_context)} tokens needs "
                f"{self._need(prompt_len, max_new)} bytes of KV memory, more than the whole budget "
                f"({self.kv_budget}); lower max_tokens or raise the KV memory budget",
                param="max_tokens",
            )
        free_slots = self.max_concurrent - len(self.running)
        if len(self.waiting) >= self.queue_size + max(free_slots, 0):
            raise CapacityError(
                f"the engine is busy: {len(self.running)} running and {len(self.waiting)} "
                "waiting (queue full); retry later"
            )
        st = SeqState(
            request_id,
            prompt_len,
            max_new,
            self._arrivals,
            num_cached=min(num_cached, prompt_len - 1),
            num_tokens=prompt_len,
            whole=whole,
        )
        self._arrivals += 1
        self.waiting[request_id] = st

    def abort(self, request_id: str) -> bool:
        """Remove a request wherever it is and release its KV reservation."""
        st = self.waiting.pop(request_id, None) or self.running.pop(request_id, None)
        if st is None:
            return False
        self.kv_reserved -= st.kv_reserved
        st.kv_reserved = 0
        st.status = RequestStatus.FINISHED
        return True

    def pause(self, request_id: str, paused: bool) -> None:
        """A paused decoder is left out of the steps until it is resumed."""
        self.running[request_id].paused = paused

    def set_draft(self, request_id: str, n: int) -> None:
        self.running[request_id].draft = max(0, n)

    def shifted(self, request_id: str, n_discard: int) -> None:
        """The engine dropped ``n_discard`` tokens from the sequence (context shift)."""
        st = self.running[request_id]
        st.num_computed -= n_discard
        st.num_tokens -= n_discard

    # -- one step --------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        budget = self.step_tokens
        out: list[ScheduledSeq] = []
        prefilling = []
        for st in self.running.values():  # decodes always scheduled: a stream never stalls
            computed = st.num_computed
            if computed < st.prompt_len:
                prefilling.append(st)
                continue
            if st.paused:
                continue
            n_known = st.num_tokens - computed
            draft = st.draft
            if draft:
                draft = max(0, min(draft, budget - n_known))
            out.append(ScheduledSeq(st.request_id, computed, n_known + draft, draft, True, False))
            budget -= n_known + draft
        for st in prefilling:
            if budget <= 0:
                break
            n = self._prefill_len(st, budget)
            out.append(self._chunk(st, n, admitted=False))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_concurrent:
            st = next(iter(self.waiting.values()))
            need = self._need(st.prompt_len, st.max_new)
            if self.kv_reserved + need > self.kv_budget:
                break  # FIFO: the head waits for memory, nobody overtakes it
            del self.waiting[st.request_id]
            st.status = RequestStatus.RUNNING
            st.kv_reserved = need
            st.num_computed = st.num_cached
            self.kv_reserved += need
            self.running[st.request_id] = st
            n = self._prefill_len(st, budget)
            out.append(self._chunk(st, n, admitted=True))
            budget -= n
        return StepPlan(tuple(out))

    def _prefill_len(self, st: SeqState, budget: int) -> int:
        rest = st.num_tokens - st.num_computed
        if self.prefill_chunk == 0:
            return rest
        n = max(1, min(rest, self.prefill_chunk, budget))
        for a, b in st.whole:  # a chunk ending inside the span stops before it, or takes it
            if a < st.num_computed + n < b:
                n = a - st.num_computed if a > st.num_computed else b - st.num_computed
        return n

    def _chunk(self, st: SeqState, n: int, *, admitted: bool) -> ScheduledSeq:
        done = st.num_computed + n == st.num_tokens
        return ScheduledSeq(st.request_id, st.num_computed, n, 0, done, admitted)

    def update(self, result: StepResult) -> list[str]:
        """Apply a step's outcome; the ids of the sequences that finished."""
        finished = []
        for r in result.seqs:
            st = self.running.get(r.request_id)
            if st is None:  # aborted while the step ran
                continue
            st.num_computed = r.num_computed
            st.num_tokens += r.new_tokens
            st.draft = 0
            assert st.num_computed <= st.num_tokens
            if r.finished:
                self.abort(r.request_id)
                finished.append(r.request_id)
        return finished

    # -- views -----------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def admitting(self) -> bool:
        """A request waits while a sequence's place is free (it waits on the step's token
        budget or on memory, not for a running sequence to end)."""
        return bool(self.waiting) and len(self.running) < self.max_concurrent

    def ids(self) -> Sequence[str]:
        return [*self.running, *self.waiting]
