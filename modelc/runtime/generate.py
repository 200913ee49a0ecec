"""The synchronous generation loop: prompt ids in, (token id, text delta) pairs out.

``generate(model, tokenizer, prompt_ids, params)`` returns a :class:`Generation`, an
iterator of ``(token_id, text_delta)``; afterwards ``finish_reason``, ``samples``
(log-probabilities when asked for) and ``stats`` are set.  The engine drives the
batched ``forward`` itself; this loop is for one sequence (``modelc generate``).

Text: deltas come from the tokenizer's incremental decoder (which never splits a UTF-8
character and keeps a continuation's leading space), so their concatenation is the
decoded text of the generated ids.  Stop strings: the output is
cut before the first match, and text that could be the start of a stop string is held
back until it is known not to be.  A stop token (EOS/EOT, ``params.stop_token_ids``)
ends generation and contributes no text.  When the cache is full the context is
shifted: the first ``n_keep`` tokens stay, half of the rest is dropped.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from modelc.errors import UsageError
from modelc.runtime.kv_cache import KVCache
from modelc.runtime.model import LanguageModel, SeqChunk
from modelc.runtime.sampling import Sample, Sampler, SamplingParams


class StreamDecoder(Protocol):
    def feed(self, ids: int | Iterable[int]) -> str: ...

    def flush(self) -> str: ...


class TextDecoder(Protocol):
    """What the loop needs of a tokenizer (``modelc.runtime.tokenizer.Tokenizer``)."""

    def incremental_decoder(self) -> StreamDecoder: ...


@dataclass(slots=True)
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    context_shifts: int = 0

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        # the first token comes from the prefill logits
        n = max(self.generated_tokens - 1, 0)
        return n / self.decode_s if self.decode_s > 0 else 0.0


class StopMatcher:
    """Cuts text before the first stop string; holds back possible partial matches."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        """(text safe to emit now, whether a stop string matched)."""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending = self.pending[: min(hits)], ""
            return out, True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.pending)), hold, -1):
                if self.pending.endswith(s[:k]):
                    hold = k
                    break
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class Generation:
    """Iterator of ``(token_id, text_delta)``; see the module docstring."""

    def __init__(
        self,
        model: LanguageModel,
        tokenizer: TextDecoder,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        cache: KVCache | None = None,
        prefill_chunk: int = 512,
        n_keep: int = 4,
    ) -> None:
        if not prompt_ids:
            raise UsageError("the prompt is empty (no tokens); give some text or a BOS token")
        self.model, self.tok, self.params = model, tokenizer, params
        self.prompt = [int(t) for t in prompt_ids]
        self.cache = cache if cache is not None else model.new_cache()
        if len(self.prompt) >= self.cache.max_tokens:
            raise UsageError(
                f"the prompt has {len(self.prompt)} tokens but the context holds "
                f"{self.cache.max_tokens}; shorten it"
            )
        self.prefill_chunk = max(1, prefill_chunk)
        self.n_keep = n_keep
        self.sampler = Sampler(params, model.n_vocab, self.prompt)
        self.samples: list[Sample] = []
        self.finish_reason: str | None = None
        self.stats = GenerationStats(prompt_tokens=len(self.prompt))
        self._it = self._run()

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return self

    def __next__(self) -> tuple[int, str]:
        return next(self._it)

    def _prefill(self) -> Sample:
        t0 = time.perf_counter()
        p, c = self.prompt, self.prefill_chunk
        for i in range(0, len(p), c):
            part = p[i : i + c]
            last = i + c >= len(p)
            logits = self.model.forward([SeqChunk(self.cache, part, None if last else ())])
        s = self.sampler.sample(logits[0])
        self.stats.prefill_s = time.perf_counter() - t0
        return s

    def _step(self, token: int) -> Sample:
        if self.cache.n + 1 > self.cache.max_tokens:
            keep = min(self.n_keep, self.cache.n - 1)
            self.model.shift_context(self.cache, keep, max(1, (self.cache.n - keep) // 2))
            self.stats.context_shifts += 1
        t0 = time.perf_counter()
        logits = self.model.forward([SeqChunk(self.cache, [token])])
        s = self.sampler.sample(logits[0])
        self.stats.decode_s += time.perf_counter() - t0
        return s

    def _run(self) -> Iterator[tuple[int, str]]:
        params = self.params
        if params.max_tokens == 0:
            self.finish_reason = "length"
            return
        stop_ids = set(params.stop_token_ids)
        detok = self.tok.incremental_decoder()
        stops = StopMatcher(params.stop)
        s = self._prefill()
        while True:
            tok = s.token
            self.samples.append(s)
            self.stats.generated_tokens += 1
            self.sampler.accept(tok)
            if tok in stop_ids:
                self.finish_reason = "stop"
                yield tok, stops.push(detok.flush())[0] + stops.flush()
                return
            text, matched = stops.push(detok.feed(tok))
            if matched:
                self.finish_reason = "stop"
                yield tok, text
                return
            if self.stats.generated_tokens >= params.max_tokens:
                self.finish_reason = "length"
                tail, matched = stops.push(detok.flush())
                yield tok, text + tail + ("" if matched else stops.flush())
                return
            yield tok, text
            s = self._step(tok)


def generate(
    model: LanguageModel,
    tokenizer: TextDecoder,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    *,
    cache: KVCache | None = None,
    prefill_chunk: int = 512,
    n_keep: int = 4,
) -> Generation:
    """Generate from ``prompt_ids``: an iterator of ``(token_id, text_delta)``."""
    return Generation(
        model,
        tokenizer,
        prompt_ids,
        params,
        cache=cache,
        prefill_chunk=prefill_chunk,
        n_keep=n_keep,
    )
