"""Tokenizer: llama.cpp's test-tokenizer-0 vectors, SmolLM2, a HF tokenizer.json, decoding."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from tokenizers import Regex, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from modelc.errors import TokenizerError
from modelc.formats import load_model
from modelc.formats.gguf import load_gguf
from modelc.formats.ir import TokenizerSpec
from modelc.runtime.tokenizer import Tokenizer, from_tokenizer_json
from modelc.runtime.tokenizer_models import PRE_REGEXES, token_pairs
from tests import assets

# every llama.cpp vocabulary with test vectors that modelc tokenizes 100% like llama.cpp
VOCABS = [
    "gpt-2",
    "llama-spm",
    "llama-bpe",
    "bert-bge",
    "phi-3",
    "qwen2",
    "qwen35",
    "starcoder",
    "falcon",
    "deepseek-coder",
    "deepseek-llm",
    pytest.param("command-r", marks=pytest.mark.slow),  # 256k tokens: ~5 s to build
    "mpt",
    "refact",
    pytest.param("gemma-4", marks=pytest.mark.slow),  # 262k tokens, 515k merges: ~6 s
    "nomic-bert-moe",  # Unigram (t5); vectors made with llama.cpp, see VECTOR_DIR
]
BYTE_EXACT = [
    "gpt-2",
    "llama-spm",
    "llama-bpe",
    "phi-3",
    "qwen2",
    "falcon",
    "deepseek-llm",
    "command-r",
    "gemma-4",
]
SEP = "\n__ggml_vocab_test__\n"
# vectors for vocabularies the sdist ships without them (nomic-bert-moe), in llama.cpp's
# format: the .inp of llama-spm plus Unigram cases, the .out written by the sdist's own
# llama.cpp (test-tokenizer-0 VOCAB FILE per input), the .detok.json by llama_detokenize
VECTOR_DIR = Path(__file__).parent / "fixtures" / "vocab"


@cache
def vocab(name: str) -> Tokenizer:
    spec = load_gguf(assets.vocab_dir() / f"ggml-vocab-{name}.gguf").tokenizer
    assert spec is not None
    return Tokenizer(spec)


def vector_base(name: str) -> Path:
    """Where ``ggml-vocab-NAME.gguf.inp``/``.out`` are: this repository's fixtures, else the sdist's."""
    own = VECTOR_DIR / f"ggml-vocab-{name}.gguf"
    return own if Path(f"{own}.inp").exists() else assets.vocab_dir() / f"ggml-vocab-{name}.gguf"


def vectors(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp test-tokenizer-0 format: inputs separated by SEP (a last SEP optional), one id line each."""
    base = vector_base(name)
    inputs = Path(f"{base}.inp").read_text(encoding="utf-8").split(SEP)
    if inputs[-1] == "":  # read_tests: text after the last separator is one more input
        inputs.pop()
    lines = Path(f"{base}.out").read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(inputs)
    return [(s, [int(x) for x in line.split()]) for s, line in zip(inputs, lines, strict=True)]


@cache
def smollm2() -> Tokenizer:
    spec = load_gguf(assets.smollm2_gguf()).tokenizer
    assert spec is not None
    return Tokenizer(spec)


@pytest.mark.parametrize("name", VOCABS)
def test_llama_cpp_vectors(name: str) -> None:
    tok = vocab(name)
    cases = vectors(name)
    assert len(cases) >= 40
    failed = [
        (s, want, got) for s, want in cases if (got := tok.encode(s, add_special=False)) != want
    ]
    assert not failed, f"{len(failed)}/{len(cases)} differ, first: {failed[0]!r}"


@pytest.mark.parametrize("name", BYTE_EXACT)
def test_decode_inverts_encode(name: str) -> None:
    tok = vocab(name)
    for s, _ in vectors(name):
        assert tok.decode(tok.encode(s, add_special=False)) == s


