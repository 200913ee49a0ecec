"""Constrained decoding with llguidance: exact token masks from a regex, a JSON Schema,
"any JSON object", or a GBNF / Lark grammar.

The model's vocabulary is handed to llguidance as raw token bytes (control tokens
marked with a leading 0xFF, as llguidance's llama.cpp integration does), together
with our tokenizer's encode function; the resulting ``LLTokenizer`` is built once
per engine.  :func:`compile_constraint` turns a request's
:class:`~modelc.engine.api.Constraint` into an ``LLMatcher`` and raises
:class:`~modelc.errors.UsageError` if the grammar, regex or schema is invalid, so a
bad request is refused before any generation.

Per step, :meth:`ConstraintState.mask` sets every token the grammar forbids to
``-inf`` in the logits row (EOS is allowed exactly when the grammar accepts), and
:meth:`ConstraintState.accept` advances the matcher with the sampled token.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance as llg
import numpy as np

from modelc.engine.api import Constraint, ConstraintKind
from modelc.errors import UsageError
from modelc.json_schema import closed
from modelc.runtime.backend import F32Array
from modelc.runtime.tokenizer import CONTROL, Tokenizer

_BITS = np.arange(32, dtype=np.uint32)
# compact JSON (no free whitespace), so a sampled object cannot wander off in blank
# space before it closes; a schema's own "x-guidance" options still apply on top
_JSON_DEFAULTS: Any = {"whitespace_flexible": False}


class _VocabForLLG:
    """What ``llguidance.TokenizerWrapper`` reads: token bytes, special ids, an encoder."""

    def __init__(self, tok: Tokenizer, n_vocab: int) -> None:
        self.tok = tok
        self.eos_token_id = tok.eos_id if tok.eos_id is not None else 0
        self.bos_token_id = tok.bos_id
        pieces = []
        for i in range(n_vocab):
            if i >= tok.n_vocab:
                pieces.append(b"")
                continue
            p = tok.token_to_piece(i)
            pieces.append(b"\xff" + p if tok.types[i] == CONTROL else p)
        self.tokens = pieces
        self.special_token_ids = [i for i in range(tok.n_vocab) if tok.types[i] == CONTROL]

    def __call__(self, text: str | bytes) -> list[int]:
        s = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        return self.tok.encode(s, add_special=False)


def build_lltokenizer(tok: Tokenizer, n_vocab: int, stop_ids: set[int]) -> Any:
    """The llguidance tokenizer for our vocabulary (about 0.3 s; build once)."""
    eos = sorted(stop_ids) or ([tok.eos_id] if tok.eos_id is not None else [])
    wrapper = llg.TokenizerWrapper(_VocabForLLG(tok, n_vocab))
    return llg.LLTokenizer(wrapper, n_vocab=n_vocab, eos_token=eos or None)


def grammar_text(c: Constraint) -> str:
    """The llguidance grammar for a constraint; UsageError if its text is malformed."""
    try:
        if c.kind is ConstraintKind.REGEX:
            return str(llg.LLMatcher.grammar_from_regex(c.value))
        if c.kind is ConstraintKind.JSON_SCHEMA:
            try:
                schema = json.loads(c.value)
            except json.JSONDecodeError as e:
                raise UsageError(f"the JSON schema is not valid JSON: {e}") from e
            if not isinstance(schema, (dict, bool)):
                raise UsageError("a JSON schema must be a JSON object (or true/false)")
            # objects closed as llama.cpp's converter closes them (modelc/json_schema.py)
            text = json.dumps(closed(schema))
            return str(llg.LLMatcher.grammar_from_json_schema(text, _JSON_DEFAULTS))
        if c.kind is ConstraintKind.JSON_OBJECT:
            return str(llg.LLMatcher.grammar_from_json_schema('{"type": "object"}', _JSON_DEFAULTS))
        if c.kind is ConstraintKind.GRAMMAR:
            return str(llg.grammar_from("grammar", c.value))  # GBNF or Lark, detected
    except ValueError as e:
        raise UsageError(f"invalid {c.kind.value} constraint: {e}") from e
    raise UsageError(f"unknown constraint kind {c.kind!r}")


class ConstraintState:
    """One request's matcher; see the module docstring."""

    def __init__(self, lltok: Any, c: Constraint, n_vocab: int) -> None:
        self.kind = c.kind
        grammar = grammar_text(c)
        self.matcher = llg.LLMatcher(lltok, grammar, log_level=0)
        if self.matcher.is_error():
            raise UsageError(
                f"invalid {c.kind.value} constraint: {self.matcher.get_error().strip()}"
            )
        self.n_vocab = n_vocab

    def mask(self, logits: F32Array) -> None:
        """Forbidden tokens of ``logits`` (n_vocab,) set to -inf, in place."""
        words = np.frombuffer(self.matcher.compute_bitmask(), np.uint32)  # (ceil(V/32),)
        allowed = ((words[:, None] >> _BITS) & 1).astype(bool).reshape(-1)[: self.n_vocab]
        if not allowed.any():
            raise UsageError(f"the {self.kind.value} constraint allows no token here")
        logits[~allowed[: len(logits)]] = -np.inf

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise UsageError(
                f"token {token} broke the {self.kind.value} constraint: {self.matcher.get_error()}"
            )

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more (stop now)."""
        return bool(self.matcher.is_stopped())

    @property
    def accepting(self) -> bool:
        return bool(self.matcher.is_accepting())
