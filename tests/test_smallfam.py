"""The smaller 2026 families (issue 34): SmolLM3, Phi-4-mini, OLMo 2 and 3,
Ministral 3, Llama 4 against transformers, llama.cpp's
converter and llama.cpp's server.

Each tiny random model is numpy-made by ``tests/gen_<family>.py`` (HF directory and GGUF
in the test-asset cache); ``tests/golden/family_<family>.json`` comes from
``scripts/make_tiny_<family>.py`` (reference venv): transformers' f32 top-10 log-probs and
greedy continuations, the chat prompt's ids under the family's own template, and the
manifest of the GGUF that llama.cpp's ``convert_hf_to_gguf.py`` writes for the same HF
directory, which the GGUF made here must equal tensor by tensor.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from modelc.artifact import open_artifact
from modelc.engine import EngineOptions, build_engine
from modelc.engine.api import FinishEvent, GenerationRequest
from modelc.errors import UnsupportedError
from modelc.formats import load_model
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import build
from modelc.runtime.model import LanguageModel
from modelc.runtime.prompt import PromptFormat
from modelc.runtime.sampling import SamplingParams
from modelc.runtime.tokenizer import Tokenizer
from tests.cli_support import Cli
from tests.gguf_manifest import differences, manifest
from tests.peers import greedy_as_llamacpp
from tests.runtime_support import LOGPROB_TOL, check_record, decode_alone, golden, make_backend

# family -> what it uses that `modelc compile` does not run (FEATURES' words)
FAMILIES = {
    "smollm3": "layers without RoPE (NoPE)",
    "phi4mini": "partial RoPE (rotary dimensions below the head size)",
    "olmo2": "post-norms without pre-norms, Q/K norms over the whole projection",
    "olmo3": "post-norms without pre-norms, Q/K norms over the whole projection",
    "mistral3": "attention temperature tuning by position",
    "llama4": "attention temperature tuning by position, chunked attention",
}
# family -> what of it the device-resident CUDA forward does not run ("": it runs it all:
# smollm3's NoPE as zero RoPE frequencies, olmo2's post-norms alone and Q/K norms over the
# whole projection, olmo3's YaRN on its full layers and phi4mini's partial RoPE (the
# rotation's own magnitude and dimensions), mistral3's queries scaled by position; their GPU
# tests in tests/test_cuda.py)
CUDA_LACKS = {
    "smollm3": "",
    "olmo2": "",
    "olmo3": "",
    "mistral3": "",
    "phi4mini": "",
    "llama4": "chunked attention",
}
ARCH = {
    "phi4mini": "phi3",
    "olmo3": "olmo2",
}  # GGUF / modelc architecture names where not the family's
SOURCES = ["hf", "gguf"]
CASES = [(f, k) for f in FAMILIES for k in SOURCES]


def source(family: str, kind: str) -> Path:
    hf, gguf = importlib.import_module(f"tests.gen_{family}").ensure_model()
    return Path(hf if kind == "hf" else gguf)


def load(family: str, kind: str) -> ModelIR:
    return load_model(source(family, kind))


def lm(ir: ModelIR) -> LanguageModel:
    model = build(ir, make_backend("cpu-exact"))
    assert isinstance(model, LanguageModel)
    return model


@pytest.mark.parametrize(("family", "kind"), CASES)
def test_matches_transformers(family: str, kind: str) -> None:
    ir = load(family, kind)
    assert ir.architecture == ARCH.get(family, family)
    model = lm(ir)
    for rec in golden(f"family_{family}.json")["records"]:
        err, toks = check_record(model, rec)
        assert err < LOGPROB_TOL, (rec["prompt_ids"], err)
        assert toks == rec["greedy"], rec["prompt_ids"]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_gguf_is_the_converters(family: str) -> None:
    """The GGUF the tests write is the one llama.cpp's convert_hf_to_gguf.py writes for
    the same HF directory: metadata and every tensor's name, type, shape and bytes."""
    want = golden(f"family_{family}.json")["converter"]
    assert differences(manifest(source(family, "gguf")), want) == []


