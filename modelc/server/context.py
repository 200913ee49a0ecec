"""Per-app objects the handlers reach through ``current_app``, and body decoding."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import trio
from quart import Response, current_app, request, stream_with_context

from modelc.engine.api import Engine
from modelc.errors import ModelcError
from modelc.server import sse
from modelc.server.auth import RateLimiter
from modelc.server.errors import error_shape, to_error
from modelc.server.logging import AccessRecord
from modelc.server.metrics import Metrics
from modelc.server.models import Need
from modelc.server.responses.store import ResponseStore
from modelc.server.schemas import DECODERS, ENCODER
from modelc.server.state import ModelInfo, ServerState

T = TypeVar("T")


@dataclass(slots=True)
class AppContext:
    state: ServerState
    metrics: Metrics
    limiter: RateLimiter
    responses: ResponseStore = field(default_factory=ResponseStore)  # /v1/responses' kept ones


def ctx() -> AppContext:
    return cast(AppContext, current_app.extensions["modelc"])


def nursery() -> trio.Nursery:
    return cast(trio.Nursery, current_app.nursery)  # type: ignore[attr-defined]


ACCESS: ContextVar[AccessRecord] = ContextVar("modelc_access")


def record() -> AccessRecord:
    """This request's access-log record (a context variable: streams run in the handler's task)."""
    return ACCESS.get()


async def use_model(
    requested: str | None, need: Need = "any", keep_alive: float | None = None
) -> tuple[ModelInfo, Engine]:
    """The model a request names (loading it if needed), held until the request ends.

    404 for a model neither served nor in the store; 400 if it cannot do what the
    endpoint ``need`s; when the response is done the model stays loaded ``keep_alive``
    seconds (None: the model's own keep-alive).
    """
    models = ctx().state.models
    slot = await models.acquire(requested, need)
    record().cleanup.append(lambda: models.release(slot, keep_alive))
    assert slot.info is not None and slot.engine is not None
    return slot.info, slot.engine


async def body(kind: type[T]) -> T:
    """Decode and validate the request body as ``kind`` (errors become 400s)."""
    data = await request.get_data(cache=False)
    assert isinstance(data, bytes)
    return cast(T, DECODERS[kind].decode(data))


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(ENCODER.encode(obj), status=status, content_type="application/json")


def stream_response(gen: AsyncIterator[bytes], headers: dict[str, str]) -> Response:
    """A streamed body with no response timeout; the access log is written when it ends."""
    rec = record()
    rec.streaming = True
    status = 200
    shape = error_shape(request.path)

    @stream_with_context
    async def wrapped() -> AsyncIterator[bytes]:
        nonlocal status
        try:
            async for chunk in gen:
                yield chunk
        except ModelcError as e:  # after the headers: report in-band, then end the stream
            st, payload, _ = to_error(e, shape=shape)
            status = st
            if shape == "anthropic":  # Anthropic's stream reports an ``error`` event
                yield b"event: error\ndata: " + payload + b"\n\n"
            elif headers is sse.HEADERS:
                yield b"data: " + payload + b"\n\n" + sse.DONE
            else:
                yield payload + b"\n"
        finally:
            await gen.aclose()  # type: ignore[attr-defined]
            rec.write(status, time.perf_counter())

    resp = Response(wrapped(), status=200, headers=headers)
    resp.timeout = None
    return resp
