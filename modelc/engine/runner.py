"""The model runner: executes a scheduled step; no trio, no queues, no delivery.

The scheduler (:mod:`modelc.engine.scheduler`) decides, through the pure
:class:`~modelc.engine.policy.Policy`, which tokens of which sequences a step feeds
(a :class:`~modelc.engine.policy.StepPlan`); :meth:`ModelRunner.execute` runs it and
returns, per scheduled sequence, the tokens it sampled (or the error that ended that
sequence alone).  Like vLLM v1's GPU model runner, it owns what the step needs on the
model's side, per sequence a :class:`SeqRun`:

* the KV cache (made at admission within the shared :class:`KVBudget`) and the prefix
  cache's blocks (loaded at admission, the prompt inserted once it is computed);
* the batched forward, prompt log-probabilities, constraint masks and sampling;
* speculative drafts (:meth:`draft`) and their verification, with the adaptive
  controller's step-time model (:class:`~modelc.engine.spec_control.StepCost`);
* context shifts (:meth:`shift`).

Runs on the scheduler's step thread, one call at a time; testable without trio.
:mod:`modelc.engine.seq_run` holds a sequence's state, :mod:`modelc.engine.lora_stack`
the adapters merged into the weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from modelc.engine.constraints import ConstraintState
from modelc.engine.options import EngineOptions
from modelc.engine.policy import KVCost, ScheduledSeq, StepPlan
from modelc.engine.prefix_cache import PrefixCache
from modelc.engine.seq_run import SeqRun, prefix_key
from modelc.engine.spec_control import SpecConfig, SpecController, StepCost
from modelc.engine.speculative import MLPDraftWeights, make_drafter, verify
from modelc.errors import ModelcError, UsageError
from modelc.runtime.batch_sampler import BatchParams, batchable
from modelc.runtime.kv_cache import BLOCK, KVBudget, KVCache, KVMode, KVShape
from modelc.runtime.model import CausalLM, ImageSpan, LanguageModel, SeqChunk
from modelc.runtime.sampling import Sample, Sampler, token_logprobs

if TYPE_CHECKING:  # the API's module holds the handles' trio channels
    from modelc.engine.api import EngineStats

# per scheduled sequence: the tokens sampled (none for a prefill chunk that does not
# reach the end of the prompt), or the error that ended that sequence
StepOutput = list[list[Sample] | ModelcError]


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
    state = probe.state.nbytes if probe.state is not None else 0  # recurrent layers: fixed

    def cost(n: int) -> int:
        return cache.nbytes_at(min(n, max_context), chunk) + state

    return cost


class ModelRunner:
    """Executes scheduled steps of a language model (see the module docstring)."""

    def __init__(
        self,
        lm: LanguageModel,
        options: EngineOptions,
        *,
        mlp_draft: MLPDraftWeights | None = None,
    ) -> None:
        self.lm = lm
        self.opt = options
        self.max_context = min(options.max_context or lm.n_ctx, lm.n_ctx)
        self.mode = KVMode(options.kv_cache)
        chunk = max(options.prefill_chunk or self.max_context, options.spec_gamma + 1)
        self.kv_cost = kv_cost_fn(
            lm, self.mode, options.kv_hot_window, self.max_context, chunk, full=options.swa_full
        )
        # KV memory for every sequence the policy admits (it reserves each one's whole
        # length in this budget at admission); by default max_concurrent full contexts
        budget = options.kv_budget_bytes
        if budget is None:
            budget = options.max_concurrent * self.kv_cost(self.max_context)
        self.kv_budget = KVBudget(budget)
        # mixed caches would reload exact hot-window rows as dequantized ones: no sharing
        prefix_bytes = 0 if self.mode is KVMode.MIXED else options.prefix_cache_bytes
        recurrent = lm.new_cache(KVMode.F32, max_tokens=1).state is not None  # qwen35
        self.prefix = PrefixCache(
            kv_shape(lm), prefix_bytes, options.prefix_block_tokens, recurrent=recurrent
        )
        if options.speculative and options.draft == "mlp" and mlp_draft is None:
            raise UsageError("--draft mlp needs draft.* tensors in the model; this one has none")
        self._mlp = mlp_draft
        self.spec_config = SpecConfig(n_max=options.spec_gamma, min_prompt=options.spec_min_prompt)
        # decode steps' time by rows fed, for the controllers (frozen: the prior alone)
        self.step_cost = StepCost(frozen=options.spec_fixed_cost)
        self.seqs: dict[str, SeqRun] = {}
        self.device_sampled_steps = 0  # steps sampled by the model's forward_sample
        self.last_steps = 1  # steps the last execute ran (its ``steps``)
        self.batches = 0  # execute calls (steps / batches: the steps a batch ran)

    def report(self, s: EngineStats) -> None:
        """The KV memory and prefix-cache figures of ``s``."""
        s.kv_bytes_used, s.kv_bytes_budget = self.kv_budget.used, self.kv_budget.limit
        ps = self.prefix.stats
        s.prefix_cache_hits, s.prefix_cache_tokens = ps.hits, ps.hit_tokens
        s.extra.update(
            prefix_cache_bytes=self.prefix.bytes_used,
            prefix_cache_blocks=len(self.prefix.blocks),
            prefix_cache_evicted=ps.evicted_blocks,
            spec_acceptance=s.spec_accepted / s.spec_drafted if s.spec_drafted else 0.0,
            kv_cache=self.mode.value,
            device_sampled_steps=self.device_sampled_steps,
            scheduled_batches=self.batches,
        )
        # a GPU model's steps replayed from a CUDA graph, captured, run eagerly
        for kind, n in getattr(self.lm, "graph_steps", {}).items():
            s.extra[f"graph_steps_{kind}"] = n

    # -- sequences in and out ------------------------------------------------------------
    def new_seq(
        self,
        prompt: list[int],
        sampler: Sampler,
        *,
        constraint: ConstraintState | None = None,
        prompt_logprobs: int | None = None,
        speculative: bool = True,
        images: tuple[ImageSpan, ...] = (),
    ) -> SeqRun:
        """A sequence's state with its prefix-cache match (its blocks held: :meth:`add` it,
        or :meth:`drop` it); ``speculative``: the request allows drafting; ``images``: its
        image spans (within the prompt)."""
        if any(im.start < 0 or im.end > len(prompt) for im in images):
            raise UsageError("an image lies outside the prompt", param="messages")
        # prompt log-probabilities need every prompt row computed: no cached prefix
        key = prefix_key(prompt, images)
        blocks = self.prefix.match(key) if prompt_logprobs is None else []
        cached = min(len(blocks) * self.prefix.block_tokens, len(prompt) - 1)
        opt = self.opt
        use_spec = (
            opt.speculative
            and speculative
            and constraint is None
            and sampler.p.reasoning_budget is None  # it forces tokens drafts do not know
            and prompt_logprobs is None
            and opt.spec_gamma > 0
        )
        spec = SpecController(self.spec_config, len(prompt)) if opt.spec_adaptive else None
        # the controller's choices follow measured step times, and with sampling the
        # draft lengths decide how the RNG is used: a seeded request must repeat, so it
        # does not draft (greedy output is the same whatever the drafts)
        seeded = sampler.p.temperature > 0 and sampler.p.seed is not None
        if spec is not None and (not spec.enabled or seeded):
            use_spec = False
        return SeqRun(
            prompt,
            len(prompt),
            sampler,
            prompt_logprobs,
            constraint,
            drafter=make_drafter(opt.draft, self._mlp) if use_spec else None,
            spec=spec if use_spec else None,
            prefix_blocks=blocks,
            cached_tokens=cached,
            images=images,
        )

    def add(self, seq_id: str, seq: SeqRun) -> None:
        self.seqs[seq_id] = seq

    def drop(self, seq: SeqRun, *, keep: bool = False) -> None:
        """Free a sequence's KV cache and prefix blocks; ``keep``: first offer its
        tokens (prompt + answer: the next turn of a chat starts with both) to the
        prefix cache, unless a context shift made its KV differ from a fresh run's."""
        if seq.cache is not None:
            if keep and not seq.shifted:
                self.prefix.insert(prefix_key(seq.tokens, seq.images), seq.cache)
            seq.cache.free()
            seq.cache = None
        self.prefix.release(seq.prefix_blocks)
        seq.prefix_blocks = []

    def remove(self, seq_id: str, *, keep: bool = False) -> None:
        """:meth:`drop` a sequence and forget it."""
        seq = self.seqs.pop(seq_id, None)
        if seq is not None:
            self.drop(seq, keep=keep)

    # -- before a step -------------------------------------------------------------------
    def shift(self, seq_id: str, anchor: int) -> int:
        """Context shift: drop about half the tokens after the first ``anchor`` from the
        sequence and its cache; the number dropped (0: none can be)."""
        seq = self.seqs[seq_id]
        cache = seq.cache
        assert cache is not None
        if seq.images:  # the images' positions would move
            return 0
        keep = min(anchor, cache.n - 1)
        # a windowed layer must still hold what its window reaches after the shift
        discard = min(max(1, (cache.n - keep) // 2), cache.max_discard(keep))
        if discard < 1:
            return 0
        self.lm.shift_context(cache, keep, discard)
        del seq.tokens[keep : keep + discard]
        if seq.drafter is not None:  # its index held the dropped tokens
            seq.drafter = make_drafter(self.opt.draft, self._mlp)
        seq.shifted = True
        return discard

    def draft(self, seq_id: str, room: int, n_dec: int, *, allowed: bool = True) -> int:
        """Propose the sequence's speculative draft for the next step, at most ``room``
        tokens (``n_dec``: the step's decoding sequences); its length."""
        seq = self.seqs[seq_id]
        seq.draft = []
        if seq.drafter is None or not allowed or room <= 0:
            return 0
        draft, seq.draft_match = seq.drafter.lookup(seq.tokens, room)
        k = len(draft)
        if seq.spec is not None:
            k = seq.spec.draft_len(seq.draft_match, k, self._cost_fn(n_dec), n_dec)
        seq.draft = draft[: min(k, room)]
        return len(seq.draft)

    def _cost_fn(self, rows: int) -> Callable[[int], float]:
        per_row = self.step_cost.per_row(rows)  # one fit per step, not one per k tried
        return lambda k: 1.0 + per_row * k

    # -- the step ------------------------------------------------------------------------
    def execute(self, plan: StepPlan, n_dec: int = 1, steps: int = 1) -> StepOutput:
        """One batched forward and the sampling it feeds (``n_dec``: the sequences
        decoding, for the speculation controllers); a decode-only step's time goes to
        ``step_cost``.  Every sampled token is appended to its sequence's ``tokens``.

        ``steps`` > 1 (--scheduler-steps, as vLLM's multi-step scheduling): up to
        ``steps - 1`` more decode steps follow at once, each feeding the token the last
        one sampled, for the sequences that can go on without the scheduler (see
        :meth:`_continues`), so the model is not kept waiting for the scheduler's
        delivery and planning between two steps; each sequence's samples of all the
        steps come back together (the scheduler delivers them as it does a verified
        draft's, and :meth:`trim` takes back what followed a stop it found in the text).
        :attr:`last_steps`: how many ran."""
        out = self._timed(plan, n_dec)
        self.batches += 1
        self.last_steps, last = 1, out
        while self.last_steps < steps:
            idx = [i for i, s in enumerate(plan.seqs) if self._continues(s, last[i])]
            if not idx:
                break
            nxt = StepPlan(tuple(self._next(plan.seqs[i]) for i in idx))
            try:
                more = self._timed(nxt, n_dec)
            except Exception as e:  # the sequences it held end; the first step's others stand
                err = e if isinstance(e, ModelcError) else ModelcError(f"{type(e).__name__}: {e}")
                err.__cause__ = e
                for i in idx:
                    out[i] = err
                break
            last = [[] for _ in plan.seqs]
            for i, got in zip(idx, more, strict=True):
                last[i] = got
                had = out[i]  # samples: a sequence went on only from samples
                assert isinstance(had, list)
                out[i] = got if isinstance(got, ModelcError) else had + got
            self.last_steps += 1
        return out

    def _timed(self, plan: StepPlan, n_dec: int) -> StepOutput:
        t0 = time.perf_counter()
        out = self._compute(plan, n_dec)
        decode_only = all(
            s.sample and not s.admitted and s.n_tokens - s.n_draft == 1 for s in plan.seqs
        )
        if decode_only:
            self.step_cost.observe(plan.n_tokens, time.perf_counter() - t0)
        return out

    def _continues(self, s: ScheduledSeq, samples: list[Sample] | ModelcError) -> bool:
        """Whether a sequence goes on into the next of a plan's steps with the token it
        just sampled: one token sampled (no draft verified), one the runner knows does
        not end it (not a stop id, within ``max_new`` and the context), and nothing the
        scheduler does between two steps (no constraint to check for completion, no
        drafter, no prompt log-probabilities); a stop string in the text is found only
        when the scheduler delivers, and :meth:`trim` takes back the tokens after it."""
        if not isinstance(samples, list) or len(samples) != 1 or s.n_draft:
            return False
        seq = self.seqs.get(s.request_id)
        return (
            seq is not None
            and seq.cache is not None
            and self.steady(seq)
            and seq.generated < seq.max_new
            and samples[0].token not in seq.stop_ids
            and len(seq.tokens) <= self.max_context
        )

    def steps_for(self, plan: StepPlan, steps: int) -> int:
        """Steps ``plan`` may run as one batch: ``steps`` where each of its sequences
        samples and is :meth:`steady`, else one (a prompt still being fed would wait for
        the whole batch for its next chunk, a draft or a constraint get one step a batch)."""
        for s in plan.seqs:
            seq = self.seqs.get(s.request_id)
            if not s.sample or s.n_draft or seq is None or not self.steady(seq):
                return 1
        return steps

    @staticmethod
    def steady(seq: SeqRun) -> bool:
        """A sequence whose decode steps need nothing from the scheduler between them: no
        constraint, no drafter, no prompt log-probabilities (the scheduler runs a batch
        of several steps only when each of its sequences is so, or one would fall behind)."""
        return seq.constraint is None and seq.drafter is None and seq.prompt_logprobs is None

    def _next(self, s: ScheduledSeq) -> ScheduledSeq:
        """The next step of a sequence that :meth:`_continues`: its last token fed."""
        cache = self.seqs[s.request_id].cache
        assert cache is not None
        return ScheduledSeq(s.request_id, cache.n, 1, 0, True, False)

    def trim(self, seq_id: str, n: int) -> None:
        """Take the last ``n`` sampled tokens back from a sequence (the scheduler found
        its end before them): what the prefix cache keeps of it ends before them."""
        seq = self.seqs.get(seq_id)
        if seq is not None and n > 0:
            del seq.tokens[len(seq.tokens) - n :]

    def _admit(self, seq: SeqRun) -> None:
        seq.cache = self.lm.new_cache(
            self.mode,
            max_tokens=self.max_context,
            hot_window=self.opt.kv_hot_window,
            budget=self.kv_budget,
            full=self.opt.swa_full,
        )
        if seq.cache.state is not None:  # keep the state at block ends for the prefix cache
            seq.cache.state.boundary = self.prefix.block_tokens
        self.prefix.load(
            seq.prefix_blocks[: seq.cached_tokens // self.prefix.block_tokens], seq.cache
        )
        self.prefix.release(seq.prefix_blocks)
        seq.prefix_blocks = []
        seq.prefix_loaded = True

    def _compute(self, plan: StepPlan, n_dec: int) -> StepOutput:
        batch, seqs, by_id = [], [], self.seqs
        for s in plan.seqs:
            seq = by_id[s.request_id]
            if s.admitted:
                self._admit(seq)
            start, n_draft, cache = s.start, s.n_draft, seq.cache
            assert cache is not None and cache.n == start, (s, cache and cache.n)
            if s.n_tokens == 1 and not n_draft:  # a decode's one token (or a 1-token chunk)
                feed = seq.tokens[start : start + 1]
                rows: tuple[int, ...] = (len(feed) - 1,) if s.sample else ()
            else:
                feed = seq.tokens[start : start + s.n_tokens - n_draft] + seq.draft[:n_draft]
                rows = tuple(range(len(feed) - n_draft - 1, len(feed))) if s.sample else ()
            if seq.prompt_logprobs is not None and start < seq.prompt_len:
                rows = tuple(range(len(feed)))  # every prompt row's next-token logits
            batch.append(SeqChunk(cache, feed, rows, seq.images))
            seqs.append(seq)
        on_device = self._on_device(plan, seqs, batch)
        drawn: Iterator[Sample] = iter(())
        if any(on_device):  # those rows' tokens (and log-probs asked for) come back alone
            assert isinstance(self.lm, CausalLM)
            self.device_sampled_steps += 1
            n_rows = [len(c.rows()) for c in batch]
            params = BatchParams.gather(
                [seq.sampler for seq, dev in zip(seqs, on_device, strict=True) if dev],
                np.cumsum(n_rows)[np.asarray(on_device)] - 1,  # each one's (only) row
                sum(n_rows),
            )
            step = self.lm.forward_sample(batch, params)
            drawn, logits = iter(step.samples(params)), step.logits
        else:
            logits = self.lm.forward(batch)  # (sum of rows, n_vocab)
        out: StepOutput = []
        row = 0  # in ``logits``: the rows not sampled on the device
        for s, seq, chunk, dev in zip(plan.seqs, seqs, batch, on_device, strict=True):
            assert seq.cache is not None
            if not seq.prefix_inserted and seq.cache.n >= seq.prompt_len:
                key = prefix_key(seq.tokens[: seq.prompt_len], seq.images)
                self.prefix.insert(key, seq.cache)
                seq.prefix_inserted = True
            if dev:
                smp = next(drawn)
                seq.sampler.accept(smp.token)
                seq.tokens.append(smp.token)
                seq.generated += 1
                out.append([smp])
                continue
            mine = logits[row : row + len(chunk.rows())]
            row += len(chunk.rows())
            if seq.prompt_logprobs is not None and s.start < seq.prompt_len:
                n = min(len(mine), seq.prompt_len - 1 - s.start)  # rows predicting prompt tokens
                nxt = seq.tokens[s.start + 1 : s.start + 1 + n]
                seq.prompt_lp += token_logprobs(mine[:n], nxt, seq.prompt_logprobs)
            if not s.sample:
                out.append([])
                continue
            try:
                samples = self._sample(seq, s, mine, n_dec)
            except ModelcError as e:  # this sequence's constraint / sampler failed: it alone ends
                out.append(e)
                continue
            seq.tokens += [smp.token for smp in samples]
            seq.generated += len(samples)
            out.append(samples)
        return out

    def _on_device(self, plan: StepPlan, seqs: list[SeqRun], batch: list[SeqChunk]) -> list[bool]:
        """Where each sequence of the step samples, decided here alone: on the model's
        device (its ``forward_sample``: only the chosen token and the log-probabilities
        asked for come back) when ``--device-sampling`` allows (auto: when the model's
        logits live on a device) and the sequence needs no logits on the host: a
        sampling row of its own with no prompt log-probabilities, no constraint's mask,
        no speculative draft to verify, and only settings the batched sampler has
        (``batchable``); else on the host, as every sequence of a prefill-only step."""
        mode, lm = self.opt.device_sampling, self.lm
        if mode == "off" or not isinstance(lm, CausalLM):
            return [False] * len(seqs)
        if mode == "auto" and not lm.logits_on_device:
            return [False] * len(seqs)
        return [
            s.sample
            and len(chunk.rows()) == 1
            and not s.n_draft
            and seq.constraint is None
            and not (seq.prompt_logprobs is not None and s.start < seq.prompt_len)
            and batchable(seq.sampler)
            for s, seq, chunk in zip(plan.seqs, seqs, batch, strict=True)
        ]

    def _sample(
        self, seq: SeqRun, s: ScheduledSeq, logits: np.ndarray[Any, Any], n_dec: int
    ) -> list[Sample]:
        assert seq.cache is not None
        if s.n_draft:
            samples = verify(seq.sampler, logits, seq.draft[: s.n_draft])
            # keep the KV of the known token and the accepted drafts only
            seq.cache.truncate(s.start + s.n_tokens - s.n_draft + len(samples) - 1)
            seq.spec_drafted += s.n_draft
            seq.spec_accepted += len(samples) - 1
            if seq.spec is not None:
                seq.spec.update(
                    seq.draft_match, s.n_draft, len(samples) - 1, self._cost_fn(n_dec), n_dec
                )
            return samples
        x = logits[-1]
        if seq.constraint is not None:
            x = x.copy()  # masked in place
            seq.constraint.mask(x)
        smp = seq.sampler.sample(x)
        seq.sampler.accept(smp.token)
        if seq.constraint is not None:
            seq.constraint.accept(smp.token)
        return [smp]
