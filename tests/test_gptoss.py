"""gpt-oss against transformers, llama.cpp's converter and llama.cpp's server.

The tiny random gpt-oss of ``tests/gen_gptoss.py`` (3 layers alternating window 4 / full,
attention sinks, YaRN, biased router and experts, the clamped SwiGLU) in two forms of one
model: F32, and the experts MXFP4 (the HF directory as the release ships them, the GGUF
as the converter repacks them).  Goldens from ``scripts/make_tiny_gptoss.py``:
transformers' f32 records of the F32 directory (which the MXFP4 one equals value for
value) and the converter's own GGUFs of both directories, key by key and tensor by tensor.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from modelc.engine import EngineOptions, LLMEngine, build_engine
from modelc.engine.api import FinishEvent, GenerationRequest, TokenEvent
from modelc.formats import load_model
from modelc.formats.ir import DType, ModelIR
from modelc.runtime.arch import build
from modelc.runtime.arch.decoder import Decoder
from modelc.runtime.model import LanguageModel
from modelc.runtime.prompt import PromptFormat
from modelc.runtime.sampling import SamplingParams
from modelc.runtime.tokenizer import Tokenizer
from tests import net
from tests.gen_gptoss import KINDS, ensure_gptoss
from tests.peers import greedy_to_near_tie, llamacpp_greedy
from tests.runtime_support import LOGPROB_TOL, check_record, decode_alone, golden, make_backend

SOURCES = ("hf", "gguf")
GOLDEN = "family_gptoss.json"


def source(kind: str, src: str) -> Path:
    hf, gg = ensure_gptoss(kind)
    return hf if src == "hf" else gg


def lm(ir: ModelIR, backend: str = "cpu-exact") -> LanguageModel:
    model = build(ir, make_backend(backend))
    assert isinstance(model, LanguageModel)
    return model


@pytest.mark.parametrize("src", SOURCES)
@pytest.mark.parametrize("kind", KINDS)
def test_matches_transformers(kind: str, src: str) -> None:
    ir = load_model(source(kind, src))
    assert ir.architecture == "gpt-oss"
    want = DType.MXFP4 if kind == "mxfp4" else DType.F32
    assert ir.tensors["blk.1.ffn_down_exps.weight"].dtype is want
    model = lm(ir)
    for rec in golden(GOLDEN)["records"]:
        err, toks = check_record(model, rec)
        assert err < LOGPROB_TOL, (rec["prompt_ids"], err)
        assert toks == rec["greedy"], rec["prompt_ids"]


def test_the_family_specifics_are_read() -> None:
    for src in SOURCES:
        hp = load_model(source("f32", src)).hparams
        assert (hp.n_expert, hp.n_expert_used, hp.n_ff, hp.head_dim) == (4, 2, 64, 16)
        assert (hp.sliding_window, hp.window_layers) == (4, [0, 2])
        rs = hp.rope_scaling
        assert (rs.type, rs.factor, rs.original_max_position, rs.truncate) == (
            "yarn",
            32.0,
            4096,
            False,
        )
        assert (hp.rope_style, hp.rope_theta, hp.swiglu_limit) == ("neox", 150000.0, 7.0)
    spec = lm(load_model(source("mxfp4", "gguf"))).spec  # type: ignore[attr-defined]
    assert spec.windows == (4, 0, 4) and spec.attn_sinks == (True,) * 3 and spec.moe_oai
    assert {"attn_sinks", "attn_out_bias", "moe_oai", "windows", "qkv_bias"} <= spec.features()


def _worst(model: LanguageModel) -> float:
    return max(check_record(model, r)[0] for r in golden(GOLDEN)["records"])


@pytest.mark.parametrize("part", ["sinks", "clamp", "router_bias", "truncate", "window"])
def test_each_part_is_what_matches(part: str) -> None:
    """Without its sinks, the SwiGLU's clamp, the router's bias, YaRN's unrounded ramp or
    the window, the model no longer matches transformers: each is exercised."""
    ir = load_model(source("f32", "gguf"))
    if part == "truncate":
        ir.hparams.rope_scaling.truncate = True  # llama.cpp's rounding
    if part == "window":
        ir.hparams.sliding_window = 0
    if part == "clamp":
        ir.hparams.swiglu_limit = 1e9
    model = lm(ir)
    assert isinstance(model, Decoder)
    for b in model.blocks:
        if part == "sinks":
            b.sinks = None
        if part == "router_bias":
            assert b.experts is not None and b.experts.oai is not None
            b.experts.oai.router = np.zeros_like(b.experts.oai.router)
    err = _worst(model)
    assert err > 0.5 * LOGPROB_TOL if part == "truncate" else err > 10 * LOGPROB_TOL


def _digest(v: Any) -> Any:
    if (isinstance(v, list) and len(v) > 16) or (isinstance(v, str) and len(v) > 200):
        return {"len": len(v), "sha256": hashlib.sha256(json.dumps(v).encode()).hexdigest()}
    return v


@pytest.mark.parametrize("kind", KINDS)
def test_the_gguf_is_the_converters(kind: str) -> None:
    """Our GGUF equals what llama.cpp's ``convert_hf_to_gguf.py`` wrote of the same HF
    directory: every metadata value, every tensor's type, shape and bytes."""
    import gguf

    want = golden("gptoss_manifest.json")["files"][kind]
    r = gguf.GGUFReader(source(kind, "gguf"))
    meta = {
        f.name: _digest(f.contents()) for f in r.fields.values() if not f.name.startswith("GGUF.")
    }
    assert meta == want["metadata"]
    tensors = {
        t.name: {
            "type": t.tensor_type.name,
            "shape": [int(x) for x in t.shape],
            "sha256": hashlib.sha256(bytes(t.data)).hexdigest(),
        }
        for t in r.tensors
    }
    assert tensors == want["tensors"]


