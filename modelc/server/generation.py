"""From a request body to engine requests, and the one loop that answers them.

A route parses its body, then uses the helpers here: :func:`template_prompt` / :func:`chat_ids` / :func:`text_ids`
build the prompt with the engine's :class:`~modelc.runtime.prompt.PromptFormat` (the
only place prompts are made), :func:`sampling` settles the sampling settings from the
request and the model's defaults, :func:`submit_all` queues the engine requests, and
:func:`respond` answers: either it collects every result and renders one body, or it
streams the events.  Both go through the route's :class:`Renderer`, one per API dialect
(OpenAI chat and completions, Ollama, llama.cpp, native), as llama.cpp's server renders
one task result per dialect.  Nothing here generates.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

import msgspec
import numpy as np
import trio
from quart import Response

from modelc.engine.api import (
    Constraint,
    Engine,
    Event,
    FinishEvent,
    FinishReason,
    GenerationRequest,
    KeepAliveEvent,
    ProgressEvent,
    PromptEvent,
    RequestHandle,
    TokenEvent,
)
from modelc.errors import ModelcError, UsageError
from modelc.runtime.model import ImageSpan
from modelc.runtime.prompt import ChatPrompt
from modelc.runtime.sampling import SamplingParams
from modelc.server.context import ctx, json_response, record, stream_response
from modelc.server.errors import ParamError
from modelc.server.images import image_parts
from modelc.server.metrics import Metrics
from modelc.server.schemas import Sampling
from modelc.server.state import ModelInfo
from modelc.vision import ImageError

FINISH = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "stop",
    FinishReason.TIMEOUT: "length",
}


class GenerationFailed(ModelcError):
    """The engine reported an error for a request."""

    http_status = 500
    error_type = "server_error"


def raise_failed(ev: FinishEvent) -> NoReturn:
    """Raise :class:`GenerationFailed` for a finish event whose reason is an error."""
    raise GenerationFailed(f"generation failed: {ev.error or 'engine error'}")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


# --- prompts -----------------------------------------------------------------------------
def plain(obj: Any) -> Any:
    """Request Structs (messages, tools) as plain JSON values."""
    return msgspec.to_builtins(obj)


def template_prompt(
    info: ModelInfo,
    messages: Sequence[Any],
    tools: Sequence[Any] | None = None,
    *,
    add_generation_prompt: bool = True,
    template_kwargs: Mapping[str, Any] | None = None,
) -> ChatPrompt:
    """The engine's prompt (text and ids) for a conversation (messages as Structs or
    dicts); ``template_kwargs``: extra template variables (``enable_thinking``...)."""
    return info.fmt().chat(
        image_parts(plain(list(messages))),
        tools=plain(list(tools)) if tools else None,
        add_generation_prompt=add_generation_prompt,
        template_kwargs=template_kwargs,
    )


def chat_ids(
    info: ModelInfo,
    messages: Sequence[Any],
    tools: Sequence[Any] | None = None,
    *,
    add_generation_prompt: bool = True,
) -> list[int]:
    """The engine's prompt ids for a conversation (messages as Structs or dicts) on a route
    that takes no images (they would be dropped): an image is a 400 naming the ones that do."""
    prompt = template_prompt(info, messages, tools, add_generation_prompt=add_generation_prompt)
    if prompt.images:
        raise ImageError(
            "this route takes no images; send them to /v1/chat/completions, /v1/responses, "
            "/v1/messages or /api/chat",
            param="messages",
        )
    return prompt.ids


def text_ids(info: ModelInfo, prompt: str | Sequence[int], param: str = "prompt") -> list[int]:
    """A raw prompt's ids (special tokens parsed, as llama.cpp), or checked token ids."""
    if isinstance(prompt, str):
        return info.fmt().encode(prompt)
    ids = [int(t) for t in prompt]
    check_ids(ids, info, param)
    return ids


