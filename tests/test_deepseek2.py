"""DeepSeek V2-Lite- and V3-shaped models (``deepseek2``): multi-head latent attention with
its compressed KV cache, mixtures with shared experts and grouped sigmoid routing; and
GLM-4.5 (``glm4moe``), DeepSeek-V3's mixture under GQA attention with Q/K/V biases, Q/K
norms and half-rotated heads.

The tiny random models are numpy-made by ``tests/gen_deepseek2.py`` and
``tests/gen_glm4moe.py`` (HF directory and GGUF); ``scripts/make_tiny_deepseek2.py`` made
their goldens in the reference venv: transformers' f32 records
(``tests/golden/deepseek2_<model>.json``, ``glm4moe.json``) and the manifest of the GGUF
llama.cpp's own converter writes for the same HF directory (``..._manifest.json``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import trio

from modelc.artifact import open_artifact
from modelc.engine import EngineOptions, build_engine
from modelc.engine.api import FinishEvent, GenerationRequest, TokenEvent
from modelc.errors import UnsupportedError
from modelc.formats import load_model
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import Decoder, build
from modelc.runtime.chat_template import render_chat
from modelc.runtime.kv_cache import KVShape
from modelc.runtime.model import SeqChunk
from modelc.runtime.sampling import SamplingParams
from modelc.runtime.tokenizer import Tokenizer
from tests.cli_support import Cli
from tests.gen_deepseek2 import ensure_model, make_weights, manifest, write_gguf
from tests.gen_glm4moe import ensure_model as ensure_glm
from tests.peers import greedy_to_near_tie, llamacpp_greedy
from tests.runtime_support import LOGPROB_TOL, check_record, golden, make_backend

MODELS = ["v2lite", "v3", "glm4moe"]
SOURCES = ["hf", "gguf"]
TEMPLATES = Path(__file__).parent / "fixtures" / "templates"  # llama.cpp's copies


def source(model: str, kind: str) -> Path:
    hf, gguf = ensure_glm() if model == "glm4moe" else ensure_model(model)
    return hf if kind == "hf" else gguf


def arch(model: str) -> str:
    return "glm4moe" if model == "glm4moe" else "deepseek2"


def golden_name(model: str) -> str:
    return "glm4moe" if model == "glm4moe" else f"deepseek2_{model}"


def lm(ir: ModelIR) -> Decoder:
    model = build(ir, make_backend("cpu-exact"))
    assert isinstance(model, Decoder)
    return model


def records(model: str) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = golden(f"{golden_name(model)}.json")["records"]
    return recs


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("model", MODELS)
def test_matches_transformers(model: str, kind: str) -> None:
    ir = load_model(source(model, kind))
    assert ir.architecture == arch(model)
    m = lm(ir)
    for rec in records(model):
        err, toks = check_record(m, rec)
        assert err < LOGPROB_TOL, (rec["prompt_ids"], err)
        assert toks == rec["greedy"], rec["prompt_ids"]


@pytest.mark.parametrize("model", MODELS)
def test_the_gguf_is_the_converters(model: str) -> None:
    """The GGUF the tests write is, key by key and tensor by tensor, what llama.cpp's
    ``convert_hf_to_gguf.py`` writes for the same HF directory (kv_b split into k_b / v_b)."""
    theirs = golden(f"{golden_name(model)}_manifest.json")
    ours = manifest(source(model, "gguf"))
    assert ours["metadata"] == theirs["metadata"]
    assert ours["tensors"] == theirs["tensors"]
    assert "blk.1.exp_probs_b.bias" in ours["tensors"] or model == "v2lite"


def test_hf_and_gguf_read_alike() -> None:
    for model in MODELS:
        a, b = (load_model(source(model, k)).hparams for k in SOURCES)
        assert a.mla == b.mla and a.routing == b.routing and a.rope_dim == b.rope_dim
        assert (a.n_head, a.n_head_kv, a.head_dim, a.n_expert) == (
            b.n_head,
            b.n_head_kv,
            b.head_dim,
            b.n_expert,
        )
        assert a.attn_scale == pytest.approx(b.attn_scale, rel=1e-6)
    v3 = load_model(source("v3", "gguf")).hparams
    assert v3.mla is not None and v3.mla.q_rank == 48 and v3.routing is not None
    assert (v3.routing.gating, v3.routing.n_group, v3.routing.n_group_used) == ("sigmoid", 4, 2)
    assert (v3.routing.scale, v3.routing.norm, v3.routing.n_dense_lead) == (2.5, True, 1)
    glm = load_model(source("glm4moe", "hf")).hparams
    assert (glm.head_dim, glm.rope_dim, glm.rope_style, glm.n_head_kv) == (16, 8, "neox", 2)


@pytest.mark.parametrize(
    ("model", "change"),
    [
        ("v3", "groups"),
        ("v3", "bias"),
        ("v3", "mscale"),
        ("v2lite", "shared"),
        ("glm4moe", "partial"),
        ("glm4moe", "scale"),
    ],
)
def test_the_specifics_are_what_matches(model: str, change: str) -> None:
    """Without its group limit, correction bias, YaRN mscale, shared experts, partial RoPE
    or routed scale a model no longer matches transformers: the goldens exercise each."""
    ir = load_model(source(model, "gguf"))
    hp = ir.hparams
    assert hp.routing is not None
    if change == "groups":
        hp.routing.n_group = 0
    elif change == "mscale":
        hp.attn_scale = 1 / hp.head_dim**0.5
    elif change == "partial":
        hp.rope_dim = 0
    elif change == "scale":
        hp.routing.scale = 1.0
    m = lm(ir)
    for b in m.blocks:
        if b.experts is not None and change == "bias":
            b.experts.bias = None
        if b.experts is not None and change == "shared":  # loaded from the file's tensors
            b.experts.shared = None
    worst = max(check_record(m, r)[0] for r in records(model))
    assert worst > 10 * LOGPROB_TOL


def test_the_cache_holds_the_latent() -> None:
    """One row of latent + RoPE key part a token and layer (llama.cpp's MLA cache), not the
    heads' keys and values: 3 layers x (32 + 8) f32 a token."""
    m = lm(load_model(source("v3", "gguf")))
    assert m.kv_shape == KVShape(3, 1, 40, shared_values=True)
    assert m.kv_shape.bytes_per_token(m.new_cache("f32").mode) == 3 * 40 * 4
    cache = m.new_cache("f32", max_tokens=256)
    assert cache.nbytes_at(256) == 256 * 3 * 40 * 4
    expanded = 3 * 2 * 4 * 24 * 4  # the heads' keys (nope + rope) and values, padded alike
    assert cache.nbytes_at(256) < 256 * expanded / 4
    for mode in ("f16", "int8"):  # the other storage modes run it too
        err, toks = check_record(m, records("v3")[2], mode)
        assert err < 0.05 and len(toks) == 16


def test_context_shift_rerotates_the_rope_part() -> None:
    """The first layer's shifted cache equals one computed on the kept tokens at their new
    positions (the latent stays, the RoPE tail is rotated back; later layers' rows saw the
    dropped tokens)."""
    m = lm(load_model(source("v2lite", "gguf")))
    ids = list(range(100, 130))
    a = m.new_cache("f32", max_tokens=64)
    m.forward([SeqChunk(a, ids)])
    m.shift_context(a, 4, 10)
    b = m.new_cache("f32", max_tokens=64)
    m.forward([SeqChunk(b, ids[:4] + ids[14:])])
    np.testing.assert_allclose(a.read(0, a.n)[0], b.read(0, b.n)[0], atol=2e-5)


async def _engine(
    ir: ModelIR, prompts: list[list[int]], n: int, **opts: Any
) -> tuple[list[list[int]], int]:
    """Greedy tokens of ``prompts`` submitted together; the prefix-cache tokens reused."""
    eng = build_engine(ir, EngineOptions(kv_cache="f32", **opts), backend=make_backend("cpu-exact"))
    k = len(prompts)
    out: list[list[int]] = [[] for _ in range(2 * k)]
    cached = 0

    async def one(i: int) -> None:  # slot i: prompt i % k
        nonlocal cached
        p = SamplingParams(temperature=0, max_tokens=n)
        req = GenerationRequest(f"r{i}", prompts[i % k], p, ignore_eos=True)
        async for ev in eng.submit(req):
            if isinstance(ev, TokenEvent):
                out[i].append(ev.token_id)
            elif isinstance(ev, FinishEvent):
                cached += ev.cached_tokens

    async with trio.open_nursery() as nursery:
        await nursery.start(eng.run)
        async with trio.open_nursery() as m:
            for i in range(k):
                m.start_soon(one, i)
        for i in range(k, 2 * k):  # again, one at a time: the prefix cache serves them
            await one(i)
        nursery.cancel_scope.cancel()
    return out, cached


@pytest.mark.parametrize("model", MODELS)
async def test_batched_prefix_cache_and_speculation_agree(model: str) -> None:
    """Batched with another request, from the prefix cache, and with prompt-lookup drafts,
    each prompt gets the tokens it gets alone (the CPU kernels are bit-identical by row)."""
    ir = load_model(source(model, "gguf"))
    m = lm(ir)
    shared = [(7 * i) % 300 + 40 for i in range(40)]
    prompts = [[*shared, 5, 9, 11], [*shared, 200, 17]]
    want = [greedy_to_near_tie(m, p, 10)[0] for p in prompts]
    eog = Tokenizer(ir.tokenizer).eot_ids if ir.tokenizer else set()
    assert not any(set(w) & eog for w in want)
    got, cached = await _engine(ir, prompts, 10, speculative=False)
    assert got == want + want and cached >= 32
    spec, _ = await _engine(ir, prompts, 10, speculative=True, spec_min_prompt=0)
    assert spec == want + want


INSPECT = {
    "v3": [
        "latent attention (KV rank 32, RoPE 8, Q rank 48)",
        "sigmoid routing, top 2 of 4 groups, 1 shared, first 1 dense",
    ],
    "glm4moe": [
        "RoPE neox (theta 1e+06)",
        "partial RoPE (8 of each head's 16 dimensions)",
        "QKV bias",
        "Q/K norm",
        "sigmoid routing, 1 shared, first 1 dense",
    ],
}


@pytest.mark.parametrize("model", sorted(INSPECT))
def test_pack_and_inspect(model: str, tmp_path: Path) -> None:
    """``modelc pack`` of the HF directory (DeepSeek's kv_b split at load, as the converter
    splits it) runs as the GGUF does, and ``inspect`` names what sets the family apart."""
    cli = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    cli("pack", str(source(model, "hf")), "-o", str(tmp_path / "m.modelc"))
    outs = []
    art = open_artifact(tmp_path / "m.modelc")
    try:
        for ir in (art.to_ir(), load_model(source(model, "gguf"))):
            m = lm(ir)
            outs.append(m.forward([SeqChunk(m.new_cache("f32"), [5, 17, 99, 200])]))
    finally:
        art.close()
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5)
    out = cli("inspect", str(tmp_path / "m.modelc")).stdout
    assert f"architecture   {arch(model)}" in out
    for want in INSPECT[model]:
        assert want in out, (want, out)