def test_the_hf_mxfp4_experts_are_kept_in_blocks() -> None:
    """The release's ``*_blocks`` / ``*_scales`` become the GGUF's MXFP4 bytes, not floats."""
    hf, gg = load_model(source("mxfp4", "hf")), load_model(source("mxfp4", "gguf"))
    for name, t in gg.tensors.items():
        u = hf.tensors[name]
        assert (t.dtype, t.shape) == (u.dtype, u.shape), name
        np.testing.assert_array_equal(np.asarray(t.data()), np.asarray(u.data()), err_msg=name)


def test_harmony_ends_generation_on_return_and_call_only() -> None:
    """As llama.cpp: <|return|> and <|call|> end generation, <|end|> (the end of the
    analysis message, before the final one) does not."""
    ir = load_model(source("mxfp4", "gguf"))
    assert ir.tokenizer is not None
    tok = Tokenizer(ir.tokenizer)
    ids = {
        t: tok.encode(t, add_special=False, parse_special=True)[0]
        for t in ("<|return|>", "<|call|>", "<|end|>")
    }
    assert {ids["<|return|>"], ids["<|call|>"]} <= tok.eot_ids and ids["<|end|>"] not in tok.eot_ids


def _chat(tok_ir: ModelIR) -> list[int]:
    assert tok_ir.tokenizer is not None
    fmt = PromptFormat.build(tok_ir.tokenizer, tok_ir.chat_template)
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What works?"},
        {"role": "assistant", "content": "Everything."},
        {"role": "user", "content": "Really?"},
    ]
    return fmt.chat(msgs).ids


# a near tie: llama.cpp quantizes the activations to int8 against MXFP4 weights
MARGIN = {"f32": 0.01, "mxfp4": 0.05}


@pytest.mark.parametrize("kind", KINDS)
def test_llamacpp_runs_the_gguf_the_same(kind: str, tmp_path: Path) -> None:
    """llama.cpp's server on our GGUF: the same text and harmony chat prompt ids, and the
    same greedy continuations up to a near tie (llama.cpp's f16 KV cache, its int8
    activations against MXFP4, and its YaRN ramp rounded to whole dimensions may flip one)."""
    pytest.importorskip("xllamacpp")

    from modelc.bench.llamacpp import LlamaCppServer

    g = golden(GOLDEN)
    ir = load_model(source(kind, "gguf"))
    assert ir.tokenizer is not None
    tok = Tokenizer(ir.tokenizer)
    model = lm(ir)
    ours_chat = _chat(ir)
    gg = source(kind, "gguf")
    with LlamaCppServer(gg, threads=1, n_parallel=1, n_ctx=256, log=tmp_path / "lc.log") as s:
        theirs = net.post(f"{s.url}/tokenize", json={"content": g["text"]}, timeout=30)
        assert theirs.json()["tokens"] == tok.encode(g["text"], add_special=True)
        msgs = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What works?"},
            {"role": "assistant", "content": "Everything."},
            {"role": "user", "content": "Really?"},
        ]
        text = net.post(f"{s.url}/apply-template", json={"messages": msgs}, timeout=30)
        body = {"content": text.json()["prompt"], "add_special": True, "parse_special": True}
        theirs_chat = net.post(f"{s.url}/tokenize", json=body, timeout=30).json()["tokens"]
        assert theirs_chat == ours_chat
        compared = 0
        for rec in g["records"]:
            if set(rec["greedy"]) & tok.eot_ids:
                continue
            n = len(rec["greedy"])
            ours, cut = greedy_to_near_tie(model, rec["prompt_ids"], n, margin=MARGIN[kind])
            got = llamacpp_greedy(s.url, rec["prompt_ids"], n)
            assert got[:cut] == ours[:cut], (rec["prompt_ids"], cut)
            compared += cut
    assert compared >= 24, compared  # most tokens were picked by a clear margin


def _engine(kind: str, **kw: Any) -> LLMEngine:
    opts = EngineOptions(kv_cache="f32", **({"speculative": False} | kw))
    return build_engine(load_model(source(kind, "gguf")), opts, backend=make_backend("cpu-exact"))


