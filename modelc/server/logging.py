"""structlog JSON access log on stderr: one line per request.

Fields: ``request_id``, ``method``, ``endpoint``, ``status``, ``client``, and for
generation requests ``prompt_tokens``, ``completion_tokens``, ``ttft_s``; always
``total_s``.  A streamed response is logged when its stream ends.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from modelc.engine.api import FinishEvent


def configure(level: int = logging.INFO) -> None:
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def logger() -> Any:
    return structlog.get_logger("modelc.server")


@dataclass(slots=True)
class AccessRecord:
    """Filled in while a request is handled; written once at its end."""

    request_id: str
    method: str
    endpoint: str
    client: str
    start: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    streaming: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    written: bool = False
    # run once when the request is over (its response or stream done): model releases
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def add(self, f: FinishEvent, *, prompt: bool = True) -> None:
        """Count a finished generation (its prompt too, unless the caller counts prompts)."""
        if prompt:
            self.prompt_tokens += f.prompt_tokens
        self.completion_tokens += f.completion_tokens
        ttft = f.time_to_first_token
        if ttft is not None and (self.ttft_s is None or ttft < self.ttft_s):
            self.ttft_s = ttft

    def write(self, status: int, end: float) -> None:
        if self.written:
            return
        self.written = True
        for fn in self.cleanup:
            fn()
        logger().info(
            "access",
            request_id=self.request_id,
            method=self.method,
            endpoint=self.endpoint,
            status=status,
            client=self.client,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            ttft_s=None if self.ttft_s is None else round(self.ttft_s, 4),
            total_s=round(end - self.start, 4),
            **self.extra,
        )