@pytest.mark.parametrize(
    ("model", "what"), [("v2lite", "multi-head latent attention"), ("glm4moe", "partial RoPE")]
)
def test_cuda_runs_glm_refuses_mla_and_compile_runs_the_decoder(
    model: str, what: str, tmp_path: Path
) -> None:
    """The device-resident CUDA forward runs GLM-4.5's parts (its sigmoid routing and shared
    expert, partial RoPE, Q/K/V biases with Q/K norms: tests/test_cuda.py) and refuses MLA
    alone, in one line (``--device cuda`` then runs the model op by op); ``modelc compile``
    writes a program whose forward is the runtime's decoder, saying so and why in one line."""
    from modelc.runtime.backends.cuda_family import cuda_host

    ir = load_model(source(model, "gguf"))
    if model == "glm4moe":
        cuda_host(ir)  # no refusal
    else:
        with pytest.raises(UnsupportedError, match=what) as e:
            cuda_host(ir)
        assert "\n" not in str(e.value) and "routing" not in str(e.value)
    cli = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    out = cli("compile", str(source(model, "gguf")), "-o", str(tmp_path / "x")).stdout
    (line,) = [ln for ln in out.splitlines() if "forward:" in ln]
    assert "modelc's decoder" in line and what in line, out
    assert (tmp_path / "x" / "pyproject.toml").exists()


