"""LFM2 (``lfm2``) and LFM2-MoE (``lfm2moe``): short convolutions + GQA attention (+
sigmoid-routed experts), against transformers, llama.cpp's converter and llama.cpp's
server; the per-sequence convolution state through the engine.

The tiny random models are numpy-made by ``tests/gen_lfm2.py`` and ``tests/gen_lfm2moe.py``
(HF directory and GGUF in the test-asset cache); ``tests/golden/family_<family>.json``
(transformers f32, and the manifest of what llama.cpp's ``convert_hf_to_gguf.py`` writes
for the same HF directory) come from ``scripts/make_tiny_lfm2.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from modelc.artifact import open_artifact
from modelc.errors import UnsupportedError
from modelc.formats import load_model
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import Decoder, build
from modelc.runtime.arch.shortconv import ShortConv
from modelc.runtime.backend import Weight
from modelc.runtime.model import LanguageModel, SeqChunk
from modelc.runtime.prompt import PromptFormat
from modelc.runtime.tokenizer import Tokenizer
from tests import net
from tests.cli_support import Cli
from tests.gen_lfm2 import TEMPLATE, ensure_model, ensure_q8, ensure_release_pre
from tests.gen_lfm2moe import ensure_model as ensure_moe
from tests.gguf_manifest import differences, manifest
from tests.peers import greedy_as_llamacpp
from tests.recurrent_support import check_engine_equal_alone, check_prefix_hit, check_rollback
from tests.runtime_support import LOGPROB_TOL, check_record, golden, make_backend

SOURCES = ["hf", "gguf"]
FAMILIES = ["lfm2", "lfm2moe"]
GOLDEN = "family_lfm2.json"


def source(kind: str, family: str = "lfm2") -> Path:
    hf, gguf = (ensure_moe if family == "lfm2moe" else ensure_model)()
    return hf if kind == "hf" else gguf


def lm(ir: ModelIR, backend: str = "cpu-exact") -> Decoder:
    model = build(ir, make_backend(backend))
    assert isinstance(model, Decoder) and isinstance(model, LanguageModel)
    return model


@pytest.fixture(scope="module")
def ir() -> ModelIR:
    return load_model(source("gguf"))


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("family", FAMILIES)
def test_matches_transformers(family: str, kind: str) -> None:
    ir = load_model(source(kind, family))
    assert ir.architecture == family
    hp = ir.hparams
    assert (hp.recurrent_layers, hp.ssm_conv, hp.n_ff, hp.n_head_kv) == ([0, 2], 3, 128, 2)
    if family == "lfm2moe":
        assert (hp.n_expert, hp.n_expert_used) == (4, 2)
        assert hp.routing is not None and hp.routing.gating == "sigmoid"
        assert hp.routing.n_dense_lead == 1
    model = lm(ir)
    for rec in golden(f"family_{family}.json")["records"]:
        err, toks = check_record(model, rec)
        assert err < LOGPROB_TOL, (rec["prompt_ids"], err)
        assert toks == rec["greedy"], rec["prompt_ids"]


@pytest.mark.parametrize("part", ["memory", "gates", "expert_bias"])
def test_each_part_is_what_matches(part: str) -> None:
    """With the convolution seeing only the current token (its earlier taps zeroed), with
    in_proj's B and C rows swapped, or the experts chosen without LFM2-MoE's expert bias,
    the model no longer matches transformers."""
    family = "lfm2moe" if part == "expert_bias" else "lfm2"
    model = lm(load_model(source("gguf", family)))
    d = model.d
    for b in model.blocks:
        if b.experts is not None:
            assert b.experts.bias is not None
            b.experts.bias = None
        if not isinstance(b.mixer, ShortConv):
            continue
        if part == "memory":
            b.mixer.conv = np.ascontiguousarray(b.mixer.conv * np.array([0, 0, 1], np.float32))
        else:
            w = b.mixer.w_in
            data = np.concatenate([w.data[d : 2 * d], w.data[:d], w.data[2 * d :]])
            b.mixer.w_in = Weight(w.dtype, w.shape, data)
    recs = golden(f"family_{family}.json")["records"]
    assert max(check_record(model, r)[0] for r in recs) > 10 * LOGPROB_TOL


def test_the_gguf_is_the_converters() -> None:
    """The GGUFs the tests write are the ones llama.cpp's convert_hf_to_gguf.py writes for
    the same HF directory (``--outtype f32`` and ``q8_0``): metadata and every tensor's
    name, type, shape and bytes, Q8_0 blocks included."""
    for family in FAMILIES:
        want = golden(f"family_{family}.json")["converter"]
        assert differences(manifest(source("gguf", family)), want) == [], family
    assert differences(manifest(ensure_q8()), golden("lfm2_q8_0_converter.json")) == []


def test_the_q8_0_file_runs_close_to_transformers() -> None:
    """The Q8_0 file a user downloads: its top-10 log-probs within 0.1 of transformers'
    f32 ones on the fast CPU backend (8-bit rounding moves this random model's by up to
    ~0.05)."""
    model = lm(load_model(ensure_q8()), "cpu")
    for rec in golden(GOLDEN)["records"]:
        err, _ = check_record(model, rec)
        assert err < 0.1, (rec["prompt_ids"], err)


@pytest.mark.parametrize("kind", SOURCES)
def test_tokenizer_and_the_real_chat_template(kind: str) -> None:
    """The text and chat ids transformers gave, with LFM2.5-Instruct's own template (the
    sdist's ``models/templates/``), also with a system prompt and earlier answers, all but
    the last without their thinking."""
    g = golden(GOLDEN)
    ir = load_model(source(kind))
    assert ir.tokenizer is not None and ir.chat_template == TEMPLATE.read_text()
    assert Tokenizer(ir.tokenizer).encode(g["text"], add_special=True) == g["text_ids"]
    fmt = PromptFormat.build(ir.tokenizer, ir.chat_template)
    assert fmt.chat(g["chat"]).ids == g["chat_ids"]
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>greet</think>Hello."},
        {"role": "user", "content": "Again"},
        {"role": "assistant", "content": "<think>again</think>Hi."},
        {"role": "user", "content": "Bye"},
    ]
    assert fmt.chat(msgs).text == (  # the thinking of all but the last answer dropped
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n"
        "<|im_start|>assistant\n<think>again</think>Hi.<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_llamacpp_runs_the_gguf_the_same(family: str, tmp_path: Path) -> None:
    """llama.cpp's server on our GGUF: the same prompt ids and greedy continuations (up to
    a near tie); records passing an end-of-generation id are left out (ignore_eos)."""
    pytest.importorskip("xllamacpp")
    g = golden(f"family_{family}.json")
    gguf = source("gguf", family)
    ir = load_model(gguf)
    assert ir.tokenizer is not None
    tok = Tokenizer(ir.tokenizer)
    model = lm(ir)
    assert greedy_as_llamacpp(model, tok, gguf, g, tmp_path / "lc.log") >= 4


def test_the_releases_pretokenizer_splits_as_llamacpp(tmp_path: Path) -> None:
    """A release's GGUF names its pre-tokenizer ``lfm2``, which llama.cpp's
    ``llama-vocab.cpp`` reads as Llama 3's regex with whole-word tokens first (not the
    ``default`` modelc fell back to); the tiny vocabulary cannot tell those regexes apart,
    so this holds the name's reading and the ids llama.cpp's server gives."""
    pytest.importorskip("xllamacpp")

    from modelc.bench.llamacpp import LlamaCppServer
    from modelc.runtime.tokenizer_models import IGNORE_MERGES, PRE_REGEXES

    assert PRE_REGEXES["lfm2"] == PRE_REGEXES["llama3"] and "lfm2" in IGNORE_MERGES
    ir = load_model(ensure_release_pre())
    assert ir.tokenizer is not None and ir.tokenizer.pre == "lfm2"
    ours = Tokenizer(ir.tokenizer)
    texts = ["In 2026, 12345 users can't wait!!\n\n  ok", "x=3.14159;\tThey'LL see 7 of 10"]
    with LlamaCppServer(
        ensure_release_pre(), threads=1, n_parallel=1, n_ctx=256, log=tmp_path / "lc.log"
    ) as s:
        for t in texts:
            got = net.post(f"{s.url}/tokenize", json={"content": t}, timeout=30).json()
            assert got["tokens"] == ours.encode(t, add_special=True), t


def test_pack_and_inspect(tmp_path: Path) -> None:
    """``modelc pack`` makes the same tensors of the HF directory and of the GGUF;
    ``modelc inspect`` shows the family and its convolution layers."""
    cli = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    for k in SOURCES:
        cli("pack", str(source(k)), "-o", str(tmp_path / f"{k}.modelc"))
    arts = [open_artifact(tmp_path / f"{k}.modelc") for k in SOURCES]
    try:
        irs = [a.to_ir() for a in arts]
        assert irs[0].architecture == irs[1].architecture == "lfm2"
        assert irs[0].hparams.recurrent_layers == irs[1].hparams.recurrent_layers == [0, 2]
        assert sorted(irs[0].tensors) == sorted(irs[1].tensors)
        for name, t in irs[0].tensors.items():
            u = irs[1].tensors[name]
            assert (t.dtype, t.shape) == (u.dtype, u.shape), name
            np.testing.assert_array_equal(t.data(), u.data(), err_msg=name)
    finally:
        for a in arts:
            a.close()
    for k in SOURCES:
        out = cli("inspect", str(tmp_path / f"{k}.modelc")).stdout
        assert "architecture   lfm2" in out
        assert "short convolution (width 3) 2 of 3 layers" in out, out
        assert "Gated DeltaNet" not in out and "fused QKV" not in out


@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_refuses_it_and_compile_runs_the_decoder(family: str) -> None:
    """What the device-resident CUDA forward does not run is refused in one line naming it,
    before any GPU work (``--device cuda`` then runs it op by op); ``modelc compile`` gives
    the program the runtime's decoder, saying why in one line."""
    from modelc.compile.spec import forward_note, model_spec
    from modelc.runtime.backends.cuda_family import cuda_host

    ir = load_model(source("gguf", family))
    what = re.escape("short-convolution layers")
    with pytest.raises(
        UnsupportedError, match=rf"uses .*{what}.*which --device cuda does not"
    ) as e:
        cuda_host(ir)
    assert "\n" not in str(e.value) and "Gated DeltaNet" not in str(e.value)
    note = forward_note(model_spec(ir, "m"))
    assert "\n" not in note and re.search(rf"modelc's decoder.*does not run .*{what}", note)


