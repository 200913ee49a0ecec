"""Granite 4.0-H (``granitehybrid``): Mamba-2 + attention without RoPE, Granite's
multipliers, dense or with mixtures of experts beside a shared one, against transformers,
llama.cpp's converter and llama.cpp's server; the per-sequence Mamba state through the
engine.

The tiny random models (``granite4`` dense, ``granite4moe``) are numpy-made by
``tests/gen_granite4.py`` (HF directory and GGUF in the test-asset cache);
``tests/golden/family_<family>.json`` (transformers f32, and the manifest of what
llama.cpp's ``convert_hf_to_gguf.py`` writes for the same HF directory) come from
``scripts/make_tiny_granite4.py``.
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
from modelc.runtime.arch.mamba2 import Mamba2
from modelc.runtime.model import LanguageModel
from modelc.runtime.prompt import PromptFormat
from modelc.runtime.tokenizer import Tokenizer
from tests.cli_support import Cli
from tests.gen_granite4 import TEMPLATE, ensure_model, ensure_q8
from tests.gguf_manifest import differences, manifest
from tests.peers import greedy_as_llamacpp
from tests.recurrent_support import check_engine_equal_alone, check_prefix_hit, check_rollback
from tests.runtime_support import LOGPROB_TOL, check_record, golden, make_backend

SOURCES = ["hf", "gguf"]
FAMILIES = ["granite4", "granite4moe"]
GOLDEN = "family_granite4.json"


def source(kind: str, family: str = "granite4") -> Path:
    hf, gguf = ensure_model(family)
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
    assert ir.architecture == "granitehybrid"
    hp = ir.hparams
    assert (hp.recurrent_layers, hp.nope_layers, hp.n_head_kv) == ([0, 1], [0, 1, 2], 1)
    assert (hp.ssm_inner, hp.ssm_v_heads, hp.ssm_k_heads, hp.ssm_head_k) == (128, 8, 1, 16)
    assert (hp.n_expert, hp.n_expert_used) == ((4, 2) if family == "granite4moe" else (0, 0))
    model = lm(ir)
    for rec in golden(f"family_{family}.json")["records"]:
        err, toks = check_record(model, rec)
        assert err < LOGPROB_TOL, (rec["prompt_ids"], err)
        assert toks == rec["greedy"], rec["prompt_ids"]


@pytest.mark.parametrize("part", ["decay", "skip", "residual_scale", "shared_expert"])
def test_each_part_is_what_matches(part: str) -> None:
    """Without the Mamba state's decay, without its D skip, with the residual branches
    unscaled, or without the shared expert beside the mixture, the model no longer matches
    transformers: each part is exercised."""
    import dataclasses

    family = "granite4moe" if part in ("shared_expert", "residual_scale") else "granite4"
    model = lm(load_model(source("gguf", family)))
    for b in model.blocks:
        if b.experts is not None and part == "shared_expert":
            b.experts.shared = None
        if isinstance(b.mixer, Mamba2) and part == "decay":
            b.mixer.a = np.zeros_like(b.mixer.a)  # exp(0 * dt) = 1: nothing forgotten
        if isinstance(b.mixer, Mamba2) and part == "skip":
            b.mixer.d_skip = np.zeros_like(b.mixer.d_skip)
    if part == "residual_scale":
        model.spec = dataclasses.replace(model.spec, residual_scale=0.0)
    recs = golden(f"family_{family}.json")["records"]
    assert max(check_record(model, r)[0] for r in recs) > 10 * LOGPROB_TOL


def test_the_gguf_is_the_converters() -> None:
    """The GGUFs the tests write are the ones llama.cpp's convert_hf_to_gguf.py writes for
    the same HF directory (``--outtype f32`` and ``q8_0``): metadata and every tensor's
    name, type, shape and bytes, Q8_0 blocks included."""
    for family in FAMILIES:
        want = golden(f"family_{family}.json")["converter"]
        assert differences(manifest(source("gguf", family)), want) == [], family
    assert differences(manifest(ensure_q8()), golden("granite4_q8_0_converter.json")) == []


def test_the_q8_0_file_runs_close_to_transformers() -> None:
    """The Q8_0 file a user downloads: its top-10 log-probs close to transformers' f32
    ones on the fast CPU backend (8-bit rounding moves this random model's a little)."""
    model = lm(load_model(ensure_q8()), "cpu")
    for rec in golden(GOLDEN)["records"]:
        err, _ = check_record(model, rec)
        assert err < 0.1, (rec["prompt_ids"], err)


@pytest.mark.parametrize("kind", SOURCES)
def test_tokenizer_and_the_real_chat_template(kind: str) -> None:
    """The text and chat ids transformers gave, with Granite 4.0's own template (the
    sdist's ``models/templates/``)."""
    g = golden(GOLDEN)
    ir = load_model(source(kind))
    assert ir.tokenizer is not None and ir.chat_template == TEMPLATE.read_text()
    assert Tokenizer(ir.tokenizer).encode(g["text"], add_special=True) == g["text_ids"]
    fmt = PromptFormat.build(ir.tokenizer, ir.chat_template)
    assert fmt.chat(g["chat"]).ids == g["chat_ids"]


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


def test_pack_and_inspect(tmp_path: Path) -> None:
    """``modelc pack`` makes the same tensors of the HF directory and of the GGUF;
    ``modelc inspect`` shows the family and its Mamba-2 layers."""
    cli = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    for k in SOURCES:
        cli("pack", str(source(k)), "-o", str(tmp_path / f"{k}.modelc"))
    arts = [open_artifact(tmp_path / f"{k}.modelc") for k in SOURCES]
    try:
        irs = [a.to_ir() for a in arts]
        assert irs[0].architecture == irs[1].architecture == "granitehybrid"
        assert irs[0].hparams.recurrent_layers == irs[1].hparams.recurrent_layers == [0, 1]
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
        assert "architecture   granitehybrid" in out
        assert "Mamba-2 (8 heads, state 16) 2 of 3 layers" in out, out
        assert "Gated DeltaNet" not in out


def test_cuda_refuses_it_and_compile_runs_the_decoder(ir: ModelIR) -> None:
    """What the device-resident CUDA forward does not run is refused in one line naming it,
    before any GPU work (``--device cuda`` then runs it op by op); ``modelc compile`` gives
    the program the runtime's decoder, saying why in one line."""
    from modelc.compile.spec import forward_note, model_spec
    from modelc.runtime.backends.cuda_family import cuda_host

    what = re.escape("Mamba-2 layers")
    with pytest.raises(
        UnsupportedError, match=rf"uses .*{what}.*which --device cuda does not"
    ) as e:
        cuda_host(ir)
    msg = str(e.value)
    assert "\n" not in msg and "scaled residual branches" in msg and "scaled logits" in msg
    note = forward_note(model_spec(ir, "m"))
    assert "\n" not in note and re.search(rf"modelc's decoder.*does not run .*{what}", note)


# --- the Mamba state per sequence ----------------------------------------------------------


def test_a_state_rolls_back_only_to_its_last_steps_checkpoints(ir: ModelIR) -> None:
    check_rollback(lm(ir))


@pytest.mark.parametrize("family", FAMILIES)
async def test_batched_cancelled_cached_and_speculative_equal_alone(family: str) -> None:
    await check_engine_equal_alone(load_model(source("gguf", family)))


def test_a_prefix_cache_hit_starts_from_the_kept_state(ir: ModelIR) -> None:
    check_prefix_hit(lm(ir))


def test_the_state_is_fixed_size(ir: ModelIR) -> None:
    """A Mamba-2 layer keeps (width - 1, channels) convolution inputs and a (heads, head
    size, state) S per sequence, the same at every length."""
    from modelc.runtime.model import SeqChunk

    model = lm(ir)
    cache = model.new_cache()
    assert cache.state is not None
    want = {"conv": (3, 160), "ssm": (8, 16, 16)}
    assert dict(cache.state.shapes) == {0: want, 1: want}
    size = cache.state.nbytes
    model.forward([SeqChunk(cache, [(7 * j) % 384 for j in range(100)])])
    assert cache.state.nbytes == size and cache.rows(2) >= 100
