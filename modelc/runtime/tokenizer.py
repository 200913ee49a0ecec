"""Tokenizers rebuilt from a :class:`TokenizerSpec`, on the Hugging Face ``tokenizers`` library.

The HF library does the merging; this module reproduces llama.cpp's ``llama_tokenize``
around it so GGUF models tokenize exactly as llama.cpp does:

* special tokens are split out of the text first (user-defined tokens always, control
  tokens only with ``parse_special``), longest first, like ``tokenizer_st_partition``;
* ``gpt2``: byte-level BPE over llama.cpp's pre-tokenizer regexes (chosen by ``pre``);
* ``llama``: SentencePiece BPE by scores with byte fallback; spaces become ``▁`` and a
  leading space is added to text that starts the prompt or follows a special token
  when ``add_space_prefix`` is set;
* ``bert``: WordPiece (GGUF stores word-initial pieces as ``▁word`` and continuations bare);
  ``add_special`` always wraps the text in [CLS] ... [SEP], as llama.cpp does;
* ``gemma4``: BPE by merge rank over the text with spaces as ``▁``, split only at runs of
  newlines (a run that is one token is kept whole), ``<0xXX>`` byte fallback;
* ``t5``: SentencePiece Unigram, as llama.cpp's UGM (:mod:`modelc.runtime.tokenizer_unigram`);
* ``hf``: a tokenizer.json as is.

The HF models themselves are built in :mod:`modelc.runtime.tokenizer_models`; reading a
tokenizer.json into a spec is :mod:`modelc.runtime.tokenizer_json`.

Decoding concatenates each token's bytes (:meth:`Tokenizer.token_to_piece`) and decodes
UTF-8 once, so a character split across tokens is never garbled.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from modelc.errors import TokenizerError
from modelc.formats.ir import TokenizerSpec
from modelc.runtime.reasoning_budget import utf8_complete
from modelc.runtime.tokenizer_json import MAX_VOCAB, check_added, hf_kind, spec_from_tokenizer_json
from modelc.runtime.tokenizer_models import (
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    UNUSED,
    USER_DEFINED,
    byte_level_bpe,
    gemma4_bpe,
    spm_bpe,
    wordpiece,
)
from modelc.runtime.tokenizer_unigram import UnigramTokenizer

__all__ = ["CONTROL", "IncrementalDecoder", "Tokenizer", "from_tokenizer_json"]

# piece kinds of BERT-style vocabularies (GGUF "bert": ▁word + bare continuations; HF: ##cont)
WORDPIECE = ("bert", "wordpiece")

# texts llama.cpp treats as end-of-generation when present in the vocabulary
EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "<|end_of_text|>", "<｜end▁of▁sentence｜>",
    "<eos>", "<turn|>", "<|tool_response>",  # gemma4
    "<|return|>", "<|call|>",  # gpt-oss (o200k_harmony)
)  # fmt: skip
# harmony ends a message with <|end|> and the answer with <|return|> or <|call|>: where
# both of those are present, <|end|> does not end generation (llama.cpp's workaround)
HARMONY_ENDS = ("<|return|>", "<|call|>")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


_BYTE_DECODER = {c: b for b, c in _bytes_to_unicode().items()}
# the same as a str.translate table into latin-1: a char outside the byte alphabet becomes
# U+0100, which latin-1 cannot encode (the token is then not byte-level text)
_BYTE_TABLE = {i: 0x100 for i in range(256)} | {ord(c): b for c, b in _BYTE_DECODER.items()}
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# the HF WordPiece decoder's cleanup: no space before punctuation and contractions
_WORDPIECE_CLEANUP = re.compile(r" ([.?!,]|'(?:s|m|ve|re)\b|n't\b)")
_NEWLINE_RUNS = re.compile(r"[^\n]+|\n+")


class Tokenizer:
    """Text <-> token ids for one model (see module docstring for the rules)."""

    def __init__(self, spec: TokenizerSpec) -> None:
        self.spec = spec
        self.model = spec.model
        if spec.model == "hf":
            self._init_hf(spec)
        else:
            if not spec.tokens:
                raise TokenizerError(f"tokenizer model {spec.model!r} has no token list")
            self.tokens = list(spec.tokens)
            n = len(self.tokens)
            types = list(spec.token_types) if len(spec.token_types) == n else [NORMAL] * n
            self.types = types
            self.kind = {"gpt2": "gpt2", "bert": "bert"}.get(spec.model, "spm")
            self._ugm: UnigramTokenizer | None = None
            if spec.model == "gpt2":
                self._hf = byte_level_bpe(spec)
            elif spec.model == "llama":
                self._hf = spm_bpe(spec)
            elif spec.model == "bert":
                self._hf = wordpiece(spec)
            elif spec.model == "gemma4":
                self._hf = gemma4_bpe(spec)
            elif spec.model == "t5":
                self._ugm = UnigramTokenizer(spec)
            else:
                raise TokenizerError(
                    f"tokenizer model {spec.model!r} is not supported "
                    "(supported: gpt2, llama, bert, gemma4, t5, hf)"
                )
        self.n_vocab = len(self.tokens)
        self._pieces = [self._piece(i) for i in range(self.n_vocab)]
        self._id_of = {t: i for i, t in enumerate(self.tokens)}
        self._user = self._special_texts(parse_special=False)
        self._all_special = self._special_texts(parse_special=True)

    # ------------------------------------------------------------------ construction
    def _init_hf(self, spec: TokenizerSpec) -> None:
        if not spec.hf_json:
            raise TokenizerError("tokenizer model 'hf' needs the tokenizer.json text (hf_json)")
        try:
            data = json.loads(spec.hf_json)
            added = data.pop("added_tokens", None) or []
            check_added(added)
            # BOS/EOS come from the spec; modelc never pads or truncates in the tokenizer
            data["post_processor"] = data["padding"] = data["truncation"] = None
            self._hf = HFTokenizer.from_str(json.dumps(data))
        except TokenizerError:
            raise
        except Exception as e:  # the library raises plain Exception subclasses
            raise TokenizerError(f"cannot build the tokenizer from tokenizer.json: {e}") from e
        vocab: dict[str, int] = self._hf.get_vocab(with_added_tokens=False)
        for a in added:
            vocab.setdefault(a["content"], int(a["id"]))
        n = max(vocab.values()) + 1 if vocab else 0
        if n > MAX_VOCAB:  # a list of n token texts would be made below
            raise TokenizerError(
                f"tokenizer.json has a token id of {n - 1}; vocabularies hold at most "
                f"{MAX_VOCAB} tokens (is the file damaged?)"
            )
        self.tokens = [f"[UNUSED_{i}]" for i in range(n)]
        self.types = [UNUSED] * n
        for text, i in vocab.items():
            self.tokens[i] = text
            self.types[i] = NORMAL
        self.kind = hf_kind(data)
        for i, t in enumerate(self.tokens):
            if self.kind == "spm" and _BYTE_TOKEN.fullmatch(t):
                self.types[i] = BYTE
        for a in added:
            self.types[int(a["id"])] = CONTROL if a.get("special") else USER_DEFINED

    def _special_texts(self, parse_special: bool) -> list[tuple[str, int]]:
        kinds = {USER_DEFINED} | ({CONTROL, UNKNOWN} if parse_special else set())
        out = [
            (t, i)
            for i, (t, ty) in enumerate(zip(self.tokens, self.types, strict=True))
            if ty in kinds and t
        ]
        out.sort(key=lambda p: len(p[0]), reverse=True)
        return out

    def _piece(self, i: int) -> bytes:
        """The bytes token ``i`` stands for (control tokens: their text)."""
        text, ty = self.tokens[i], self.types[i]
        if ty in (CONTROL, UNKNOWN, USER_DEFINED):
            return text.encode()
        if ty == UNUSED:
            return b""
        byte = (ty == BYTE or self.kind == "spm") and text.startswith("<0x")
        m = _BYTE_TOKEN.fullmatch(text) if byte else None
        if m:
            return bytes([int(m.group(1), 16)])
        if self.kind == "gpt2":
            try:
                return text.translate(_BYTE_TABLE).encode("latin-1")
            except UnicodeEncodeError:
                return text.encode()
        if self.kind in ("spm", "bert"):  # GGUF bert pieces: "▁word" starts a word
            return text.replace("\u2581", " ").encode()
        if self.kind == "wordpiece":
            return text[2:].encode() if text.startswith("##") else b" " + text.encode()
        return text.encode()

    # ------------------------------------------------------------------ properties
    @property
    def vocab_size(self) -> int:
        return self.n_vocab

    @property
    def bos_id(self) -> int | None:
        if self.kind in WORDPIECE and self.spec.cls_id is not None:
            return self.spec.cls_id
        return self.spec.bos_id

    @property
    def eos_id(self) -> int | None:
        if self.kind in WORDPIECE and self.spec.sep_id is not None:
            return self.spec.sep_id
        return self.spec.eos_id

    def _adds(self) -> tuple[bool, bool]:
        """(BOS, EOS) that ``add_special`` adds; BERT-style always gets [CLS] ... [SEP]."""
        if self.kind in WORDPIECE:
            return True, True
        return self.spec.add_bos, self.spec.add_eos

    @property
    def adds_bos(self) -> bool:
        """Whether ``encode(add_special=True)`` puts a BOS first."""
        return self._adds()[0] and self.bos_id is not None

    def is_control(self, token_id: int) -> bool:
        """A control token (BOS, EOS, turn markers): text only when specials are shown."""
        return 0 <= token_id < self.n_vocab and self.types[token_id] == CONTROL

    @functools.cached_property
    def incomplete_utf8_ids(self) -> frozenset[int]:
        """The tokens whose text ends inside a multi-byte UTF-8 character."""
        return frozenset(i for i, p in enumerate(self._pieces) if not utf8_complete(p))

    def control_id(self, text: str) -> int | None:
        """The control token whose text is ``text`` (None: the vocabulary has none)."""
        i = self._id_of.get(text)
        return i if i is not None and self.is_control(i) else None

    def control_texts(self) -> list[str]:
        """Texts of the tokens only ``parse_special`` splits out (control/unknown), longest first."""
        user = {t for t, _ in self._user}
        return [t for t, _ in self._all_special if t not in user]

    @property
    def eot_ids(self) -> set[int]:
        """Every id that ends generation: eos, eot and llama.cpp's end-of-generation texts."""
        ids = {i for i in (self.spec.eos_id, self.spec.eot_id) if i is not None}
        ids |= {self._id_of[t] for t in EOG_TEXTS if t in self._id_of}
        if all(t in self._id_of for t in HARMONY_ENDS) and "<|end|>" in self._id_of:
            ids.discard(self._id_of["<|end|>"])
        return ids

    # ------------------------------------------------------------------ encode
    def encode(
        self,
        text: str,
        add_special: bool = True,
        parse_special: bool = False,
        literals: Mapping[str, str] | None = None,
    ) -> list[int]:
        """Token ids of ``text`` (``add_special``: BOS/EOS per the spec, as llama_tokenize).

        ``literals`` maps placeholder characters to texts put back after special tokens
        are split out: the texts are tokenized as text even when they spell a special
        token (a chat message's own ``<|im_end|>``, see :mod:`modelc.runtime.prompt`).
        """
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TokenizerError(
                f"text is not valid Unicode ({e.reason} at index {e.start}); send UTF-8 text"
            ) from e
        out: list[int] = []
        add_bos, add_eos = self._adds() if add_special else (False, False)
        if add_bos and self.bos_id is not None:
            out.append(self.bos_id)
        specials = self._all_special if parse_special else self._user
        prev_special = True
        for frag in _partition(text, specials) if text else []:
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            if literals:
                for mark, original in literals.items():
                    frag = frag.replace(mark, original)
            if self.model == "llama" and self.spec.add_space_prefix and prev_special:
                frag = " " + frag
            out.extend(self._encode_fragment(frag))
            prev_special = False
        if add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    def _encode_fragment(self, frag: str) -> list[int]:
        if self.model == "t5" and self._ugm is not None:
            return self._ugm.encode(frag)
        if self.model == "gemma4":  # llama.cpp splits at newline runs; a whole run may be a token
            out: list[int] = []
            for part in _NEWLINE_RUNS.findall(frag.replace(" ", "\u2581")):
                if part[0] == "\n" and part in self._id_of:
                    out.append(self._id_of[part])
                else:
                    out.extend(self._hf.encode(part, add_special_tokens=False).ids)
            return out
        ids: list[int] = self._hf.encode(frag, add_special_tokens=False).ids
        return ids

    # ------------------------------------------------------------------ decode
    def _check(self, i: int) -> None:
        if not 0 <= i < self.n_vocab:
            raise TokenizerError(
                f"token id {i} is out of range (vocabulary has {self.n_vocab} tokens)"
            )

    def token_to_piece(self, token_id: int) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character)."""
        self._check(token_id)
        return self._pieces[token_id]

    def _render(self, ids: Iterable[int], skip_special: bool, first: bool) -> bytes:
        parts: list[bytes] = []
        for i in ids:
            self._check(i)
            if skip_special and self.types[i] in (CONTROL, UNKNOWN):  # llama.cpp prints neither
                continue
            piece = self._pieces[i]
            if (
                first
                and self._strips_leading_space
                and self.types[i] not in (CONTROL, USER_DEFINED)
            ):
                piece = piece.removeprefix(b" ")
            first = False
            parts.append(piece)
        return b"".join(parts)

    @property
    def _strips_leading_space(self) -> bool:
        if self.model in ("llama", "t5"):
            return self.spec.add_space_prefix
        return self.kind in WORDPIECE

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD."""
        text = self._render(ids, skip_special, first=True).decode("utf-8", "replace")
        if self.kind in WORDPIECE:  # "hello , world" -> "hello, world"
            text = _WORDPIECE_CLEANUP.sub(lambda m: m.group(1), text)
        return text

    def incremental_decoder(
        self, skip_special: bool = False, strip_leading_space: bool = False
    ) -> IncrementalDecoder:
        return IncrementalDecoder(self, skip_special, strip_leading_space)


