"""Server-sent events framed as OpenAI does: ``data: <json>`` lines, ``[DONE]``, ``: ping``."""

from __future__ import annotations

from typing import Any

from modelc.server.schemas import ENCODER

DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"
HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
NDJSON_HEADERS = {"Content-Type": "application/x-ndjson"}


def event(obj: Any) -> bytes:
    """One ``data:`` event carrying ``obj`` encoded as JSON."""
    return b"data: " + ENCODER.encode(obj) + b"\n\n"


def ndjson(obj: Any) -> bytes:
    """One newline-delimited JSON line (Ollama streaming)."""
    return ENCODER.encode(obj) + b"\n"


def named(name: str, obj: Any) -> bytes:
    """One event with an ``event:`` name and ``obj`` as its JSON ``data`` (the streams
    of Anthropic's Messages and OpenAI's Responses)."""
    return b"event: " + name.encode() + b"\ndata: " + ENCODER.encode(obj) + b"\n\n"
