"""The llama.cpp dialect: ``/completion`` and ``/infill`` bodies, as llama.cpp's server writes
them (``content``, ``tokens``, ``stop``, ``stop_type``, ``timings``,
``completion_probabilities``...), from engine results."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from modelc.engine.api import FinishEvent, FinishReason, TokenEvent
from modelc.runtime.sampling import SamplingParams
from modelc.server import sse
from modelc.server.generation import Outcome, RendererBase
from modelc.server.llamacpp.schemas import (
    LlamaCompletion,
    LlamaStreamChunk,
    LlamaTimings,
    LlamaTokenProb,
    LlamaTopProb,
)
from modelc.server.state import ModelInfo


def settings(p: SamplingParams, stream: bool, n_probs: int, ignore_eos: bool) -> dict[str, Any]:
    """``generation_settings``: the values a request ran with, under llama.cpp's names."""
    n = -1 if p.max_tokens is None else p.max_tokens
    return {
        "seed": -1 if p.seed is None else p.seed,
        "temperature": p.temperature,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "repeat_last_n": p.repeat_last_n,
        "repeat_penalty": p.repetition_penalty,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "stop": list(p.stop),
        "max_tokens": n,
        "n_predict": n,
        "n_probs": n_probs,
        "ignore_eos": ignore_eos,
        "stream": stream,
        "logit_bias": [[t, b] for t, b in p.logit_bias.items()],
        "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
    }


def _ms(s: float) -> float:
    return round(s * 1000.0, 3)


def timings(f: FinishEvent) -> LlamaTimings:
    """llama.cpp's ``timings``: prompt time up to the first token, generation after it."""
    prompt_s = f.time_to_first_token or 0.0
    gen_s = max(f.total_time - prompt_s, 0.0)
    prompt_n = max(f.prompt_tokens - f.cached_tokens, 0)
    gen_n = max(f.completion_tokens - 1, 0)  # the first token came with the prompt's pass
    return LlamaTimings(
        prompt_n,
        _ms(prompt_s),
        _ms(prompt_s / prompt_n) if prompt_n else 0.0,
        prompt_n / prompt_s if prompt_s > 0 else 0.0,
        f.completion_tokens,
        _ms(gen_s),
        _ms(gen_s / gen_n) if gen_n else 0.0,
        gen_n / gen_s if gen_s > 0 else 0.0,
        f.cached_tokens,
    )


def stop_type(f: FinishEvent) -> str:
    if f.reason is FinishReason.STOP:
        return "word" if f.stop_word else "eos"
    return "limit"


@dataclass(slots=True)
class LlamaRenderer(RendererBase):
    """One ``/completion`` answer per prompt (a JSON array when the request had several)."""

    info: ModelInfo
    prompts: list[tuple[str, list[int]]]
    params: SamplingParams
    n_probs: int = 0
    return_tokens: bool = False
    ignore_eos: bool = False
    stream: bool = False
    many: bool = False  # the request's prompt was a list of prompts
    headers: dict[str, str] = field(default_factory=lambda: sse.HEADERS)
    ping: bytes | None = None  # llama.cpp sends no comments between events
    _predicted: int = 0
    _new_line: bool = False  # a streamed piece had a newline

    def _piece(self, tok: int) -> tuple[str, list[int]]:
        """A token's text and bytes as llama.cpp shows them: control tokens are empty."""
        tk = self.info.tok()
        raw = b"" if tk.is_control(tok) else tk.token_to_piece(tok)
        return raw.decode("utf-8", "replace"), list(raw)

    def _probs(self, events: list[TokenEvent]) -> list[LlamaTokenProb] | None:
        if not self.n_probs:
            return None
        out = []
        for ev in events:
            s, b = self._piece(ev.token_id)
            tops = [LlamaTopProb(t, *self._piece(t), lp) for t, lp in ev.top_logprobs]
            out.append(LlamaTokenProb(ev.token_id, s, b, ev.logprob or 0.0, tops))
        return out

    def _final(
        self, i: int, content: str, tokens: list[TokenEvent], f: FinishEvent
    ) -> LlamaCompletion:
        text, ids = self.prompts[i]
        if f.stop_token is not None:  # llama.cpp lists the end-of-generation token too
            tokens = [*tokens, f.stop_token]
        return LlamaCompletion(
            i,
            content,
            [t.token_id for t in tokens] if self.return_tokens else [],
            i,
            True,
            self.info.model_id,
            f.completion_tokens,
            len(ids),
            settings(self.params, self.stream, self.n_probs, self.ignore_eos),
            text,
            "\n" in content or self._new_line,
            False,
            stop_type(f),
            f.stop_word,
            len(ids) + max(f.completion_tokens - 1, 0),  # the last token is never fed
            timings(f),
            None if self.stream else self._probs(tokens),
        )

    def body(self, outs: list[Outcome]) -> LlamaCompletion | list[LlamaCompletion]:
        answers = [self._final(i, o.text, o.tokens, o.finish) for i, o in enumerate(outs)]
        return answers if self.many else answers[0]

    def start(self, i: int) -> list[bytes]:
        self._predicted, self._new_line = 0, False
        return []

    def _chunk(self, i: int, ev: TokenEvent) -> bytes:
        """A streamed token: llama.cpp sends its id whether or not return_tokens is set."""
        self._predicted += 1
        self._new_line = self._new_line or "\n" in ev.text
        chunk = LlamaStreamChunk(
            i,
            ev.text,
            [ev.token_id],
            False,
            -1,
            self._predicted,
            len(self.prompts[i][1]),
            self._probs([ev]),
        )
        return sse.event(chunk)

    def token(self, i: int, ev: TokenEvent) -> list[bytes]:
        return [self._chunk(i, ev)]

    def finish(self, i: int, ev: FinishEvent) -> list[bytes]:
        last = [self._chunk(i, ev.stop_token)] if ev.stop_token is not None else []
        final = dataclasses.replace(ev, stop_token=None)  # streamed already
        return [*last, sse.event(self._final(i, ev.text, [], final))]
