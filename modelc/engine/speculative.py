"""Speculative decoding: cheap drafts, verified by the target model in one step.

A drafter proposes up to ``gamma`` tokens that follow a sequence; the engine feeds
``[last token, d1 .. dk]`` in one forward pass and gets ``k + 1`` rows of logits.
:func:`verify` walks them in order:

* greedy (temperature 0): ``d_i`` is accepted while it equals the argmax of the
  processed logits at its position; the first mismatch is replaced by that argmax,
  and when all match the last row gives a bonus token.  The output is therefore the
  very sequence plain greedy decoding would produce.
* sampling: the drafts are deterministic (a point-mass proposal ``q``), so rejection
  sampling reduces to: accept ``d_i`` with probability ``p(d_i)``; on rejection draw
  from ``p`` with ``d_i`` removed (the normalised ``max(p - q, 0)``).  Every emitted
  token is distributed exactly as the target's ``p``.

The engine drafts only for requests without a constraint (a grammar would have to
check each draft token first) and never past ``max_tokens`` or the context. By default
(``--speculate auto``) :mod:`modelc.engine.spec_control` decides per request and per
step whether drafting pays and how many tokens to verify; ``fixed`` verifies every
draft of up to ``spec_gamma`` tokens. Acceptance is counted per request
(``FinishEvent.spec_drafted`` / ``spec_accepted``) and in ``EngineStats``.

Drafters (all per request, built from its prompt):

* :class:`PromptLookup` (default): find the latest earlier occurrence of the
  sequence's last n-gram (n = 3, 2, 1) and propose what followed it; strong when the
  output copies the input (code editing, extraction, summaries with quotes).
* :class:`NGramDraft`: a table of n-gram -> most recent continuation over the
  sequence so far, chained greedily.
* :class:`MLPDraft`: a small neural draft head stored in the model as ``draft.*``
  tensors: ``logits = draft.out.weight @ silu(draft.fc.weight @ embd(last) + draft.fc.bias)``
  with ``embd`` the model's token embedding; chained greedily.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from modelc.errors import FormatError, UsageError
from modelc.formats.ir import ModelIR
from modelc.runtime.backend import Backend, F32Array
from modelc.runtime.model import TensorSource
from modelc.runtime.sampling import Sample, Sampler


class DraftKind(enum.StrEnum):
    PROMPT_LOOKUP = "prompt-lookup"
    NGRAM = "ngram"
    MLP = "mlp"


class Drafter(Protocol):
    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that may follow ``tokens`` (possibly none)."""
        ...

    def lookup(self, tokens: Sequence[int], k: int) -> tuple[list[int], int]:
        """``propose`` and how the draft was found: the length of the matched n-gram for
        prompt lookup, 0 for the drafters without one (the adaptive controller keeps an
        acceptance estimate per value)."""
        ...


