"""The Hugging Face ``tokenizers`` models that llama.cpp's vocabulary types map to.

:class:`modelc.runtime.tokenizer.Tokenizer` picks one by ``TokenizerSpec.model``:

* ``gpt2``: byte-level BPE over llama.cpp's pre-tokenizer regexes (chosen by ``pre``);
* ``llama``: SentencePiece BPE by scores with byte fallback, spaces as ``▁``;
* ``gemma4``: BPE by merge rank over raw UTF-8, ``<0xXX>`` byte fallback;
* ``bert``: WordPiece (GGUF pieces ``▁word`` and bare continuations).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from modelc.errors import TokenizerError
from modelc.formats.ir import TokenizerSpec

_k: Any = importlib.import_module("modelc._kernels.kernels")

__all__ = [
    "BYTE", "CONTROL", "IGNORE_MERGES", "NORMAL", "PRE_REGEXES", "UNKNOWN", "UNUSED",
    "USER_DEFINED", "byte_level_bpe", "gemma4_bpe", "split_merges", "spm_bpe", "token_pairs",
    "wordpiece",
]  # fmt: skip

# GGUF tokenizer.ggml.token_type values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK = "[一-龥ࠀ-一가-퟿]+"
# letters as in deepseek-llm's tokenizer.json; \u escapes keep the code points NFC would fold
_DEEPSEEK_LETTERS = "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+"


def _letter_cases(suffix: str) -> str:
    """Mistral/GPT-4o word rule: optional non-letter, cased letters, then ``suffix``."""
    upper, lower = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
    lead = r"[^\r\n\p{L}\p{N}]?"
    return f"{lead}{upper}*{lower}+{suffix}|{lead}{upper}+{lower}*{suffix}"


_TEKKEN = _letter_cases("") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_GPT4O = (
    _letter_cases("(?i:'s|'t|'re|'ve|'m|'ll|'d)?")
    + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK3 = [
    r"\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"

# llama.cpp's pre-tokenizer regexes (llm_tokenizer_bpe) by tokenizer.ggml.pre, applied in turn
_PRE_GROUPS: list[tuple[tuple[str, ...], list[str]]] = [
    (("gpt-2", "mpt", "olmo", "phi-2", "roberta-bpe", "jais"), [_GPT2]),
    (
        ("llama3", "llama-bpe", "llama-v3", "falcon3", "dbrx", "smaug-bpe", "chatglm-bpe", "lfm2"),
        [_LLAMA3],
    ),
    (("qwen2", "stablelm2", "megrez"), [_QWEN2]),
    (("qwen35",), [_QWEN35]),
    (
        ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"),
        [r"\p{N}", _GPT2],
    ),
    (("falcon",), [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"]),
    (
        ("deepseek-llm",),
        ["[\r\n]", _DEEPSEEK_LETTERS, r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$", _CJK, r"\p{N}+"],
    ),
    (("deepseek-coder",), ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"]),
    (("deepseek-v3",), _DEEPSEEK3),
    (("tekken",), [_TEKKEN]),
    (("gpt-4o",), [_GPT4O]),
    (("poro-chat", "bloom", "gpt3-finnish"), [_BLOOM]),
    (("viking",), [_BLOOM, r"\p{N}"]),
    (("default",), [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]),
]
PRE_REGEXES: dict[str, list[str]] = {name: rx for names, rx in _PRE_GROUPS for name in names}
IGNORE_MERGES = {"llama3", "llama-bpe", "llama-v3", "falcon3", "tekken", "lfm2"}


def _split_merge(m: str) -> tuple[str, str]:
    pos = m.find(" ", 1)
    if pos < 0:
        raise TokenizerError(f"malformed BPE merge {m!r} (expected 'left right')")
    return m[:pos], m[pos + 1 :]


def split_merges(merges: Sequence[str]) -> list[tuple[str, str]]:
    """GGUF merges ``"left right"`` as pairs, split at the first space after the first
    character (a left side may start with a space); a merge with no such space refused."""
    return [
        (a, b) if a and s else _split_merge(m)
        for m, (a, s, b) in zip(merges, [m.partition(" ") for m in merges], strict=True)
    ]


def byte_level_bpe(spec: TokenizerSpec) -> HFTokenizer:
    vocab = {t: i for i, t in enumerate(spec.tokens)}
    merges = split_merges(spec.merges)
    pre = spec.pre if spec.pre in PRE_REGEXES else "default"
    tok = HFTokenizer(
        models.BPE(vocab, merges, fuse_unk=False, ignore_merges=spec.pre in IGNORE_MERGES)
    )
    splits: list[Any] = [
        pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_REGEXES[pre]
    ]
    splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(splits)
    tok.decoder = decoders.ByteLevel()
    return tok


def token_pairs(tokens: list[str]) -> tuple[np.ndarray[Any, Any], ...]:
    """Every split of a token into two tokens, as ``(token, left, right)`` id columns: for
    each text its last id, in order, and its splits between code points left to right
    (``cyx/mc_vocab.h``)."""
    enc = [t.encode("utf-8", "surrogatepass") for t in tokens]
    off = np.zeros(len(enc) + 1, np.int64)
    np.cumsum([len(b) for b in enc], out=off[1:])
    cap = int(off[-1])  # at most one split a byte
    tok, left, right = (np.empty(cap, np.int32) for _ in range(3))
    n = _k.vocab_pairs(np.frombuffer(b"".join(enc), np.uint8), off, tok, left, right)
    return tok[:n], left[:n], right[:n]


def spm_bpe(spec: TokenizerSpec) -> HFTokenizer:
    """llama.cpp's SPM: merge the adjacent pair whose join is the highest-scoring token.

    The merges are every split of a token into two tokens, ranked by the joined token's
    score (highest first), then its id, then the split's position."""
    tokens = list(spec.tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    scores = spec.scores if len(spec.scores) == len(tokens) else [0.0] * len(tokens)
    tok, left, right = token_pairs(tokens)
    order = np.lexsort((tok, -np.asarray(scores, np.float64)[tok]))  # stable: splits in order
    pairs = zip(left[order].tolist(), right[order].tolist(), strict=True)
    merges = [(tokens[a], tokens[b]) for a, b in pairs]
    unk = spec.tokens[spec.unk_id] if spec.unk_id is not None else None
    hf = HFTokenizer(models.BPE(vocab, merges, unk_token=unk, byte_fallback=True, fuse_unk=True))
    hf.normalizer = normalizers.Replace(" ", "\u2581")
    return hf


def gemma4_bpe(spec: TokenizerSpec) -> HFTokenizer:
    """llama.cpp's gemma4 BPE: merges by rank on raw UTF-8 (``▁`` for spaces), ``<0xXX>`` fallback."""
    vocab = {t: i for i, t in enumerate(spec.tokens)}
    merges = split_merges(spec.merges)
    return HFTokenizer(models.BPE(vocab, merges, byte_fallback=True, fuse_unk=False))


def wordpiece(spec: TokenizerSpec) -> HFTokenizer:
    """llama.cpp's WPM; GGUF pieces ``▁word`` -> ``word``, bare continuations -> ``##cont``."""
    vocab: dict[str, int] = {}
    for i, (t, ty) in enumerate(
        zip(spec.tokens, spec.token_types or [NORMAL] * len(spec.tokens), strict=True)
    ):
        if ty == CONTROL or (t.startswith("[") and t.endswith("]")):
            vocab[t] = i
        elif t.startswith("\u2581"):
            vocab[t[1:]] = i
        else:
            vocab["##" + t] = i
    unk = spec.tokens[spec.unk_id] if spec.unk_id is not None else "[UNK]"
    tok = HFTokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=1 << 20))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok
