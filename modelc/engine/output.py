"""Generated ids -> text deltas, cut at stop strings: the one place output text is made.

One :class:`TextOutput` per request.  :meth:`TextOutput.push` takes each generated
(non-stop) token and returns the text it completes: the tokenizer's incremental
decoder never splits a UTF-8 character, and text that could be the start of a stop
string is held back until it is known not to be.  When a stop string appears the
text is cut before it.  :meth:`TextOutput.close` releases what is held back at the
end (unless a stop string matched).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class StreamDecoder(Protocol):
    """The tokenizer's incremental decoder: ids in, UTF-8-safe text deltas out."""

    def feed(self, ids: int) -> str: ...

    def flush(self) -> str: ...


class StopMatcher:
    """Cuts text before the first stop string; holds back possible partial matches."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.word = ""  # the stop string that matched

    def push(self, text: str) -> tuple[str, bool]:
        """(text safe to emit now, whether a stop string matched)."""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        hits = [(i, s) for s in self.stops if (i := self.pending.find(s)) >= 0]
        if hits:
            at, self.word = min(hits, key=lambda h: h[0])
            out, self.pending = self.pending[:at], ""
            return out, True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.pending)), hold, -1):
                if self.pending.endswith(s[:k]):
                    hold = k
                    break
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class TextOutput:
    """A request's text: detokenization plus stop strings (see the module docstring)."""

    def __init__(self, decoder: StreamDecoder | None, stops: Sequence[str]) -> None:
        self.decoder = decoder
        self.stops = StopMatcher(stops)
        self.matched = False  # a stop string ended the text

    def push(self, token: int) -> str:
        """The text ``token`` completes (``matched`` turns True on a stop string)."""
        text = self.decoder.feed(token) if self.decoder is not None else ""
        if not self.stops.stops:  # nothing held back, nothing to match
            return text
        out, self.matched = self.stops.push(text)
        return out

    def close(self) -> str:
        """What is still held back, at the end of generation ("" after a stop string)."""
        if self.matched:
            return ""
        tail, self.matched = self.stops.push(self.decoder.flush() if self.decoder else "")
        return tail if self.matched else tail + self.stops.flush()