@pytest.mark.parametrize("family", FAMILIES)
def test_the_family_feature_is_what_matches(family: str) -> None:
    """Without what sets the family apart the answers move: the goldens exercise it."""
    ir = load(family, "gguf")
    if family == "smollm3":
        ir.hparams.nope_layers = []
    if family == "phi4mini":
        ir.hparams.rope_dim = 0
        rs = ir.hparams.rope_scaling  # the whole head rotates: two more pairs
        rs.short_factor = rs.long_factor = [*rs.short_factor, 1.0, 1.0]
    if family == "mistral3":
        ir.hparams.attn_temp_scale = 0.0
    if family == "olmo3":  # every layer sees the whole prompt
        assert ir.hparams.window_layers == [0, 1, 2]
        ir.hparams.sliding_window = 0
    if family == "llama4":  # RoPE on every layer, no Q/K norms
        ir.hparams.nope_layers, ir.hparams.qk_l2_norm = [], False
    model = lm(ir)
    if family == "olmo2":  # Q/K normed per head (with the first head's weights)
        from modelc.runtime.arch import Decoder

        assert isinstance(model, Decoder)
        model.spec = dataclasses.replace(model.spec, qk_norm_whole=False)
        for b in model.blocks:
            assert b.q_norm is not None and b.k_norm is not None
            b.q_norm, b.k_norm = b.q_norm[: model.head_dim], b.k_norm[: model.head_dim]
    recs = golden(f"family_{family}.json")["records"]
    assert max(check_record(model, r)[0] for r in recs) > 10 * LOGPROB_TOL


@pytest.mark.parametrize(("family", "kind"), CASES)
def test_tokenizer_and_chat_template_match_transformers(family: str, kind: str) -> None:
    g = golden(f"family_{family}.json")
    ir = load(family, kind)
    assert ir.tokenizer is not None
    assert Tokenizer(ir.tokenizer).encode(g["text"], add_special=True) == g["text_ids"]
    fmt = PromptFormat.build(ir.tokenizer, ir.chat_template)
    assert fmt.chat(g["chat"]).ids == g["chat_ids"]  # the family's template, rendered


@pytest.mark.parametrize("family", FAMILIES)
def test_llamacpp_runs_the_gguf_the_same(family: str, tmp_path: Path) -> None:
    """llama.cpp's server on our GGUF: the same prompt ids and greedy continuations (up to
    a near tie); records passing an end-of-generation id are left out (ignore_eos)."""
    pytest.importorskip("xllamacpp")
    g = golden(f"family_{family}.json")
    ir = load(family, "gguf")
    assert ir.tokenizer is not None
    tok = Tokenizer(ir.tokenizer)
    model = lm(ir)
    gguf = source(family, "gguf")
    assert greedy_as_llamacpp(model, tok, gguf, g, tmp_path / "lc.log") >= 4


async def _serve(ir: ModelIR, prompts: list[list[int]], **opts: Any) -> list[Any]:
    """Every prompt's greedy tokens and finish event, submitted together."""
    eng = build_engine(ir, EngineOptions(kv_cache="f32", **opts), backend=make_backend("cpu"))
    p = SamplingParams(temperature=0, max_tokens=12)
    got: dict[int, Any] = {}

    async def one(i: int) -> None:
        toks: list[int] = []
        async for ev in eng.submit(GenerationRequest(f"r{i}", prompts[i], p, ignore_eos=True)):
            if isinstance(ev, FinishEvent):
                got[i] = (toks, ev)
            else:
                toks.append(ev.token_id)

    async with trio.open_nursery() as n:
        await n.start(eng.run)
        await one(0)  # first alone: the others find its prefix blocks
        async with trio.open_nursery() as inner:
            for i in range(1, len(prompts)):
                inner.start_soon(one, i)
        n.cancel_scope.cancel()
    return [got[i] for i in range(len(prompts))]


