"""modelc's own dialect: ``/complete`` and ``/chat`` bodies, ``/chat/stream`` events."""

from __future__ import annotations

from dataclasses import dataclass, field

from modelc.engine.api import FinishEvent, TokenEvent
from modelc.server import sse
from modelc.server.generation import FINISH, Outcome, RendererBase
from modelc.server.native.schemas import (
    NativeChatResponse,
    NativeCompleteResponse,
    NativeMessage,
    NativeStreamEvent,
    NativeUsage,
)


def usage(f: FinishEvent) -> NativeUsage:
    return NativeUsage(
        f.prompt_tokens,
        f.completion_tokens,
        f.prompt_tokens + f.completion_tokens,
        f.time_to_first_token,
        round(f.total_time, 6),
    )


@dataclass(slots=True)
class NativeRenderer(RendererBase):
    """``/complete`` and ``/chat`` bodies; ``/chat/stream`` events (``delta``, then usage)."""

    model: str
    chat: bool
    headers: dict[str, str] = field(default_factory=lambda: sse.HEADERS)
    ping: bytes | None = sse.PING

    def token(self, i: int, ev: TokenEvent) -> list[bytes]:
        return [sse.event(NativeStreamEvent(delta=ev.text))] if ev.text else []

    def finish(self, i: int, ev: FinishEvent) -> list[bytes]:
        last = NativeStreamEvent(
            delta=ev.text, finish_reason=FINISH.get(ev.reason, "stop"), usage=usage(ev)
        )
        return [sse.event(last)]

    def end(self) -> list[bytes]:
        return [sse.DONE]

    def body(self, outs: list[Outcome]) -> NativeCompleteResponse | NativeChatResponse:
        o = outs[0]
        if self.chat:
            msg = NativeMessage("assistant", o.text)
            return NativeChatResponse(msg, o.reason, usage(o.finish), self.model)
        return NativeCompleteResponse(o.text, o.reason, usage(o.finish), self.model)
