"""Translation between request bodies and engine messages, and event collection.

Nothing here generates: prompts are rendered and tokenized, sampling settings and
constraints are built into :class:`~modelc.engine.api.GenerationRequest`, and the
engine's events are gathered (:func:`collect`) or relayed (:class:`EventStream`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import trio

from modelc.engine.api import (
    Constraint,
    ConstraintKind,
    Engine,
    FinishEvent,
    FinishReason,
    GenerationRequest,
    RequestHandle,
    TokenEvent,
)
from modelc.errors import ModelcError
from modelc.runtime.chat_template import render_chat
from modelc.runtime.sampling import SamplingParams
from modelc.server import sse
from modelc.server import tools as tooling
from modelc.server.context import record
from modelc.server.errors import ParamError
from modelc.server.logging import logger
from modelc.server.metrics import Metrics
from modelc.server.schemas import ChatMessage, ResponseFormat, Sampling, Tool
from modelc.server.state import ModelInfo

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


def message_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.type != "text" or part.text is None:
                    raise ParamError(
                        f"content part type {part.type!r} is not supported (text only)",
                        param=f"messages[{i}].content[{j}].type",
                    )
                texts.append(part.text)
            content = "".join(texts)
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role}
        d["content"] = content or ""
        if m.name:
            d["name"] = m.name
        if m.tool_calls:
            calls: list[dict[str, Any]] = []
            for c in m.tool_calls:
                try:
                    args: Any = json.loads(c.function.arguments)
                except json.JSONDecodeError:
                    args = c.function.arguments
                calls.append(
                    {"type": "function", "function": {"name": c.function.name, "arguments": args}}
                )
            d["tool_calls"] = calls
            if not d["content"]:
                d["content"] = "\n".join(
                    "<tool_call>\n"
                    + json.dumps(
                        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                    )
                    + "\n</tool_call>"
                    for c in calls
                )
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def chat_prompt(
    info: ModelInfo,
    messages: Sequence[ChatMessage] | list[dict[str, Any]],
    tools: list[Tool] | None = None,
) -> tuple[str, list[int]]:
    """The rendered prompt and its token ids (the template adds any BOS itself)."""
    msgs: list[dict[str, Any]] = [
        m if isinstance(m, dict) else message_dicts([m])[0] for m in messages
    ]
    tool_list = None
    if tools:
        if tooling.template_uses_tools(info.chat_template):
            tool_list = tooling.tool_dicts(tools)
        else:
            sys_text = tooling.system_prompt(tools)
            if msgs and msgs[0]["role"] == "system":
                msgs[0] = {**msgs[0], "content": f"{msgs[0]['content']}\n\n{sys_text}"}
            else:
                msgs.insert(0, {"role": "system", "content": sys_text})
    text = render_chat(
        info.chat_template,
        msgs,
        add_generation_prompt=True,
        tools=tool_list,
        bos_token=info.bos_text,
        eos_token=info.eos_text,
    )
    return text, info.tok().encode(text, add_special=not info.chat_template)


def response_constraint(fmt: ResponseFormat | None) -> Constraint | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return Constraint(ConstraintKind.JSON_OBJECT)
    if fmt.json_schema is None or fmt.json_schema.schema is None:
        raise ParamError(
            "response_format json_schema needs json_schema.schema (a JSON Schema object)",
            param="response_format.json_schema",
        )
    return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(fmt.json_schema.schema))


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else [s for s in stop if s]


def logit_bias(bias: dict[str, float] | None, n_vocab: int) -> dict[int, float]:
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


def check_ids(ids: list[int], info: ModelInfo, param: str) -> None:
    """Reject token ids outside the vocabulary (400 naming ``param``)."""
    bad = [i for i in ids if i >= info.n_vocab]
    if bad:
        raise ParamError(
            f"token id {bad[0]} is outside the vocabulary 0..{info.n_vocab - 1}", param=param
        )


def embed_inputs(inp: Any, info: ModelInfo, param: str = "input") -> list[list[int]]:
    """Token-id lists for an embeddings ``input`` (string, strings, ids or id lists)."""
    tok = info.tok()
    items: list[Any] = [inp] if isinstance(inp, str) else list(inp)
    if items and all(isinstance(x, int) for x in items):
        items = [items]
    batch = []
    for j, x in enumerate(items):
        if isinstance(x, str):
            ids = tok.encode(x, add_special=True)
        elif isinstance(x, list):
            ids = [int(t) for t in x]
            check_ids(ids, info, f"{param}[{j}]")
        else:
            raise ParamError(f"{param} mixes strings and token ids; send one kind", param=param)
        if not ids:
            raise ParamError(f"{param}[{j}] is empty", param=f"{param}[{j}]")
        if len(ids) > info.n_ctx:
            raise ParamError(
                f"{param}[{j}] is {len(ids)} tokens; the model takes at most {info.n_ctx}",
                param=f"{param}[{j}]",
            )
        batch.append(ids)
    return batch


def check_budget(
    info: ModelInfo, n_prompt: int, max_tokens: int | None, param: str = "max_tokens"
) -> int:
    """The max_tokens to use: the request's, or what is left of the context."""
    room = info.n_ctx - n_prompt
    if room <= 0:
        raise ParamError(
            f"the prompt is {n_prompt} tokens but the context is {info.n_ctx}; shorten the prompt",
            param="messages" if param == "max_tokens" else param,
        )
    if max_tokens is None:
        return room
    return min(max_tokens, room)