@pytest.mark.parametrize("family", FAMILIES)
async def test_batched_cached_and_speculative_equal_one_at_a_time(family: str) -> None:
    """Batched with others, from prefix-cache blocks, in small prefill chunks and with
    speculative drafts: the same greedy tokens as the plain one-sequence loop."""
    ir = load(family, "gguf")
    if family == "llama4":  # chunks of 8 (the release's 8192 is never reached here)
        ir.hparams.attn_chunk = 8
    model = lm(ir)
    rng = np.random.default_rng(7)
    shared = rng.integers(3, 384, 9).tolist()
    prompts = [shared + rng.integers(3, 384, n).tolist() for n in (1, 4, 7)]
    prompts.insert(0, prompts[0] * 3)  # served alone, first; its repeats give the drafts
    p = SamplingParams(temperature=0, max_tokens=12)
    want = [decode_alone(model, model.new_cache("f32"), q, p) for q in prompts]
    plain = await _serve(ir, prompts, prefill_chunk=3, prefix_block_tokens=4, speculative=False)
    assert [t for t, _ in plain] == want
    assert all(f.cached_tokens == 8 for _, f in plain[1:])
    spec = await _serve(
        ir, prompts, speculative=True, draft="prompt-lookup", spec_adaptive=False, spec_min_prompt=0
    )
    assert [t for t, _ in spec] == want
    assert sum(f.spec_drafted for _, f in spec) > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_pack_and_inspect(family: str, tmp_path: Path) -> None:
    """``modelc pack`` makes the same tensors of the HF directory and of the GGUF."""
    cli = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    kinds = [k for f, k in CASES if f == family]
    for k in kinds:
        cli("pack", str(source(family, k)), "-o", str(tmp_path / f"{k}.modelc"))
    arts = [open_artifact(tmp_path / f"{k}.modelc") for k in kinds]
    try:
        irs = [a.to_ir() for a in arts] + [load(family, "gguf")]
        assert irs[0].architecture == irs[-1].architecture == ARCH.get(family, family)
        assert irs[0].hparams.nope_layers == irs[-1].hparams.nope_layers
        assert irs[0].hparams.window_layers == irs[-1].hparams.window_layers
        assert sorted(irs[0].tensors) == sorted(irs[-1].tensors)
        for name, t in irs[0].tensors.items():
            np.testing.assert_array_equal(t.data(), irs[-1].tensors[name].data(), err_msg=name)
    finally:
        for a in arts:
            a.close()
    shows = {
        "smollm3": "NoPE layers 3",
        "phi4mini": "partial RoPE (12 of each head's",
        "olmo2": "Q/K norm",
        "olmo3": "sliding window 8 (3 of 4 layers)",
        "mistral3": "RoPE interleaved (theta 1e+06, yarn x16)",
        "llama4": "attention in chunks of 8192 (the RoPE layers)",
    }
    for k in kinds:
        out = cli("inspect", str(tmp_path / f"{k}.modelc")).stdout
        assert f"architecture   {ARCH.get(family, family)}" in out
        assert shows[family] in out, out


@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_runs_it_or_refuses_and_compile_runs_the_decoder(family: str) -> None:
    """The device-resident CUDA forward runs what it can of the family and refuses the rest
    in one line naming it, before any GPU work (``--device cuda`` then runs it op by op);
    ``modelc compile`` gives the program the runtime's decoder, saying why in one line."""
    from modelc.compile.spec import forward_note, model_spec
    from modelc.runtime.backends.cuda_family import cuda_host

    ir = load(family, "gguf")
    if not CUDA_LACKS[family]:
        cuda_host(ir)  # no refusal
    else:
        lacks = re.escape(CUDA_LACKS[family])
        with pytest.raises(UnsupportedError, match=rf"uses {lacks}.*which --device cuda does") as e:
            cuda_host(ir)
        assert "\n" not in str(e.value)
    what = re.escape(FAMILIES[family])
    assert re.search(rf"modelc's decoder.*does not run .*{what}", forward_note(model_spec(ir, "m")))


@pytest.mark.parametrize("family", ["smollm3", "llama4"])
def test_a_context_shift_rerotates_only_the_rope_layers(family: str) -> None:
    """After a shift the RoPE layers' keys are those of the kept tokens at their new
    positions (layer 0's depend on nothing else), a NoPE layer's keys are moved unchanged
    (llama4: in chunks of 8, which then follow the new positions)."""
    from modelc.runtime.arch import Decoder
    from modelc.runtime.model import SeqChunk

    ir = load(family, "gguf")
    ir.hparams.attn_chunk = 8 if family == "llama4" else 0
    model = lm(ir)
    assert isinstance(model, Decoder) and model.spec.nope == (False, False, False, True)
    toks = np.random.default_rng(1).integers(3, model.n_vocab, 40).tolist()
    c = model.new_cache("f32")
    model.forward([SeqChunk(c, toks)])
    nope_before = c.read(3, 40)[0][19:].copy()
    model.shift_context(c, n_keep=4, n_discard=15)
    fresh = model.new_cache("f32")
    model.forward([SeqChunk(fresh, toks[:4] + toks[19:])])
    np.testing.assert_allclose(c.read(0, 25)[0], fresh.read(0, 25)[0], atol=2e-5)
    np.testing.assert_array_equal(c.read(3, 25)[0][4:], nope_before)