@pytest.mark.parametrize("model", MODELS)
def test_llamacpp_runs_the_gguf_the_same(model: str, tmp_path: Path) -> None:
    """llama.cpp's server on our GGUF (its MLA path, the latent cache): the same greedy
    continuations, up to a near tie.  The V2-Lite-shaped GGUF gets ``q_lora_rank`` 0
    (llama.cpp tells a model without Q LoRA by V2-Lite's layer count, 27)."""
    pytest.importorskip("xllamacpp")
    from modelc.bench.llamacpp import LlamaCppServer

    ir = load_model(source(model, "gguf"))
    assert ir.tokenizer is not None
    eog = Tokenizer(ir.tokenizer).eot_ids
    m = lm(ir)
    gg = source(model, "gguf")
    if model == "v2lite":
        gg = tmp_path / "lite.gguf"
        write_gguf(model, make_weights(model), gg, lite_key=True)
    log = tmp_path / "lc.log"
    with LlamaCppServer(gg, threads=1, n_parallel=1, n_ctx=256, log=log) as s:
        compared = agreed = 0
        for rec in records(model):
            if set(rec["greedy"]) & set(eog):
                continue
            ours, cut = greedy_to_near_tie(m, rec["prompt_ids"], len(rec["greedy"]))
            theirs = llamacpp_greedy(s.url, rec["prompt_ids"], len(rec["greedy"]))
            assert theirs[:cut] == ours[:cut], (rec["prompt_ids"], cut)
            compared += 1
            agreed += cut
    assert compared >= 4 and agreed >= 4 * compared  # not near ties from the start