def test_unigram_decode_is_llama_detokenize() -> None:
    """t5: the text is normalized (NFKC, spaces merged), so decode gives llama.cpp's text back."""
    tok = vocab("nomic-bert-moe")
    want = json.loads((VECTOR_DIR / "ggml-vocab-nomic-bert-moe.gguf.detok.json").read_text("utf-8"))
    cases = vectors("nomic-bert-moe")
    assert len(want) == len(cases)
    assert [tok.decode(ids) for _, ids in cases] == want
    assert tok.decode([3]) == "<unk>" and tok.decode([3], skip_special=True) == ""
    ids = tok.encode("  ﬁve   ①  ")  # NFKC by the charsmap, runs of spaces merged
    assert [tok.tokens[i] for i in ids] == ["<s>", "\u2581five", "\u2581" + "1", "</s>"]


def test_add_special_follows_the_spec() -> None:
    spm = vocab("llama-spm")  # add_bos true, add_eos false
    assert spm.encode("Hello world") == [1, 15043, 3186]
    assert spm.encode("Hello world", add_special=False) == [15043, 3186]
    assert spm.encode("") == [1] and spm.encode("", add_special=False) == []
    bert = vocab("bert-bge")  # [CLS] text [SEP]
    assert bert.encode("hello world") == [101, 7592, 2088, 102]
    gpt2 = vocab("gpt-2")  # no BOS for plain GPT-2
    assert gpt2.encode("Hello world") == gpt2.encode("Hello world", add_special=False)
    assert vocab("llama-bpe").encode("Hi")[0] == 128000  # llama-bpe adds BOS by default
    nomic = vocab("nomic-bert-moe")  # t5: <s> text </s>, as its GGUF says
    assert nomic.encode("hello world") == [0, *nomic.encode("hello world", add_special=False), 2]


@pytest.mark.slow
def test_gemma4_bos_and_newline_runs() -> None:
    tok = vocab("gemma-4")  # llama.cpp always adds BOS for gemma4
    assert tok.encode("Hi") == [2, *tok.encode("Hi", add_special=False)]
    assert tok.encode("\n\n\n", add_special=False) == [tok.tokens.index("\n\n\n")]
    assert {1, tok.tokens.index("<turn|>")} <= tok.eot_ids  # llama.cpp's gemma4 EOG texts
    assert tok.decode(tok.encode("a  b\n\n\tc 🦙", add_special=False)) == "a  b\n\n\tc 🦙"


def test_special_tokens_parse_only_when_asked() -> None:
    tok = smollm2()
    text = "<|im_start|>user\nHi<|im_end|>"
    parsed = tok.encode(text, add_special=False, parse_special=True)
    assert parsed[0] == 1 and parsed[-1] == 2 and parsed.count(1) == 1
    plain = tok.encode(text, add_special=False)
    assert 1 not in plain and 2 not in plain
    assert tok.decode(plain) == text
    assert tok.decode(parsed) == text and tok.decode(parsed, skip_special=True) == "user\nHi"
    spm = vocab("llama-spm")  # text after a special token gets the SentencePiece space prefix
    assert spm.encode("<s>Hi", add_special=False, parse_special=True) == [
        1,
        *spm.encode("Hi", add_special=False),
    ]


def test_smollm2_round_trip_and_ids() -> None:
    tok = smollm2()
    assert tok.n_vocab == tok.vocab_size == 49152
    assert (tok.bos_id, tok.eos_id) == (1, 2) and tok.eot_ids == {0, 2}
    for s in [
        "Hello, world!",
        "  indented\n\tcode()",
        "naïve café 🦙 世界",
        "1234567 + 89 = ?",
        "",
    ]:
        ids = tok.encode(s)
        assert tok.decode(ids) == s
        assert b"".join(tok.token_to_piece(i) for i in ids) == s.encode()
    assert tok.encode("Hello") == [19556]


