"""Ollama's dialect: NDJSON chunks of ``/api/generate`` and ``/api/chat``, or the final one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from modelc.engine.api import FinishEvent, TokenEvent
from modelc.server import sse
from modelc.server.generation import FINISH, Outcome, RendererBase
from modelc.server.ollama.schemas import OllamaChatChunk, OllamaGenerateChunk


def done_fields(f: FinishEvent | None) -> dict[str, Any]:
    if f is None:
        return {}
    return {
        "done_reason": FINISH.get(f.reason, "stop"),
        "prompt_eval_count": f.prompt_tokens,
        "eval_count": f.completion_tokens,
        "total_duration": int(f.total_time * 1e9),
    }


Chunk = OllamaGenerateChunk | OllamaChatChunk


@dataclass(slots=True)
class OllamaRenderer(RendererBase):
    """NDJSON chunks, or the final chunk alone with the whole text.

    ``chunk(text, finish, ids)`` builds a chunk; ``finish`` is None until the last one,
    which also gets every token id generated (for ``/api/generate``'s ``context``).
    """

    chunk: Callable[[str, FinishEvent | None, list[int]], Chunk]
    headers: dict[str, str] = field(default_factory=lambda: sse.NDJSON_HEADERS)
    ping: bytes | None = None
    _ids: list[int] = field(default_factory=list)

    def token(self, i: int, ev: TokenEvent) -> list[bytes]:
        self._ids.append(ev.token_id)
        return [sse.ndjson(self.chunk(ev.text, None, []))] if ev.text else []

    def finish(self, i: int, ev: FinishEvent) -> list[bytes]:
        return [sse.ndjson(self.chunk(ev.text, ev, self._ids))]

    def body(self, outs: list[Outcome]) -> Chunk:
        o = outs[0]
        return self.chunk(o.text, o.finish, [t.token_id for t in o.tokens])