RENDERED = {  # the templates' own markup for a system and a user message
    "deepseek-ai-DeepSeek-V3.1.jinja": "<｜begin▁of▁sentence｜>Be brief.<｜User｜>What works?"
    "<｜Assistant｜><think></think>",
    "moonshotai-Kimi-K2.jinja": "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
    "<|im_user|>user<|im_middle|>What works?<|im_end|><|im_assistant|>assistant<|im_middle|>",
    "GLM-4.6.jinja": "[gMASK]<sop><|system|>\nBe brief.<|user|>\nWhat works?<|assistant|>",
}


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_the_family_template_renders(name: str) -> None:
    """DeepSeek V3.1's, Kimi-K2's and GLM-4.6's templates (llama.cpp's copies) render a
    chat through modelc's template path as their own markup."""
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What works?"},
    ]
    bos = "<｜begin▁of▁sentence｜>"
    assert render_chat((TEMPLATES / name).read_text(), msgs, bos_token=bos) == RENDERED[name]


def test_a_q8_0_gguf_runs_as_llamacpp_runs_it(tmp_path: Path) -> None:
    """The V3-shaped model with its matrices in Q8_0 (``attn_v_b``, the experts and the
    latent's ``attn_kv_a_mqa`` among them; rows of 16 or 48 stay f32): close to
    transformers' f32 answer, and llama.cpp's greedy tokens on the same file."""
    pytest.importorskip("xllamacpp")
    from modelc.bench.llamacpp import LlamaCppServer
    from modelc.formats.ir import DType

    gg = tmp_path / "q8.gguf"
    write_gguf("v3", make_weights("v3"), gg, quant=gguf.GGMLQuantizationType.Q8_0)
    ir = load_model(gg)
    assert ir.tensors["blk.1.attn_v_b.weight"].dtype is DType.Q8_0
    assert ir.tensors["blk.1.ffn_down_exps.weight"].dtype is DType.Q8_0
    m = lm(ir)
    recs = records("v3")
    assert max(check_record(m, r)[0] for r in recs) < 0.1
    assert ir.tokenizer is not None
    eog = Tokenizer(ir.tokenizer).eot_ids  # llama.cpp bans them
    with LlamaCppServer(gg, threads=1, n_parallel=1, n_ctx=256, log=tmp_path / "lc.log") as s:
        agreed = 0
        for rec in [r for r in recs if not set(r["greedy"]) & eog][:4]:
            ours, cut = greedy_to_near_tie(m, rec["prompt_ids"], len(rec["greedy"]))
            theirs = llamacpp_greedy(s.url, rec["prompt_ids"], len(rec["greedy"]))
            assert theirs[:cut] == ours[:cut], (rec["prompt_ids"], cut)
            agreed += cut
    assert agreed >= 16


def test_the_prefix_cache_keeps_the_latent_once() -> None:
    """A prefix-cache block of an MLA model holds the latent rows once (values are read
    from them): 3 layers x 32 tokens x 40 f32, and a hit gives the same logits."""
    from modelc.engine.prefix_cache import PrefixCache

    m = lm(load_model(source("v3", "gguf")))
    ids = [(5 * i) % 300 + 30 for i in range(70)]
    a = m.new_cache("f32", max_tokens=128)
    want = m.forward([SeqChunk(a, ids)])
    pc = PrefixCache(m.kv_shape, 1 << 20)
    assert pc.insert(ids, a) == 2
    assert pc.bytes_used == 2 * 3 * 32 * 40 * 4
    b = m.new_cache("f32", max_tokens=128)
    blocks = pc.match(ids)
    assert pc.load(blocks, b) == 64
    got = m.forward([SeqChunk(b, ids[64:])])
    np.testing.assert_array_equal(got, want)
