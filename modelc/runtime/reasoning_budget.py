"""A token budget for a thinking trace, as llama.cpp's ``common/reasoning-budget.cpp``.

``--reasoning-budget N`` / a request's ``reasoning_budget_tokens``: -1 leaves the trace
alone; N >= 0 lets N tokens follow the start tag (``<think>``), then forces the end-of-
trace sequence (a message, if given, then the end tag: ``reasoning_budget_message``).
0 therefore ends a trace as soon as it opens (the template is rendered as usual: in this
llama.cpp ``enable_thinking`` is a separate switch).  The state machine:

* IDLE: waiting for the start tag (token ids); then COUNTING with the full budget
  (0: FORCING at once);
* COUNTING: an end tag ends it (DONE); each other token spends one; at 0, FORCING, or
  first WAITING_UTF8 while the last token left a UTF-8 character unfinished;
* FORCING: each step allows only the next forced token; after the last one, DONE;
* DONE: a new start tag opens a new budget window.

The generation prompt's tokens go through the machine first (llama.cpp's prefill), so a
trace the prompt opened (Qwen3.5, DeepSeek-R1: ``<think>\\n``) is counted from there.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


class BudgetState(enum.Enum):
    IDLE = "idle"
    COUNTING = "counting"
    WAITING_UTF8 = "waiting_utf8"
    FORCING = "forcing"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class ReasoningBudget:
    """A request's budget: ``tokens`` (>= 0) after ``start``; then ``forced`` (the
    message and the first of ``ends``); ``prefill``: the generation prompt's ids."""

    tokens: int
    start: tuple[int, ...]
    ends: tuple[tuple[int, ...], ...]
    forced: tuple[int, ...]
    prefill: tuple[int, ...] = ()
    # the tokens whose text ends inside a UTF-8 character (the force waits past them)
    incomplete: frozenset[int] = frozenset()


class _Matcher:
    """Whether a sequence of ``seqs`` ends at the token just fed (forgetting what came
    before a match, as llama.cpp's Aho-Corasick matcher resets)."""

    def __init__(self, seqs: Sequence[Sequence[int]]) -> None:
        self.seqs = [tuple(s) for s in seqs if s]
        self.longest = max((len(s) for s in self.seqs), default=0)
        self.recent: list[int] = []

    def advance(self, token: int) -> bool:
        self.recent = [*self.recent, token][-self.longest :] if self.longest else []
        if any(tuple(self.recent[-len(s) :]) == s for s in self.seqs if len(s) <= len(self.recent)):
            self.recent = []
            return True
        return False

    def reset(self) -> None:
        self.recent = []


def utf8_complete(piece: bytes) -> bool:
    """True unless ``piece`` ends inside a multi-byte UTF-8 character."""
    for back in range(1, min(4, len(piece)) + 1):
        b = piece[-back]
        if b & 0xC0 == 0x80:  # a continuation byte: look further back
            continue
        need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4
        return back >= need
    return True


class BudgetSampler:
    """One request's budget: :meth:`forced_token` before sampling (the sampler takes it
    whatever the logits), :meth:`accept` after."""

    def __init__(self, spec: ReasoningBudget) -> None:
        self.spec = spec
        self.start = _Matcher([spec.start])
        self.end = _Matcher(spec.ends)
        self.state = BudgetState.IDLE
        self.remaining = spec.tokens
        self.force_pos = 0
        for t in spec.prefill:
            self.accept(t)

    def _open(self) -> None:
        self.remaining = self.spec.tokens
        self.end.reset()
        self.state = BudgetState.COUNTING
        if self.remaining <= 0:
            self._force()

    def _force(self) -> None:
        self.state = BudgetState.FORCING
        self.force_pos = 0
        self.end.reset()

    def forced_token(self) -> int | None:
        """The token this step must be (None: sample freely)."""
        if self.state is BudgetState.FORCING and self.force_pos < len(self.spec.forced):
            return self.spec.forced[self.force_pos]
        return None

    def accept(self, token: int) -> None:
        st = self.state
        if st in (BudgetState.IDLE, BudgetState.DONE):
            if self.start.advance(token):
                self._open()
        elif st in (BudgetState.COUNTING, BudgetState.WAITING_UTF8):
            if self.end.advance(token):
                self.state = BudgetState.DONE
                return
            complete = token not in self.spec.incomplete
            if st is BudgetState.WAITING_UTF8:
                if complete:
                    self._force()
            else:
                self.remaining -= 1
                if self.remaining <= 0:
                    if complete:
                        self._force()
                    else:
                        self.state = BudgetState.WAITING_UTF8
                        self.end.reset()
        else:  # FORCING
            self.end.advance(token)
            self.force_pos += 1
            if self.force_pos >= len(self.spec.forced):
                self.state = BudgetState.DONE