def _alone(eng: LLMEngine, prompt: list[int], n: int) -> list[int]:
    assert eng.lm is not None
    p = SamplingParams(temperature=0.0, max_tokens=n)
    return decode_alone(eng.lm, eng.lm.new_cache("f32", max_tokens=256), prompt, p)


async def _run(
    eng: LLMEngine, prompts: list[list[int]], n: int
) -> list[tuple[list[int], FinishEvent]]:
    got: dict[int, tuple[list[int], FinishEvent]] = {}

    async def one(i: int) -> None:
        p = SamplingParams(temperature=0.0, max_tokens=n)
        toks: list[int] = []
        async for ev in eng.submit(GenerationRequest(f"r{i}", prompts[i], p, ignore_eos=True)):
            if isinstance(ev, TokenEvent):
                toks.append(ev.token_id)
            else:
                got[i] = (toks, ev)

    async with trio.open_nursery() as n_:
        await n_.start(eng.run)
        async with trio.open_nursery() as m:
            for i in range(len(prompts)):
                m.start_soon(one, i)
        n_.cancel_scope.cancel()
    return [got[i] for i in range(len(prompts))]


PROMPTS = [[17, 200, 31, 99], list(range(100, 140)), [300, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]


@pytest.mark.parametrize("kind", KINDS)
async def test_batched_equals_one_at_a_time(kind: str) -> None:
    """Three requests batched by the engine: each gets the tokens it gets alone (the
    requests' ``ignore_eos`` bans the end ids, which the alone runs do not pick)."""
    eng = _engine(kind)
    want = [_alone(eng, p, 10) for p in PROMPTS]
    assert eng.tok is not None and not {t for w in want for t in w} & eng.tok.eot_ids
    got = await _run(eng, PROMPTS, 10)
    assert [t for t, _ in got] == want


async def test_the_prefix_cache_and_speculation_give_the_same_tokens() -> None:
    """A prefix-cache hit (8-token blocks) and prompt-lookup speculation on a repetitive
    prompt: the tokens of plain decoding."""
    base = list(range(100, 140))
    a, b = [*base, 5, 6, 7], [*base, 9, 8]
    eng = _engine("mxfp4", prefix_block_tokens=8)
    want = [_alone(eng, p, 8) for p in (a, b)]
    ((ta, fa),) = await _run(eng, [a], 8)
    ((tb, fb),) = await _run(eng, [b], 8)
    assert [ta, tb] == want and fa.cached_tokens == 0 and fb.cached_tokens == 40
    loop = [42, 7, 9, 13] * 6
    spec = _engine(
        "mxfp4", speculative=True, draft="prompt-lookup", spec_adaptive=False, spec_min_prompt=0
    )
    ((ts, fs),) = await _run(spec, [loop], 16)
    assert ts == _alone(spec, loop, 16) and fs.spec_drafted > 0


def test_pack_and_inspect(tmp_path: Path) -> None:
    """``modelc pack`` makes the same tensors of the MXFP4 HF directory and of its GGUF
    (the experts MXFP4 in both), and ``modelc inspect`` shows what sets gpt-oss apart."""
    from modelc.artifact import open_artifact
    from tests.cli_support import Cli

    cli = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    for src in SOURCES:
        cli("pack", str(source("mxfp4", src)), "-o", str(tmp_path / f"{src}.modelc"))
    arts = [open_artifact(tmp_path / f"{src}.modelc") for src in SOURCES]
    try:
        a, b = (art.to_ir() for art in arts)
        assert a.architecture == b.architecture == "gpt-oss" and sorted(a.tensors) == sorted(
            b.tensors
        )
        for name, t in a.tensors.items():
            u = b.tensors[name]
            assert (t.dtype, t.shape) == (u.dtype, u.shape), name
            np.testing.assert_array_equal(t.data(), u.data(), err_msg=name)
        assert a.tensors["blk.0.ffn_up_exps.weight"].dtype is DType.MXFP4
    finally:
        for art in arts:
            art.close()
    out = cli("inspect", str(tmp_path / "gguf.modelc")).stdout
    for want in (
        "quantization   mxfp4 (+f32)",
        "RoPE neox (theta 150000, yarn x32)",
        "sliding window 4 (2 of 3 layers)",
        "attention sinks",
        "4 experts, 2 a token",
        "SwiGLU clamped at 7",
    ):
        assert want in out, (want, out)


def test_cuda_runs_it_and_compile_runs_the_decoder() -> None:
    """The device-resident CUDA forward runs gpt-oss's parts (sinks, the attention output's
    bias, its experts: tests/test_cuda.py holds them to the CPU), so its host model is made
    with no refusal; ``modelc compile`` gives the program the runtime's decoder."""
    from modelc.compile.spec import forward_note, model_spec
    from modelc.runtime.backends.cuda_family import cuda_host

    ir = load_model(source("mxfp4", "gguf"))
    cuda_host(ir)  # no refusal
    spec = model_spec(ir, "tiny-gptoss")
    assert spec["template"] == "runtime" and "attention sinks" in forward_note(spec)