class IncrementalDecoder:
    """Feed ids as they are generated; get text deltas that never split a UTF-8 character.

    By default the ids continue a prompt, so a SentencePiece ``▁word`` keeps its space;
    ``strip_leading_space=True`` decodes a whole text the way :meth:`Tokenizer.decode` does.
    """

    def __init__(
        self, tokenizer: Tokenizer, skip_special: bool = False, strip_leading_space: bool = False
    ) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._buf = b""
        self._first = strip_leading_space

    def feed(self, ids: int | Iterable[int]) -> str:
        if type(ids) is int and not self._skip and not self._first:  # a token as generated
            self._tok._check(ids)
            buf = self._buf + self._tok._pieces[ids]  # what _render gives for it
        else:
            seq = [ids] if isinstance(ids, int) else list(ids)
            if not seq:
                return ""
            buf = self._buf + self._tok._render(seq, self._skip, self._first)
            self._first = False
        if buf and buf[-1] < 0x80:  # ends in ASCII: every character complete
            self._buf = b""
            return buf.decode("utf-8", "replace")
        cut = _complete_prefix_len(buf)
        out, self._buf = buf[:cut], buf[cut:]
        return out.decode("utf-8", "replace")

    def flush(self) -> str:
        """Whatever is left (an incomplete character becomes U+FFFD)."""
        out, self._buf = self._buf, b""
        return out.decode("utf-8", "replace")