class PromptLookup:
    """The latest earlier occurrence of the last n-gram, from an index of every n-gram
    seen (updated as tokens arrive, so a lookup costs microseconds at any length).

    ``tokens`` must grow by appending between calls (the engine makes a new drafter
    after a context shift); a shorter sequence, or one whose last indexed token
    changed, rebuilds the index.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        # n -> n-gram -> index just after its latest occurrence
        self._index: dict[int, dict[tuple[int, ...], int]] = {}
        self._seen: list[int] = []  # the tokens indexed so far

    def _update(self, tokens: Sequence[int]) -> None:
        # only n-grams that end before the last token: the tail must not match itself
        end = len(tokens) - 1
        done = len(self._seen)
        if done > end or (done and int(tokens[done - 1]) != self._seen[-1]):  # cheap check
            self._index, self._seen, done = {}, [], 0
        new = [int(t) for t in tokens[done:end]]
        seen = self._seen
        seen += new
        for n in range(self.min_ngram, self.max_ngram + 1):
            idx = self._index.setdefault(n, {})
            for e in range(max(done, n - 1), end):  # n-gram seen[e - n + 1 .. e]
                idx[tuple(seen[e - n + 1 : e + 1])] = e + 1

    def lookup(self, tokens: Sequence[int], k: int) -> tuple[list[int], int]:
        self._update(tokens)
        n_tok = len(tokens)
        for n in range(min(self.max_ngram, n_tok - 1), self.min_ngram - 1, -1):
            start = self._index[n].get(tuple(int(t) for t in tokens[n_tok - n :]))
            if start is not None:
                return [int(t) for t in tokens[start : start + k]], n
        return [], 0

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        return self.lookup(tokens, k)[0]


class NGramDraft:
    """n-gram -> the token that followed it most recently, updated as tokens arrive."""

    def __init__(self, n: int = 2) -> None:
        self.n = n
        self.table: dict[tuple[int, ...], int] = {}
        self.seen = 0

    def _update(self, tokens: Sequence[int]) -> None:
        for i in range(max(self.seen, self.n), len(tokens)):
            self.table[tuple(tokens[i - self.n : i])] = int(tokens[i])
        self.seen = len(tokens)

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        self._update(tokens)
        ctx = list(tokens[-self.n :])
        out: list[int] = []
        while len(out) < k and len(ctx) == self.n:
            nxt = self.table.get(tuple(ctx))
            if nxt is None:
                break
            out.append(nxt)
            ctx = [*ctx[1:], nxt]
        return out

    def lookup(self, tokens: Sequence[int], k: int) -> tuple[list[int], int]:
        return self.propose(tokens, k), 0


@dataclass(slots=True)
class MLPDraftWeights:
    embd: F32Array  # (vocab, d) dequantized token embedding
    fc: F32Array  # (hidden, d)
    fc_bias: F32Array  # (hidden,)
    out: F32Array  # (vocab, hidden)

    @staticmethod
    def has(ir: ModelIR) -> bool:
        return any(name.startswith("draft.") for name in ir.tensors)

    @classmethod
    def from_ir(cls, ir: ModelIR, backend: Backend) -> MLPDraftWeights:
        src = TensorSource(ir)
        embd_w = src.weight("token_embd.weight")
        embd = backend.get_rows(embd_w, np.arange(embd_w.shape[0], dtype=np.int64))
        fc, out = src.array("draft.fc.weight"), src.array("draft.out.weight")
        bias = (
            src.vec("draft.fc.bias") if src.has("draft.fc.bias") else np.zeros(len(fc), np.float32)
        )
        if (
            fc.shape[1] != embd.shape[1]
            or out.shape != (embd.shape[0], fc.shape[0])
            or bias.shape != (len(fc),)
        ):
            raise FormatError(
                f"draft.* tensors do not fit the model: fc {fc.shape}, out {out.shape}, "
                f"bias {bias.shape} for embedding {embd.shape}",
                path=ir.source.path,
            )
        return cls(np.ascontiguousarray(embd, np.float32), fc, bias, out)


class MLPDraft:
    def __init__(self, w: MLPDraftWeights) -> None:
        self.w = w

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        out: list[int] = []
        last = int(tokens[-1])
        for _ in range(k):
            h = self.w.fc @ self.w.embd[last] + self.w.fc_bias  # (hidden,)
            h = h / (1.0 + np.exp(-h))  # silu
            last = int(np.argmax(self.w.out @ h))
            out.append(last)
        return out

    def lookup(self, tokens: Sequence[int], k: int) -> tuple[list[int], int]:
        return self.propose(tokens, k), 0


def make_drafter(kind: DraftKind | str, mlp: MLPDraftWeights | None = None) -> Drafter:
    kind = DraftKind(kind)
    if kind is DraftKind.PROMPT_LOOKUP:
        return PromptLookup()
    if kind is DraftKind.NGRAM:
        return NGramDraft()
    if mlp is None:
        raise UsageError("the MLP draft needs draft.* tensors in the model; it has none")
    return MLPDraft(mlp)


def verify(sampler: Sampler, logits: F32Array, draft: Sequence[int]) -> list[Sample]:
    """Accepted drafts plus one corrected or bonus token; ``logits`` (len(draft)+1, vocab).

    Calls ``sampler.accept`` for every returned token (the penalties see each one
    before the next row is processed, as in plain decoding).
    """
    out: list[Sample] = []
    greedy = sampler.p.temperature == 0
    for i, row in enumerate(logits):
        d = int(draft[i]) if i < len(draft) else None
        if d is None:
            s = sampler.sample(row)
        elif greedy:
            s = sampler.sample(row)
            if s.token == d:
                out.append(s)
                sampler.accept(s.token)
                continue
        else:
            probs = sampler.probs(sampler.process(row))
            if sampler.rng.random() < probs[d]:
                s = _with_logprob(sampler, row, d)
                out.append(s)
                sampler.accept(d)
                continue
            probs[d] = 0.0
            total = probs.sum()
            tok = int(sampler.rng.choice(len(probs), p=probs / total)) if total > 0 else d
            s = _with_logprob(sampler, row, tok)
        out.append(s)
        sampler.accept(s.token)
        return out
    raise AssertionError("unreachable: the last row always emits a token")


def _with_logprob(sampler: Sampler, row: F32Array, tok: int) -> Sample:
    """A Sample for ``tok`` with the logprob fields the request asked for."""
    if sampler.p.logprobs is None:
        return Sample(tok, float("nan"))
    from modelc.runtime.sampling import log_softmax

    lp = log_softmax(row)
    top: tuple[tuple[int, float], ...] = ()
    if sampler.p.logprobs:
        idx = np.argpartition(-lp, sampler.p.logprobs)[: sampler.p.logprobs]
        idx = idx[np.argsort(-lp[idx], kind="stable")]
        top = tuple((int(i), float(lp[i])) for i in idx)
    return Sample(tok, float(lp[tok]), top)