# --- the convolution state per sequence ---------------------------------------------------


def test_a_state_rolls_back_only_to_its_last_steps_checkpoints(ir: ModelIR) -> None:
    check_rollback(lm(ir))


@pytest.mark.parametrize("family", FAMILIES)
async def test_batched_cancelled_cached_and_speculative_equal_alone(family: str) -> None:
    await check_engine_equal_alone(load_model(source("gguf", family)))


def test_a_prefix_cache_hit_starts_from_the_kept_state(ir: ModelIR) -> None:
    check_prefix_hit(lm(ir))


def test_the_state_is_the_last_inputs_only(ir: ModelIR) -> None:
    """A convolution layer keeps (width - 1, d) per sequence, the same at every length;
    only the attention layer's KV rows grow."""
    model = lm(ir)
    model.n_ctx = 2048  # room past the bound (the tiny config says 256)
    cache = model.new_cache()
    assert cache.state is not None
    assert dict(cache.state.shapes) == {0: {"conv": (2, 64)}, 2: {"conv": (2, 64)}}
    size = cache.state.nbytes
    for i in range(6):  # 600 tokens, 100 a step
        model.forward([SeqChunk(cache, [(7 * i + j) % 384 for j in range(100)])])
    assert cache.rows(1) >= 600 and max(cache.rows(0), cache.rows(2)) < 400
    assert cache.state.nbytes == size
