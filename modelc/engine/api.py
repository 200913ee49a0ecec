"""The messages between the HTTP server and the engine (the scheduler).

The engine owns the model's :class:`~modelc.runtime.prompt.PromptFormat`
(``engine.prompt``: tokenizer, chat template, end-of-generation ids, sampling
defaults).  A caller (an HTTP route, ``modelc generate``) builds the prompt ids and
the sampling settings with it, puts them in a :class:`GenerationRequest` and calls
``engine.submit(req)``, which returns a :class:`RequestHandle` at once (or raises
:class:`~modelc.errors.CapacityError` when the queue is full, or a
:class:`~modelc.errors.UsageError` for a prompt that cannot fit).  The engine adds
the model's end-of-generation ids to every request and caps one without
``max_tokens``.  The handle yields :class:`TokenEvent` s ending with exactly one
:class:`FinishEvent` (``async for``, or ``await handle.next_event()``);
``handle.cancel()`` (or leaving the ``async with``) removes the request from the
batch at the next step and frees its KV memory.  Nothing else crosses the boundary:
handlers hold no generation logic.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import trio

from modelc.runtime.model import ImageSpan
from modelc.runtime.prompt import PromptFormat
from modelc.runtime.sampling import SamplingParams
from modelc.vision import VisionModel


class ConstraintKind(enum.StrEnum):
    REGEX = "regex"
    JSON_SCHEMA = "json_schema"  # value: the schema as a JSON text
    JSON_OBJECT = "json_object"  # any JSON object; value unused
    GRAMMAR = "grammar"  # value: a GBNF or Lark grammar text (llguidance detects which)


@dataclass(frozen=True, slots=True)
class Constraint:
    kind: ConstraintKind
    value: str = ""


@dataclass(slots=True)
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    constraint: Constraint | None = None
    deadline: float | None = None  # trio.current_time() deadline; None = none
    speculative: bool = True  # allow speculative decoding when the engine has it on
    ignore_eos: bool = False
    # the prompt's own log-probabilities (top-N alternatives, 0 = the tokens' only): a
    # PromptEvent before the first token (OpenAI's echo with logprobs); the prompt is
    # then computed in full (no prefix-cache reuse) and without speculation
    prompt_logprobs: int | None = None
    progress: bool = False  # a ProgressEvent after each step of prompt processing
    # images' embeddings at their prompt positions (engine.vision.place makes both)
    images: tuple[ImageSpan, ...] = ()


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOS/EOT or a stop string
    LENGTH = "length"  # max_tokens or the context limit
    CANCELLED = "cancelled"  # client gone or handle.cancel()
    TIMEOUT = "timeout"  # deadline passed
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class TokenEvent:
    token_id: int
    text: str  # the UTF-8-safe text delta this token completes (may be "")
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class PromptEvent:
    """The prompt's log-probabilities: ``logprobs[i]`` of prompt token ``i`` given the
    ones before it (None for the first), ``top[i]`` its best alternatives."""

    logprobs: tuple[float | None, ...]
    top: tuple[tuple[tuple[int, float], ...], ...]
    text: str = ""  # (events all carry text; a prompt event has none)


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """Prompt processing so far: ``processed`` of ``total`` prompt tokens are in the KV
    cache, ``cached`` of them from the prefix cache (llama.cpp's ``prompt_progress``)."""

    processed: int
    total: int
    cached: int
    seconds: float  # since the request was submitted
    text: str = ""


@dataclass(frozen=True, slots=True)
class FinishEvent:
    reason: FinishReason
    text: str = ""  # any held-back text released at the end (stop-string look-ahead)
    stop_word: str = ""  # the stop string that ended the text ("" for a stop token)
    stop_token: TokenEvent | None = None  # the end-of-generation token (no text of its own)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    time_to_first_token: float | None = None  # seconds from submit
    total_time: float = 0.0
    spec_drafted: int = 0
    spec_accepted: int = 0
    error: str | None = None


@dataclass(frozen=True, slots=True)
class KeepAliveEvent:
    """Nothing was sent to the request for the seconds its reader asked for
    (``handle.keep_alive``), and its reader has read everything: it still waits in the
    queue or behind a long step (a stream's ``: ping``)."""

    text: str = ""
    sent_at: float = 0.0  # the scheduler's clock (trio.current_time()) when it was sent


Event = TokenEvent | PromptEvent | ProgressEvent | KeepAliveEvent | FinishEvent


class RequestHandle(Protocol):
    request_id: str

    def __aiter__(self) -> AsyncIterator[Event]: ...

    async def next_event(self) -> Event:
        """The next event; safe to cancel (nothing is lost).  Raises trio.EndOfChannel
        after the FinishEvent."""
        ...

    def event_nowait(self) -> Event | None:
        """The next event if one is waiting, else None (a response catching up sends the
        events that piled up as one write)."""
        ...

    def cancel(self) -> None:
        """Idempotent; the engine drops the request at its next step."""
        ...

    def keep_alive(self, seconds: float) -> None:
        """A :class:`KeepAliveEvent` after each ``seconds`` (or up to a quarter more)
        in which the request was sent nothing and its reader had nothing left to read."""
        ...


@dataclass(slots=True)
class EngineStats:
    running: int = 0
    waiting: int = 0
    kv_bytes_used: int = 0
    kv_bytes_budget: int = 0
    prefix_cache_hits: int = 0  # requests that reused cached prefix blocks
    prefix_cache_tokens: int = 0  # prompt tokens skipped thanks to the cache
    steps: int = 0
    last_batch_size: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0
    spec_drafted: int = 0
    spec_accepted: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Engine(Protocol):
    """What the server may call. Built by ``modelc.engine.build_engine(model_path, options)``."""

    model_name: str
    architecture: str
    prompt: PromptFormat | None  # None: a model without a tokenizer
    vision: VisionModel | None  # the images' tower (--mmproj); None: it takes no images

    def submit(self, req: GenerationRequest) -> RequestHandle: ...

    async def embed(
        self, batch: Sequence[Sequence[int]], *, normalize: bool | None = None
    ) -> np.ndarray[Any, Any]:
        """Pooled embeddings (len(batch), d) for an embedding model (runs in a worker thread);
        ``normalize`` (L2) overrides the model's own setting (None: the model's)."""
        ...

    def stats(self) -> EngineStats: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The scheduler task: ``await nursery.start(engine.run)``; runs until cancelled."""
        ...