def test_mistral3_with_its_vision_model_loads_its_text_model(tmp_path: Path) -> None:
    """Ministral 3's config as a Mistral3ForConditionalGeneration's ``text_config``: the
    same hyper-parameters (YaRN, the attention temperature) and tensors as alone (the
    vision tower goes with ``--mmproj``: ``tests/test_pixtral.py``)."""
    import json
    import shutil

    d = tmp_path / "m"
    shutil.copytree(source("mistral3", "hf"), d)
    text = json.loads((d / "config.json").read_text())
    cfg = {
        "architectures": ["Mistral3ForConditionalGeneration"],
        "model_type": "mistral3",
        "text_config": text,
        "vision_config": {"model_type": "pixtral"},
    }
    (d / "config.json").write_text(json.dumps(cfg))
    wrapped, alone = load_model(d), load_model(source("mistral3", "hf"))
    assert wrapped.architecture == alone.architecture == "mistral3"
    assert wrapped.hparams == alone.hparams and wrapped.hparams.attn_temp_scale == 0.1
    assert sorted(wrapped.tensors) == sorted(alone.tensors)


def test_llama4_temperature_tuning_matches_transformers() -> None:
    """Llama 4's NoPE-layer temperature (llama.cpp fixes its floor at 8192) with a floor of
    8, against transformers with ``floor_scale`` 8: from position 7 on the queries scale."""
    case = golden("family_llama4.json")["scalings"][0]
    assert case["config"] == {"floor_scale": 8}
    ir = load("llama4", "gguf")
    plain = lm(load("llama4", "gguf"))
    ir.hparams.attn_temp_floor = 8
    model = lm(ir)
    moved = 0.0
    for rec in case["records"]:
        err, toks = check_record(model, rec)
        assert err < LOGPROB_TOL, (rec["prompt_ids"], err)
        assert toks == rec["greedy"], rec["prompt_ids"]
        moved = max(moved, check_record(plain, rec)[0])
    assert moved > 5 * LOGPROB_TOL  # a tenth of ln 2..ln 6 on one layer's queries


def test_llama4_rope_freqs_are_what_matches() -> None:
    """The GGUF's rope_freqs (Llama 3 scaling) are read: without them the answers move."""
    from modelc.formats.ir import RopeScaling

    ir = load("llama4", "gguf")
    assert ir.hparams.rope_scaling.type == "factors" and "rope_freqs.weight" not in ir.tensors
    ir.hparams.rope_scaling = RopeScaling()
    recs = golden("family_llama4.json")["records"]
    # only the slowest pairs are scaled: over 40 positions they move the log-probs a little,
    # yet past the tolerance the goldens are held to
    assert max(check_record(lm(ir), r)[0] for r in recs) > 2 * LOGPROB_TOL


def test_olmo3_config_as_transformers_5_writes_it(tmp_path: Path) -> None:
    """OLMo 3's config.json as transformers 5.23 saves it (``rope_parameters`` per layer
    type, YaRN under ``full_attention``, no ``rope_theta``): the same hyper-parameters as
    the transformers 4 form, also without ``layer_types``; windowed layers with a RoPE base of their own are refused in
    one line (llama.cpp's graph turns them at the full layers' base)."""
    import json
    import shutil

    d = tmp_path / "m"
    shutil.copytree(source("olmo3", "hf"), d)
    cfg = json.loads((d / "config.json").read_text())
    yarn = cfg.pop("rope_scaling")
    default = {"rope_type": "default", "rope_theta": cfg.pop("rope_theta")}
    full = {**default, **yarn}
    cfg["rope_parameters"] = {"sliding_attention": default, "full_attention": full}
    (d / "config.json").write_text(json.dumps(cfg))
    assert load_model(d).hparams == load("olmo3", "hf").hparams
    del cfg["layer_types"]  # transformers' default: every 4th layer full
    (d / "config.json").write_text(json.dumps(cfg))
    assert load_model(d).hparams == load("olmo3", "hf").hparams
    cfg["rope_parameters"]["sliding_attention"] = {**default, "rope_theta": 10000.0}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedError, match=r"OLMo 3 with a RoPE base of 10000") as e:
        load_model(d)
    assert "\n" not in str(e.value)


def test_olmo3_yarn_is_on_the_full_layers_only() -> None:
    """The windowed layers rotate unscaled: with YaRN (and its attention factor) on every
    layer the answers move past the tolerance."""
    ir = load("olmo3", "gguf")
    assert ir.hparams.rope_scaling.type == "yarn" and ir.hparams.rope_theta_local == 500000.0
    model = lm(ir)
    assert "yarn_full_only" in model.spec.features()
    ir.hparams.rope_theta_local = 0.0
    recs = golden("family_olmo3.json")["records"]
    assert max(check_record(lm(ir), r)[0] for r in recs) > 10 * LOGPROB_TOL