def sampling_params(
    o: Sampling, info: ModelInfo, max_tokens: int, logprobs: int | None = None
) -> SamplingParams:
    """The engine's sampling settings for a request's :class:`Sampling` fields."""
    return SamplingParams(
        temperature=o.temperature,
        top_k=o.top_k,
        top_p=o.top_p,
        min_p=o.min_p,
        repetition_penalty=o.repetition_penalty,
        presence_penalty=o.presence_penalty,
        frequency_penalty=o.frequency_penalty,
        logit_bias=logit_bias(o.logit_bias, info.n_vocab),
        seed=o.seed,
        logprobs=logprobs,
        max_tokens=max_tokens,
        stop=stop_list(o.stop),
        stop_token_ids=list(info.stop_ids),
    )


def make_requests(
    base_id: str,
    prompt_ids: list[int],
    sampling: SamplingParams,
    n: int,
    constraint: Constraint | None = None,
    ignore_eos: bool = False,
) -> list[GenerationRequest]:
    reqs = []
    for i in range(n):
        sp = dataclasses.replace(
            sampling,
            stop=list(sampling.stop),
            stop_token_ids=list(sampling.stop_token_ids),
            logit_bias=dict(sampling.logit_bias),
            seed=sampling.seed + i if sampling.seed is not None else None,
        )
        reqs.append(
            GenerationRequest(
                request_id=f"{base_id}-{i}",
                prompt_ids=list(prompt_ids),
                sampling=sp,
                constraint=constraint,
                ignore_eos=ignore_eos,
            )
        )
    return reqs


@dataclass(slots=True)
class Outcome:
    """Everything one engine request produced."""

    text: str = ""
    tokens: list[TokenEvent] = field(default_factory=list)
    finish: FinishEvent | None = None

    @property
    def reason(self) -> str:
        assert self.finish is not None
        return FINISH.get(self.finish.reason, "stop")

    @property
    def cum_logprob(self) -> float:
        return sum(
            t.logprob for t in self.tokens if t.logprob is not None and not math.isnan(t.logprob)
        )


def submit_all(engine: Engine, reqs: list[GenerationRequest]) -> list[RequestHandle]:
    """Submit every request, or none: a refusal cancels those already queued."""
    handles: list[RequestHandle] = []
    try:
        for r in reqs:
            handles.append(engine.submit(r))
    except BaseException:
        for h in handles:
            h.cancel()
        raise
    return handles


async def collect(handle: RequestHandle, metrics: Metrics) -> Outcome:
    out = Outcome()
    parts: list[str] = []
    metrics.active.inc()
    try:
        async for ev in handle:
            if isinstance(ev, TokenEvent):
                out.tokens.append(ev)
                parts.append(ev.text)
            else:
                parts.append(ev.text)
                out.finish = ev
    finally:
        handle.cancel()
        metrics.active.dec()
    out.text = "".join(parts)
    if out.finish is None:
        raise GenerationFailed("the engine ended the request without a finish event")
    metrics.finished(out.finish)
    if out.finish.reason is FinishReason.ERROR:
        raise_failed(out.finish)
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


class EventStream:
    """Relays a handle's events through a channel so the reader can wait with a timeout.

    A pump task in the app's nursery reads the handle; :meth:`next` returns the next
    event, or None when ``timeout`` passes first (the caller sends a ``: ping``).
    :meth:`close` cancels the engine request (client gone or stream done).
    """

    def __init__(self, handle: RequestHandle, nursery: trio.Nursery, metrics: Metrics) -> None:
        self.handle = handle
        self.metrics = metrics
        self.send, self.recv = trio.open_memory_channel[TokenEvent | FinishEvent](math.inf)
        metrics.active.inc()
        self._closed = False
        nursery.start_soon(self._pump)

    async def _pump(self) -> None:
        async with self.send:
            try:
                async for ev in self.handle:
                    self.send.send_nowait(ev)
                    if isinstance(ev, FinishEvent):
                        self.metrics.finished(ev)
            except Exception as e:  # one failing request must not take the app's nursery down
                logger().error("engine_stream_error", error=repr(e))
                self.send.send_nowait(
                    FinishEvent(FinishReason.ERROR, error=f"{type(e).__name__}: {e}")
                )

    async def next(self, timeout: float) -> TokenEvent | FinishEvent | None:
        with trio.move_on_after(timeout):
            try:
                return await self.recv.receive()
            except trio.EndOfChannel:
                raise GenerationFailed(
                    "the engine ended the request without a finish event"
                ) from None
        return None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.handle.cancel()
            self.metrics.active.dec()


async def relay(
    st: EventStream,
    ping: float | None,
    token: Callable[[str], bytes],
    finish: Callable[[FinishEvent], list[bytes]],
) -> AsyncIterator[bytes]:
    """One request's events as a byte stream, closing ``st`` at the end.

    ``token(text)`` for each token with text, then the ``finish(event)`` chunks once the
    finish event is logged; an engine error raises :class:`GenerationFailed`.  Every
    ``ping`` seconds without an event sends ``sse.PING`` (None: wait without pinging).
    """
    try:
        while True:
            ev = await st.next(3600.0 if ping is None else ping)
            if ev is None:
                if ping is not None:
                    yield sse.PING
                continue
            if isinstance(ev, TokenEvent):
                if ev.text:
                    yield token(ev.text)
                continue
            if ev.reason.value == "error":
                raise_failed(ev)
            record().add(ev)
            for b in finish(ev):
                yield b
            return
    finally:
        st.close()
