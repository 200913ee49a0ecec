"""The scheduler's state of one request, and how its events reach its reader.

Each step the scheduler asks of every decoding request whether its reader fell
``max_unread`` events behind (:meth:`RequestState.behind`); asking the channel
(``statistics()``, a new object a call) for 64 requests a step was a tenth of the
event loop's own work, so each request keeps an upper bound of its unread events
(``unread``: the channel's count when last asked, plus every event sent since) and asks
only once that bound reaches the limit: the answer is the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from modelc.engine.api import Event, GenerationRequest, TokenEvent
from modelc.engine.output import TextOutput
from modelc.engine.seq_run import SeqRun


@dataclass(eq=False)
class RequestState:
    """The scheduler's state of one request (the model's side is its ``seq``)."""

    req: GenerationRequest
    send: trio.MemorySendChannel[Event]
    seq: SeqRun  # the runner's state: tokens, sampler, KV cache, drafts
    prompt_tokens: int  # as submitted (before any context shift)
    max_new: int  # generated tokens allowed (the request's max_tokens, or the default cap)
    stop_ids: frozenset[int]  # ids that end the request (end of generation + its own)
    submitted: float
    output: TextOutput
    completion: int = 0
    first_token_at: float | None = None
    cancelled: bool = False
    prompt_lp_sent: bool = False
    stop_token: TokenEvent | None = None  # the end-of-generation token that ended it
    paused_at: float | None = None  # trio time its reader fell behind (the scheduler's _pace)
    held: list[TokenEvent] = field(default_factory=list)  # tokens not handed out yet
    held_since: float = 0.0  # when the oldest of them was made (trio's clock)
    unread: int = 0  # at least the events its reader has not taken (see the module docstring)
    sent: int = 0  # events sent so far
    keepalive: float | None = None  # seconds of silence before a KeepAliveEvent (its reader's)
    quiet_since: tuple[int, float] = (0, 0.0)  # ``sent`` when the keep-alive task last saw it

    def behind(self, max_unread: int) -> bool:
        """Whether ``max_unread`` or more sent events wait for the reader."""
        if self.unread < max_unread:  # the bound: the channel cannot hold that many
            return False
        self.unread = self.send.statistics().current_buffer_used
        return self.unread >= max_unread

    def send_event(self, ev: Event) -> None:
        """Hand ``ev`` to the reader; a reader gone (or full) cancels the request."""
        try:
            self.send.send_nowait(ev)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
            self.cancelled = True  # nobody reads any more
            return
        self.unread += 1
        self.sent += 1

    def release(self) -> None:
        """Hand the held tokens to the reader."""
        for ev in self.held:
            self.send_event(ev)
        self.held.clear()