@pytest.mark.parametrize("which", ["smollm2", "llama-spm"])
def test_incremental_decoder_never_splits_a_character(which: str) -> None:
    tok = smollm2() if which == "smollm2" else vocab("llama-spm")
    text = "Hi 🦙🚀 世界 ñ 👨‍👩‍👧 end"
    ids = tok.encode(text, add_special=False)
    pieces = [tok.token_to_piece(i) for i in ids]
    assert any(_is_partial(p) for p in pieces)  # some characters really are split across tokens
    dec = tok.incremental_decoder(strip_leading_space=True)
    deltas = [dec.feed(i) for i in ids]
    deltas.append(dec.flush())
    assert "".join(deltas) == tok.decode(ids) == text
    assert all("\ufffd" not in d for d in deltas)
    assert "" in deltas[:-1]  # a delta was held back until its character completed
    # a continuation keeps the SentencePiece word-initial space
    cont = tok.incremental_decoder()
    streamed = "".join(cont.feed(i) for i in ids) + cont.flush()
    assert streamed == (" " + text if which == "llama-spm" else text)


def _is_partial(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_incremental_decoder_flushes_an_incomplete_tail() -> None:
    tok = smollm2()
    ids = tok.encode("🦙", add_special=False)
    assert len(ids) >= 2
    dec = tok.incremental_decoder()
    assert dec.feed(ids[:-1]) == ""
    assert dec.flush() == "\ufffd"  # the incomplete character, replaced
    assert dec.flush() == ""


def test_out_of_range_ids() -> None:
    tok = smollm2()
    for bad in (-1, 49152, 10**9):
        with pytest.raises(TokenizerError, match="out of range"):
            tok.decode([5, bad])
        with pytest.raises(TokenizerError, match="out of range"):
            tok.token_to_piece(bad)
        with pytest.raises(TokenizerError, match="out of range"):
            tok.incremental_decoder().feed([bad])


def test_every_pre_tokenizer_regex_compiles() -> None:
    for name, regexes in PRE_REGEXES.items():
        for rx in regexes:
            pre_tokenizers.Split(Regex(rx), behavior="isolated")  # raises on a bad pattern
        assert regexes, name


def test_invalid_unicode_text() -> None:
    with pytest.raises(TokenizerError, match="not valid Unicode"):
        smollm2().encode("a\ud800b")


def test_unsupported_vocabularies() -> None:
    with pytest.raises(TokenizerError, match="'rwkv' is not supported"):
        Tokenizer(TokenizerSpec(model="rwkv", tokens=["a"]))
    with pytest.raises(TokenizerError, match="no unknown token id"):
        Tokenizer(TokenizerSpec(model="t5", tokens=["a"]))
    with pytest.raises(TokenizerError, match="no token list"):
        Tokenizer(TokenizerSpec(model="gpt2"))
    with pytest.raises(TokenizerError, match=r"tokenizer\.json"):
        Tokenizer(TokenizerSpec(model="hf", hf_json="{not json"))


@pytest.mark.parametrize("fixture", ["llama-st", "gpt2-st"])
def test_hf_dir_byte_level_tokenizers(fixture: str) -> None:
    d = Path(__file__).parent / "fixtures" / "formats" / fixture
    ir = load_model(d)
    assert ir.tokenizer is not None and ir.tokenizer.model == "hf"
    tok = Tokenizer(ir.tokenizer)
    ref = HFTokenizer.from_file(str(d / "tokenizer.json"))
    added = [t for t in ref.get_added_tokens_decoder().values() if t.special]
    for s in ["Hello world!", "  two  spaces", "héllo wörld 🦙", "<|im_start|>user\nhi<|im_end|>"]:
        want = ref.encode(s, add_special_tokens=False).ids
        assert tok.encode(s, add_special=False, parse_special=True) == want, s
        assert tok.decode(want) == s
        if not any(a.content in s for a in added):
            assert tok.encode(s, add_special=False) == want
    first = tok.encode("Hi")
    assert (first[0] == tok.bos_id) == ir.tokenizer.add_bos


def test_hf_bert_dir_adds_cls_and_sep() -> None:
    ir = load_model(assets.minilm_dir())  # tokenizer_config names [CLS]/[SEP], not bos/eos
    assert ir.tokenizer is not None
    tok = Tokenizer(ir.tokenizer)
    assert tok.encode("Hello world!") == [101, 7592, 2088, 999, 102]
    assert tok.decode(tok.encode("Hello world!"), skip_special=True) == "hello world!"


def test_hf_tokenizer_json_matches_the_library() -> None:
    model = assets.minilm_dir()
    config = json.loads((model / "tokenizer_config.json").read_text())
    tok = from_tokenizer_json(model / "tokenizer.json", config)
    ref = HFTokenizer.from_file(str(model / "tokenizer.json"))
    ref.no_padding()
    ref.no_truncation()
    assert tok.spec.add_bos and tok.spec.add_eos and tok.bos_id == 101 and tok.eos_id == 102
    texts = [
        "Hello world!",
        "Äpfel und Birnen [SEP] x [MASK]",
        "",
        "  spaced   out  ",
        "日本語のテキスト",
        "don't",
    ]
    for s in texts:
        want = ref.encode(s).ids
        assert tok.encode(s, parse_special=True) == want, s
        assert tok.decode(want, skip_special=True) == ref.decode(want), s
    assert tok.encode("[SEP]") == [101, 1031, 19802, 1033, 102]  # not parsed unless asked
    assert tok.n_vocab == ref.get_vocab_size()


def _pairs_in_python(tokens: list[str]) -> list[tuple[int, int, int]]:
    """The scan ``token_pairs`` does in C, as plain Python: the reference it must equal."""
    vocab = {t: i for i, t in enumerate(tokens)}
    return [
        (i, vocab[t[:k]], vocab[t[k:]])
        for t, i in sorted(vocab.items(), key=lambda p: p[1])
        for k in range(1, len(t))
        if t[:k] in vocab and t[k:] in vocab
    ]


@pytest.mark.parametrize("name", ["llama-spm", "phi-3"])
def test_token_pairs_equal_the_python_scan(name: str) -> None:
    spec = load_gguf(assets.vocab_dir() / f"ggml-vocab-{name}.gguf").tokenizer
    assert spec is not None and spec.model == "llama"
    tokens = list(spec.tokens)
    got = list(zip(*(a.tolist() for a in token_pairs(tokens)), strict=True))
    assert len(got) > 10_000 and got == _pairs_in_python(tokens)
    # texts that a split would cut inside a code point, repeated texts (the last id stands
    # for them), an empty token, a lone surrogate (as a damaged GGUF's text decodes)
    odd = ["a", "b", "ab", "é", "aé", "éa", "ab", "", "\ud800", "a\ud800", "𝄞", "a𝄞b", "a𝄞", "b"]
    got = list(zip(*(a.tolist() for a in token_pairs(odd)), strict=True))
    want = [(4, 0, 3), (5, 3, 0), (6, 0, 13), (9, 0, 8), (11, 12, 13), (12, 0, 10)]
    assert got == _pairs_in_python(odd) == want
    assert [len(a) for a in token_pairs([])] == [0, 0, 0]


@pytest.mark.parametrize("name", ["llama-bpe", "gpt-2"])
def test_byte_level_pieces_and_merges_equal_the_plain_loops(name: str) -> None:
    """The load's fast paths (a translate table, ``str.partition``) against the plain
    per-character and per-merge loops they replaced, on real vocabularies and odd texts."""
    from modelc.runtime.tokenizer import _BYTE_DECODER
    from modelc.runtime.tokenizer_models import _split_merge, split_merges

    def plain(text: str) -> bytes:
        try:
            return bytes(_BYTE_DECODER[c] for c in text)
        except KeyError:
            return text.encode()

    tok = vocab(name)
    odd = ["\x7f", "a\xa0b", "\xad", "Ġhello", "中文", "Ġ\u0100", " ", "\u0120\u0121", ""]
    texts = [*tok.tokens, *odd]
    fast = Tokenizer(TokenizerSpec(model="gpt2", tokens=texts, merges=[]))
    assert [fast._piece(i) for i in range(len(texts))] == [plain(t) for t in texts]
    assert len(tok.spec.merges) > 40_000
    edge = [" a b", "a  b", "a b c", "Ġt he"]
    merges = [*tok.spec.merges, *edge]
    assert split_merges(merges) == [_split_merge(m) for m in merges]
    for bad in ("ab", " a", ""):
        with pytest.raises(TokenizerError, match="malformed BPE merge"):
            split_merges(["a b", bad])