def _complete_prefix_len(buf: bytes) -> int:
    """Length of ``buf`` without a trailing incomplete UTF-8 sequence."""
    for back in range(1, min(4, len(buf)) + 1):
        b = buf[-back]
        if b & 0xC0 != 0x80:  # a lead byte (or ASCII)
            need = (
                2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
            )
            return len(buf) - back if need > back else len(buf)
    return len(buf)


def _partition(text: str, specials: list[tuple[str, int]]) -> list[str | int]:
    """Split ``text`` at special-token texts, longest first (llama.cpp tokenizer_st_partition)."""
    frags: list[str | int] = [text]
    for tok, tid in specials:
        if not any(isinstance(f, str) and tok in f for f in frags):
            continue
        new: list[str | int] = []
        for f in frags:
            if isinstance(f, int) or tok not in f:
                new.append(f)
                continue
            pieces = f.split(tok)
            for k, p in enumerate(pieces):
                if k:
                    new.append(tid)
                if p:
                    new.append(p)
        frags = new
    return frags


def from_tokenizer_json(
    path: str | Path, tokenizer_config: dict[str, Any] | None = None
) -> Tokenizer:
    """Build a tokenizer from a Hugging Face ``tokenizer.json`` (+ tokenizer_config.json values)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, ValueError) as e:
        raise TokenizerError(f"cannot read tokenizer.json: {e}", path=p) from e
    if not isinstance(data, dict):
        raise TokenizerError("tokenizer.json is not a JSON object", path=p)
    try:
        check_added(data.get("added_tokens") or [])
        spec = spec_from_tokenizer_json(data, text, tokenizer_config or {})
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise TokenizerError(f"tokenizer.json is malformed: {type(e).__name__}: {e}", path=p) from e
    return Tokenizer(spec)
