"""SentencePiece Unigram (GGUF ``tokenizer.ggml.model`` ``t5``), as llama.cpp's UGM tokenizer.

llama.cpp's ``llm_tokenizer_ugm_session`` in Python, step for step:

* normalization: at each position the longest match in the user-defined tokens, else the
  longest match in the precompiled charsmap (SentencePiece's XOR-compressed double array,
  ``tokenizer.ggml.precompiled_charsmap``) replaced by its target, else the character as
  is; spaces become ``▁``, one is put before the text (``add_space_prefix``) or before every
  run of non-spaces with runs of spaces dropped (``remove_extra_whitespaces``);
* Viterbi over the scores of normal, user-defined (score 0) and unused tokens; a character
  no single token covers becomes ``<unk>`` at ``min(normal scores) - 10``; adjacent
  ``<unk>`` are fused.

The HF ``tokenizers`` library's Unigram model with its Precompiled normalizer (XLM-R's
tokenizer.json pipeline) is not used: on nomic-bert-moe it differs from llama.cpp on 11 of
56 vectors (a trailing space becomes ``▁``, ``<s>`` in the text matches the control piece,
combining sequences), and its Unigram prices ``<unk>`` from the minimum over *all* pieces
(XLM-R's unused pieces score -10000) where llama.cpp takes the normal ones only.
"""

from __future__ import annotations

import struct

import numpy as np

from modelc.errors import TokenizerError
from modelc.formats.ir import TokenizerSpec

__all__ = ["UnigramTokenizer"]

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
ESCAPED_SPACE = "\u2581"
UNKNOWN_PENALTY = np.float32(10.0)


class _Charsmap:
    """SentencePiece's precompiled normalization table: longest-prefix replacements."""

    def __init__(self, blob: bytes) -> None:
        self.nodes: list[int] = []
        self.replacements = b""
        if not blob:
            return
        if len(blob) < 4:
            raise TokenizerError("precompiled_charsmap is too small for its header")
        (size,) = struct.unpack_from("<I", blob, 0)
        if size + 4 >= len(blob) or size % 4:
            raise TokenizerError("precompiled_charsmap's trie size is out of range")
        self.nodes = list(struct.unpack_from(f"<{size // 4}I", blob, 4))
        self.replacements = blob[4 + size :]

    def _node(self, i: int) -> int:
        if i >= len(self.nodes):
            raise TokenizerError("precompiled_charsmap: index out of the trie")
        return self.nodes[i]

    def _base(self, i: int) -> int:
        n = self._node(i)
        return (n >> 10) << ((n & (1 << 9)) >> 6)

    def match(self, data: bytes, start: int) -> tuple[bytes, int] | None:
        """(replacement, bytes consumed) for the longest match at ``data[start:]``."""
        if not self.nodes:
            return None
        best_len, best_off = 0, 0
        node = self._base(0)
        for p in range(start, len(data)):
            c = data[p]
            if c == 0:
                break
            node ^= c
            packed = self._node(node)
            if packed & ((1 << 31) | 0xFF) != c:  # LCHECK
                break
            leaf = (packed >> 8) & 1
            node ^= self._base(node)
            if leaf:
                best_len = p - start + 1
                best_off = self._node(node) & ((1 << 31) - 1)
        if not best_len:
            return None
        if best_off >= len(self.replacements):
            raise TokenizerError("precompiled_charsmap: replacement index out of range")
        end = self.replacements.find(b"\0", best_off)
        if end < 0:
            raise TokenizerError("precompiled_charsmap: unterminated replacement")
        return self.replacements[best_off:end], best_len


class UnigramTokenizer:
    """Text fragment (special tokens already split out) -> token ids, as llama.cpp's UGM."""

    def __init__(self, spec: TokenizerSpec) -> None:
        tokens = spec.tokens
        n = len(tokens)
        types = spec.token_types if len(spec.token_types) == n else [NORMAL] * n
        scores = spec.scores if len(spec.scores) == n else [0.0] * n
        if spec.unk_id is None:
            raise TokenizerError("Unigram vocabulary has no unknown token id")
        self.unk_id = spec.unk_id
        self.charsmap = _Charsmap(spec.precompiled_charsmap)
        self.add_space_prefix = spec.add_space_prefix
        self.merge_spaces = spec.remove_extra_whitespaces
        self.matcher: dict[str, tuple[int, float]] = {}
        self.max_len: dict[str, int] = {}  # longest token (in characters) by first character
        self.user: dict[str, int] = {}  # user-defined token texts, as UTF-8, by first character
        min_score = np.float32(np.finfo(np.float32).max)
        for i, (t, ty, sc) in enumerate(zip(tokens, types, scores, strict=True)):
            if ty == NORMAL:
                min_score = min(min_score, np.float32(sc))
            if ty in (NORMAL, USER_DEFINED, UNUSED) and t:
                # user-defined tokens score 0, so they win over pieces (log probabilities)
                self.matcher[t] = (i, 0.0 if ty == USER_DEFINED else float(sc))
                self.max_len[t[0]] = max(self.max_len.get(t[0], 0), len(t))
            if ty == USER_DEFINED and t:
                self.user[t] = i
        self.unk_score = float(np.float32(min_score - UNKNOWN_PENALTY))
        self._user_bytes = sorted((t.encode() for t in self.user), key=len, reverse=True)

    # ------------------------------------------------------------------ normalization
    def _prefix(self, data: bytes, start: int) -> tuple[bytes, int]:
        """llama.cpp ``normalize_prefix``: (normalized bytes, input bytes consumed)."""
        for u in self._user_bytes:
            if data.startswith(u, start):
                return u, len(u)
        hit = self.charsmap.match(data, start)
        if hit is not None:
            return hit
        lead = data[start]
        n = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        return data[start : start + n], n

    def normalize(self, text: str) -> str:
        data = text.encode("utf-8")
        out = bytearray()
        space = ESCAPED_SPACE.encode()
        prepended = in_word = False
        pos = 0
        while pos < len(data):
            norm, used = self._prefix(data, pos)
            for c in norm:
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (self.add_space_prefix and not prepended) or self.merge_spaces:
                            out += space
                            prepended = True
                    out.append(c)
                else:
                    in_word = False
                    if not self.merge_spaces:
                        out += space
            pos += used
        return out.decode("utf-8", "replace")

    # ------------------------------------------------------------------ Viterbi
    def encode(self, text: str) -> list[int]:
        s = self.normalize(text)
        n = len(s)
        if not n:
            return []
        best = [-np.inf] * (n + 1)
        best[0] = 0.0
        tok = [self.unk_id] * (n + 1)
        start = [0] * (n + 1)
        matcher, max_len, unk_score = self.matcher, self.max_len, self.unk_score
        for i in range(n):
            here = best[i]
            single = False
            for k in range(1, min(max_len.get(s[i], 0), n - i) + 1):
                hit = matcher.get(s[i : i + k])
                if hit is None:
                    continue
                if k == 1:
                    single = True
                score = here + hit[1]
                if score > best[i + k]:
                    best[i + k], tok[i + k], start[i + k] = score, hit[0], i
            if not single:
                score = here + unk_score
                if score > best[i + 1]:
                    best[i + 1], tok[i + 1], start[i + 1] = score, self.unk_id, i
        out: list[int] = []
        pos, prev_unk = n, False
        while True:
            is_unk = tok[pos] == self.unk_id
            if not (prev_unk and is_unk):
                out.append(tok[pos])
            if start[pos] == 0:
                break
            prev_unk, pos = is_unk, start[pos]
        out.reverse()
        return out
