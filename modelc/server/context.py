"""Per-app objects the handlers reach through ``current_app``, and body decoding."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import trio
from quart import Response, current_app, request, stream_with_context

from modelc.errors import ModelcError
from modelc.server import sse
from modelc.server.auth import RateLimiter
from modelc.server.errors import to_error
from modelc.server.logging import AccessRecord
from modelc.server.metrics import Metrics
from modelc.server.schemas import DECODERS, ENCODER
from modelc.server.state import ServerState

T = TypeVar("T")


@dataclass(slots=True)
class AppContext:
    state: ServerState
    metrics: Metrics
    limiter: RateLimiter


def ctx() -> AppContext:
    return cast(AppContext, current_app.extensions["modelc"])


def nursery() -> trio.Nursery:
    return cast(trio.Nursery, current_app.nursery)  # type: ignore[attr-defined]


ACCESS: ContextVar[AccessRecord] = ContextVar("modelc_access")


def record() -> AccessRecord:
    """This request's access-log record (a context variable: streams run in the handler's task)."""
    return ACCESS.get()


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

    @stream_with_context
    async def wrapped() -> AsyncIterator[bytes]:
        nonlocal status
        try:
            async for chunk in gen:
                yield chunk
        except ModelcError as e:  # after the headers: report in-band, then end the stream
            st, payload, _ = to_error(e)
            status = st
            if headers is sse.HEADERS:
                yield b"data: " + payload + b"\n\n" + sse.DONE
            else:
                yield payload + b"\n"
        finally:
            await gen.aclose()  # type: ignore[attr-defined]
            rec.write(status, time.perf_counter())

    resp = Response(wrapped(), status=200, headers=headers)
    resp.timeout = None
    return resp