def check_ids(ids: list[int], info: ModelInfo, param: str) -> None:
    """Reject token ids outside the vocabulary (400 naming ``param``)."""
    bad = [i for i in ids if not 0 <= i < info.n_vocab]
    if bad:
        raise ParamError(
            f"token id {bad[0]} is outside the vocabulary 0..{info.n_vocab - 1}", param=param
        )


def llama_normalize(vecs: np.ndarray[Any, Any], norm: int) -> np.ndarray[Any, Any]:
    """Rows of ``vecs`` scaled as llama.cpp's ``embd_normalize`` says: -1 none, 0 by the
    largest magnitude over 32760 (the int16 range), 1 to unit taxicab length, 2 to unit
    euclidean length, p > 2 to unit p-norm (common_embd_normalize); a zero row stays zero."""
    if norm < 0:
        return vecs
    v = vecs.astype(np.float64)
    if norm == 0:
        s = np.abs(v).max(axis=1) / 32760.0
    elif norm == 1:
        s = np.abs(v).sum(axis=1)
    elif norm == 2:
        s = np.sqrt((v * v).sum(axis=1))
    else:
        s = (np.abs(v) ** norm).sum(axis=1) ** (1.0 / norm)
    scale = np.divide(1.0, s, out=np.zeros_like(s), where=s > 0)
    out: np.ndarray[Any, Any] = (vecs * scale[:, None].astype(np.float32)).astype(np.float32)
    return out


def embed_inputs(
    inp: Any, info: ModelInfo, param: str = "input", truncate: bool = False
) -> list[list[int]]:
    """Token-id lists for an embeddings ``input`` (string, strings, ids or id lists); a
    string as the engine encodes a raw prompt, special tokens parsed ("query [SEP] passage"
    gives [SEP]'s id), as llama.cpp's server and transformers' tokenizers do.  An input
    longer than the context is refused, or with ``truncate`` cut to it."""
    fmt = info.fmt()
    items: list[Any] = [inp] if isinstance(inp, str) else list(inp)
    if items and all(isinstance(x, int) for x in items):
        items = [items]
    batch = []
    for j, x in enumerate(items):
        if isinstance(x, str):
            ids = fmt.encode(x)
        elif isinstance(x, list):
            ids = [int(t) for t in x]
            check_ids(ids, info, f"{param}[{j}]")
        else:
            raise ParamError(f"{param} mixes strings and token ids; send one kind", param=param)
        if not ids:
            raise ParamError(f"{param}[{j}] is empty", param=f"{param}[{j}]")
        if len(ids) > info.n_ctx and truncate:  # Ollama's truncate: the first n_ctx tokens,
            # a text's end-of-text token ([SEP]) kept last, as transformers' truncation keeps it
            end = ids[-1:] if isinstance(x, str) and ids[-1] == fmt.tokenizer.eos_id else []
            ids = ids[: info.n_ctx - len(end)] + end
        if len(ids) > info.n_ctx:
            raise ParamError(
                f"{param}[{j}] is {len(ids)} tokens; the model takes at most {info.n_ctx}",
                param=f"{param}[{j}]",
            )
        batch.append(ids)
    return batch


# --- sampling ----------------------------------------------------------------------------
def stop_list(stop: str | Sequence[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else [s for s in stop if s]


def logit_bias(bias: Mapping[str, float] | None, n_vocab: int) -> dict[int, float]:
    out: dict[int, float] = {}
    for k, v in (bias or {}).items():
        try:
            tok = int(k)
        except ValueError:
            raise ParamError(
                f"logit_bias keys must be token ids, got {k!r}", param="logit_bias"
            ) from None
        if not 0 <= tok < n_vocab:
            raise ParamError(
                f"logit_bias token id {tok} is outside the vocabulary 0..{n_vocab - 1}",
                param="logit_bias",
            )
        out[tok] = v
    return out


def sampling(
    info: ModelInfo,
    given: Sampling,
    *,
    max_tokens: int | None,
    logprobs: int | None = None,
) -> SamplingParams:
    """The request's sampling settings (a dialect's fields as :class:`Sampling`, None
    where it gave none) over the model's defaults."""
    fmt = info.fmt()
    params = fmt.defaults.params(
        given.values(),
        max_tokens=max_tokens,
        stop=stop_list(given.stop),
        seed=given.seed,
        logit_bias=logit_bias(given.logit_bias, info.n_vocab),
        logprobs=logprobs,
    )
    if params.dry_multiplier > 0:  # llama.cpp's default breakers: newline, colon, quote, star
        params.dry_breaker_ids = fmt.breaker_ids(
            given.dry_sequence_breakers or ["\n", ":", '"', "*"]
        )
    return params


def make_requests(
    base_id: str,
    prompt_ids: list[int],
    params: SamplingParams,
    n: int = 1,
    constraint: Constraint | None = None,
    ignore_eos: bool = False,
    prompt_logprobs: int | None = None,
    progress: bool = False,
    speculative: bool | None = None,
    images: tuple[ImageSpan, ...] = (),
) -> list[GenerationRequest]:
    """``n`` requests for one prompt (seeds ``seed``, ``seed + 1`` ... when seeded)."""
    return [
        GenerationRequest(
            request_id=f"{base_id}-{i}",
            prompt_ids=list(prompt_ids),
            sampling=dataclasses.replace(
                params,
                stop=list(params.stop),
                stop_token_ids=list(params.stop_token_ids),
                logit_bias=dict(params.logit_bias),
                seed=params.seed + i if params.seed is not None else None,
            ),
            constraint=constraint,
            ignore_eos=ignore_eos,
            prompt_logprobs=prompt_logprobs,
            progress=progress,
            speculative=speculative is not False,
            images=images,
        )
        for i in range(n)
    ]


def submit_all(
    engine: Engine, reqs: list[GenerationRequest], prompt_param: str = "prompt"
) -> list[RequestHandle]:
    """Submit every request, or none: a refusal cancels those already queued.

    The engine names a bad prompt ``prompt``; ``prompt_param`` is the request's own
    field for it (``messages`` for a chat).
    """
    handles: list[RequestHandle] = []
    try:
        for r in reqs:
            handles.append(engine.submit(r))
    except UsageError as e:
        for h in handles:
            h.cancel()
        if e.param == "prompt" and prompt_param != "prompt":
            e.param = prompt_param
        raise
    except BaseException:
        for h in handles:
            h.cancel()
        raise
    return handles


# --- answering ---------------------------------------------------------------------------
@dataclass(slots=True)
class Outcome:
    """Everything one engine request produced."""

    text: str = ""
    tokens: list[TokenEvent] = field(default_factory=list)
    finish: FinishEvent = field(default_factory=lambda: FinishEvent(FinishReason.ERROR))
    prompt: PromptEvent | None = None  # the prompt's log-probabilities, when asked for

    @property
    def reason(self) -> str:
        return FINISH.get(self.finish.reason, "stop")

    @property
    def cum_logprob(self) -> float:
        return sum(
            t.logprob for t in self.tokens if t.logprob is not None and not math.isnan(t.logprob)
        )


class Renderer(Protocol):
    """One API dialect's answer for the results of one request (``n`` engine requests).

    Streaming: ``start(i)`` before choice ``i``'s events, ``prompt(i, ev)`` for the
    prompt's log-probabilities when asked for, ``progress(i, ev)`` while the prompt is
    processed when asked for, ``token(i, ev)`` per token, ``finish(i,
    ev)`` at its end, ``end()`` after every choice; each returns the byte chunks to send.  ``ping`` is sent while nothing happens (None: nothing).
    Not streaming: ``body(outcomes)`` is the response object.
    """

    headers: dict[str, str]
    ping: bytes | None

    def start(self, i: int) -> list[bytes]: ...

    def prompt(self, i: int, ev: PromptEvent) -> list[bytes]: ...

    def progress(self, i: int, ev: ProgressEvent) -> list[bytes]: ...

    def token(self, i: int, ev: TokenEvent) -> list[bytes]: ...

    def finish(self, i: int, ev: FinishEvent) -> list[bytes]: ...

    def end(self) -> list[bytes]: ...

    def body(self, outs: list[Outcome]) -> Any: ...


class RendererBase:
    """Nothing before or after a choice, nothing for the prompt: override what differs."""

    __slots__ = ()

    def start(self, i: int) -> list[bytes]:
        return []

    def prompt(self, i: int, ev: PromptEvent) -> list[bytes]:
        return []

    def progress(self, i: int, ev: ProgressEvent) -> list[bytes]:
        return []

    def end(self) -> list[bytes]:
        return []


async def respond(
    handles: list[RequestHandle], r: Renderer, *, stream: bool, n_prompt: int
) -> Response:
    """Answer with ``r``: one body once every handle finished, or a stream of events."""
    c = ctx()
    record().prompt_tokens = n_prompt
    if stream:
        return stream_response(_stream(handles, r, c.metrics, c.state.ping_interval), r.headers)
    outs = await collect_all(handles, c.metrics)
    return json_response(r.body(outs))


async def collect(handle: RequestHandle, metrics: Metrics) -> Outcome:
    out = Outcome()
    parts: list[str] = []
    finish: FinishEvent | None = None
    metrics.active.inc()
    try:
        async for ev in handle:
            parts.append(ev.text)
            if isinstance(ev, TokenEvent):
                out.tokens.append(ev)
            elif isinstance(ev, PromptEvent):
                out.prompt = ev
            elif isinstance(ev, FinishEvent):
                finish = ev
    finally:
        handle.cancel()
        metrics.active.dec()
    out.text = "".join(parts)
    if finish is None:
        raise GenerationFailed("the engine ended the request without a finish event")
    out.finish = finish
    metrics.finished(finish)
    if finish.reason is FinishReason.ERROR:
        raise_failed(finish)
    record().add(finish, prompt=False)
    return out


async def collect_all(handles: list[RequestHandle], metrics: Metrics) -> list[Outcome]:
    results: list[Outcome | None] = [None] * len(handles)

    async def one(i: int) -> None:
        results[i] = await collect(handles[i], metrics)

    try:
        async with trio.open_nursery() as nursery:
            for i in range(len(handles)):
                nursery.start_soon(one, i)
    finally:
        for h in handles:
            h.cancel()
    return [r for r in results if r is not None]


async def _stream(
    handles: list[RequestHandle], r: Renderer, metrics: Metrics, ping: float
) -> AsyncIterator[bytes]:
    """The one stream loop: every streamed answer of every dialect comes out of here."""
    rec = record()
    metrics.active.inc(len(handles))
    try:
        for i, h in enumerate(handles):
            if r.ping is not None:  # a KeepAliveEvent after ``ping`` seconds with none
                h.keep_alive(ping)
            for b in r.start(i):
                yield b
            done = False
            while not done:
                try:
                    ev: Event | None = await h.next_event()
                except trio.EndOfChannel:
                    raise GenerationFailed(
                        "the engine ended the request without a finish event"
                    ) from None
                # the events that piled up while the client was being written to go out
                # as one write: a client that falls behind gets fewer, larger frames
                parts: list[bytes] = []
                while ev is not None:
                    if isinstance(ev, TokenEvent):
                        parts += r.token(i, ev)
                    elif isinstance(ev, PromptEvent):
                        parts += r.prompt(i, ev)
                    elif isinstance(ev, ProgressEvent):
                        parts += r.progress(i, ev)
                    elif isinstance(ev, KeepAliveEvent):
                        if r.ping is not None:
                            parts.append(r.ping)
                    else:
                        metrics.finished(ev)
                        if ev.reason is FinishReason.ERROR:
                            if parts:
                                yield b"".join(parts)
                            raise_failed(ev)
                        rec.add(ev, prompt=False)
                        parts += r.finish(i, ev)
                        done = True
                        break
                    ev = h.event_nowait()
                if parts:
                    metrics.stream_writes.inc()
                    yield b"".join(parts)
            h.cancel()
        for b in r.end():
            yield b
    finally:
        for h in handles:
            h.cancel()
        metrics.active.dec(len(handles))
