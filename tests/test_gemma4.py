"""Gemma 4 (text) against transformers and llama.cpp, from its HF directory and its GGUF.

The tiny random models (``tests/gen_gemma4.py``: ``gemma4`` with per-layer input
embeddings, KV-sharing layers, global layers with their own head size / KV heads /
proportional RoPE / values from keys, V norms, output scalars, soft-capped logits;
``gemma4moe`` with a mixture of experts beside each FFN) and their goldens
(``scripts/make_tiny_gemma4.py``: transformers 5.23 f32 top-10 log-probabilities and
16-token greedy continuations).  llama.cpp's server runs the same GGUF with Gemma 4's real
chat template.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import trio

from modelc.artifact import open_artifact
from modelc.engine import EngineOptions, build_engine
from modelc.engine.api import FinishEvent, GenerationRequest, TokenEvent
from modelc.errors import ModelcError
from modelc.formats import load_model
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import build
from modelc.runtime.arch.decoder import Decoder
from modelc.runtime.model import LanguageModel
from modelc.runtime.prompt import PromptFormat
from modelc.runtime.sampling import SamplingParams
from modelc.runtime.tokenizer import Tokenizer
from tests import net
from tests.cli_support import Cli
from tests.gen_gemma4 import ensure_gemma4, make_weights, manifest, write_gguf
from tests.peers import greedy_to_near_tie, llamacpp_greedy
from tests.runtime_support import LOGPROB_TOL, check_record, decode_alone, golden, make_backend

GOLDEN = "family_gemma4.json"


VARIANTS = ["gemma4", "gemma4moe"]  # E2B-shaped dense, 26B-A4B-shaped mixture


def source(kind: str, variant: str = "gemma4") -> Path:
    hf, gguf = ensure_gemma4(variant)
    return hf if kind == "hf" else gguf


def lm(ir: ModelIR) -> LanguageModel:
    model = build(ir, make_backend("cpu-exact"))
    assert isinstance(model, LanguageModel)
    return model


@pytest.mark.parametrize("kind", ["hf", "gguf"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_matches_transformers(variant: str, kind: str) -> None:
    ir = load_model(source(kind, variant))
    assert ir.architecture == "gemma4"
    model = lm(ir)
    for rec in golden(f"family_{variant}.json")["records"]:
        err, toks = check_record(model, rec)
        assert err < LOGPROB_TOL, (rec["prompt_ids"], err)
        assert toks == rec["greedy"], rec["prompt_ids"]


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_gguf_is_the_converters(variant: str, kind: str, tmp_path: Path) -> None:
    """The GGUF the tests write equals what llama.cpp's convert_hf_to_gguf.py makes of the
    HF directory (``--outtype f32`` / ``q8_0``): metadata, and tensor by tensor the type,
    shape and bytes (``scripts/make_tiny_gemma4.py`` recorded the converter's)."""
    if kind == "f32":
        path = source("gguf", variant)
    else:
        path = tmp_path / "q8_0.gguf"
        write_gguf(make_weights(variant), path, gguf.GGMLQuantizationType.Q8_0, variant)
    theirs, ours = golden("gemma4_converter.json")[variant][kind], manifest(path)
    assert ours["metadata"] == theirs["metadata"]
    assert sorted(ours["tensors"]) == sorted(theirs["tensors"])
    for name, t in theirs["tensors"].items():
        assert ours["tensors"][name] == t, name


@pytest.mark.parametrize("kind", ["hf", "gguf"])
def test_tokenizer_and_chat_template_match_transformers(kind: str) -> None:
    """The Gemma-style vocabulary (BPE over ``▁``-escaped text, byte fallback, BOS added)
    and Gemma 4's chat template rendered through modelc's template path: transformers'
    ids of a text and of a chat prompt."""
    g = golden(GOLDEN)
    ir = load_model(source(kind))
    assert ir.tokenizer is not None and ir.chat_template is not None
    assert Tokenizer(ir.tokenizer).encode(g["text"], add_special=True) == g["text_ids"]
    fmt = PromptFormat.build(ir.tokenizer, ir.chat_template)
    assert fmt.chat(g["chat"]).ids == g["chat_ids_thinking"]  # llama.cpp's default
    off = fmt.chat(g["chat"], template_kwargs={"enable_thinking": False})
    assert off.ids == g["chat_ids"]  # transformers' default


def test_hf_and_gguf_read_alike() -> None:
    """config.json and the converter's GGUF keys give the same description."""
    hf, gg = (load_model(source(k)).hparams for k in ("hf", "gguf"))
    gg.norm_eps = hf.norm_eps  # f32 in GGUF
    assert hf == gg
    assert (hf.head_dim, hf.head_dim_global, hf.n_head_kv, hf.n_head_kv_global) == (16, 32, 2, 1)
    assert (hf.rope_dims_global, hf.n_kv_shared, hf.n_embd_per_layer) == (8, 2, 8)
    assert hf.window_layers == [0, 2] and hf.attn_scale == 1.0 and hf.final_softcap == 3.0
    model = lm(load_model(source("gguf")))
    assert isinstance(model, Decoder)
    assert model.spec.kv_source == (0, 1, 0, 1)
    assert model.kv_shape.n_layer == 2  # a cache layer per layer that writes K/V
    moe = [load_model(source(k, "gemma4moe")).hparams for k in ("hf", "gguf")]
    moe[1].norm_eps = moe[0].norm_eps
    assert moe[0] == moe[1]
    assert (moe[0].n_expert, moe[0].n_expert_used, moe[0].n_embd_per_layer) == (0, 2, 0)


def test_cuda_refuses_and_compile_runs_the_decoder(tmp_path: Path) -> None:
    """The device-resident CUDA forward does not run Gemma 4's layer kinds yet: one line
    naming them, before any GPU work (``--device cuda`` then runs the model op by op);
    ``modelc compile`` writes a program whose forward is the runtime's decoder, saying so
    in one line."""
    from modelc.runtime.backends.cuda_family import cuda_host

    ir = load_model(source("gguf"))
    with pytest.raises(ModelcError) as e:
        cuda_host(ir)
    msg = str(e.value)
    assert "\n" not in msg and "--device cuda does not run" in msg
    assert "per-layer input embeddings" in msg and "layers reusing the keys" in msg
    with pytest.raises(
        ModelcError, match=r"mixtures of experts beside the FFN.*--device cuda does not run"
    ):
        cuda_host(load_model(source("gguf", "gemma4moe")))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "modelc.cli",
            "compile",
            str(source("gguf")),
            "-o",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    (line,) = [ln for ln in p.stdout.splitlines() if "forward:" in ln]
    assert "modelc's decoder" in line and "per-layer input embeddings" in line, p.stdout
    assert (tmp_path / "x" / "pyproject.toml").exists()


def test_pack_and_inspect(tmp_path: Path) -> None:
    """``modelc pack`` of the HF directory and of the GGUF hold the same weights (the GGUF
    also its ``rope_freqs``), and both run the same."""
    cli = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    for k in ("hf", "gguf"):
        cli("pack", str(source(k)), "-o", str(tmp_path / f"{k}.modelc"))
    arts = [open_artifact(tmp_path / f"{k}.modelc") for k in ("hf", "gguf")]
    try:
        irs = [a.to_ir() for a in arts]
        assert irs[0].architecture == irs[1].architecture == "gemma4"
        assert sorted(irs[0].tensors) == sorted(set(irs[1].tensors) - {"rope_freqs.weight"})
        for name, t in irs[0].tensors.items():
            u = irs[1].tensors[name]
            assert (t.dtype, t.shape) == (u.dtype, u.shape), name
            np.testing.assert_array_equal(t.data(), u.data(), err_msg=name)
        rec = golden(GOLDEN)["records"][2]
        for ir in irs:
            assert check_record(lm(ir), rec)[1] == rec["greedy"]
    finally:
        for a in arts:
            a.close()
    out = cli("inspect", str(tmp_path / "gguf.modelc")).stdout
    assert "architecture   gemma4" in out
    assert "sliding window 4 (2 of 4 layers)" in out
    for want in (
        "global layers head_dim 32 (1 kv)",
        "proportional RoPE (8 dims)",
        "last 2 layers share K/V",
        "per-layer inputs 8",
    ):
        assert want in out, (want, out)


async def _collect(handle: Any) -> list[int]:
    return [ev.token_id async for ev in handle if isinstance(ev, TokenEvent)]


@pytest.mark.parametrize("variant", VARIANTS)
async def test_engine_batched_chunked_cached_speculative(variant: str) -> None:
    """Through the engine: small prefill chunks, prefix-cache hits, batching with other
    sequences and speculation give the one-at-a-time tokens (the KV-sharing layers read
    the cache layers of others, the windowed ones are moved)."""
    ir = load_model(source("gguf", variant))
    opts = EngineOptions(
        kv_cache="f32", prefill_chunk=3, step_tokens=8, prefix_block_tokens=4, speculative=False
    )
    eng = build_engine(ir, opts, backend=make_backend("cpu-exact"))
    assert eng.lm is not None
    rng = np.random.default_rng(4)
    shared = rng.integers(3, 384, 9).tolist()
    prompts = [shared + rng.integers(3, 384, n).tolist() for n in (1, 4, 7, 2)]
    p = SamplingParams(temperature=0.0, max_tokens=12)

    def alone(prompt: list[int]) -> list[int]:
        assert eng.lm is not None
        cache = eng.lm.new_cache(eng.mode, max_tokens=eng.max_context)
        return decode_alone(eng.lm, cache, prompt, p, [])

    expected = [alone(q) for q in prompts]
    got: dict[int, list[int]] = {}
    fins: list[FinishEvent] = []
    async with trio.open_nursery() as n:
        await n.start(eng.run)
        req = GenerationRequest("first", prompts[0], p, ignore_eos=True)
        got[0] = await _collect(eng.submit(req))

        async def one(i: int) -> None:
            req = GenerationRequest(f"r{i}", prompts[i], p, ignore_eos=True)
            toks = []
            async for ev in eng.submit(req):
                if isinstance(ev, TokenEvent):
                    toks.append(ev.token_id)
                else:
                    fins.append(ev)
            got[i] = toks

        async with trio.open_nursery() as inner:
            for i in (1, 2, 3):
                inner.start_soon(one, i)
        n.cancel_scope.cancel()
    assert [got[i] for i in range(4)] == expected
    assert all(f.cached_tokens == 8 for f in fins)

    rep = (rng.integers(3, 384, 6).tolist()) * 4  # prompt lookup finds drafts in it
    spec = build_engine(
        ir,
        EngineOptions(
            kv_cache="f32",
            speculative=True,
            draft="prompt-lookup",
            spec_min_prompt=0,
            spec_fixed_cost=True,  # drafts by the tokens, not by this machine's step times
        ),
        backend=make_backend("cpu-exact"),
    )
    want = alone(rep)
    async with trio.open_nursery() as n:
        await n.start(spec.run)
        toks, fin = [], None
        async for ev in spec.submit(GenerationRequest("s", rep, p, ignore_eos=True)):
            if isinstance(ev, TokenEvent):
                toks.append(ev.token_id)
            else:
                fin = ev
        n.cancel_scope.cancel()
    assert toks == want
    assert fin is not None and fin.spec_drafted > 0


# a conversation through a tool call: the template's tool declarations, call and response
TOOL_TURN: dict[str, Any] = {
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["city"],
                },
            },
        }
    ],
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "days": 2}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ],
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_llamacpp_runs_the_gguf_the_same(variant: str, tmp_path: Path) -> None:
    """llama.cpp's server on our GGUF (its own Gemma 4 chat template): transformers' ids
    of a text and of a rendered chat prompt, and modelc's greedy continuations (up to a
    near tie, which llama.cpp's f16 KV cache may break the other way)."""
    pytest.importorskip("xllamacpp")
    from modelc.bench.llamacpp import LlamaCppServer

    g = golden(f"family_{variant}.json")
    ir = load_model(source("gguf", variant))
    assert ir.tokenizer is not None
    tok, model = Tokenizer(ir.tokenizer), lm(ir)
    log = tmp_path / "lc.log"
    with LlamaCppServer(source("gguf", variant), threads=1, n_parallel=1, n_ctx=256, log=log) as s:
        body = {"content": g["text"], "add_special": True}
        theirs = net.post(f"{s.url}/tokenize", json=body, timeout=30).json()["tokens"]
        assert theirs == tok.encode(g["text"], add_special=True) == g["text_ids"]
        r = net.post(f"{s.url}/apply-template", json={"messages": g["chat"]}, timeout=30)
        body = {"content": r.json()["prompt"], "add_special": True, "parse_special": True}
        theirs = net.post(f"{s.url}/tokenize", json=body, timeout=30).json()["tokens"]
        assert theirs == g["chat_ids_thinking"]  # enable_thinking true, as modelc renders
        fmt = PromptFormat.build(ir.tokenizer, ir.chat_template)
        r = net.post(f"{s.url}/apply-template", json=TOOL_TURN, timeout=30)
        body = {"content": r.json()["prompt"], "add_special": True, "parse_special": True}
        theirs = net.post(f"{s.url}/tokenize", json=body, timeout=30).json()["tokens"]
        ours = fmt.chat(TOOL_TURN["messages"], tools=TOOL_TURN["tools"]).ids
        assert theirs == ours  # a tool call and its result, rendered with the tools
        compared = 0
        for rec in g["records"]:
            if set(rec["greedy"]) & tok.eot_ids:
                continue
            ours, cut = greedy_to_near_tie(model, rec["prompt_ids"], len(rec["greedy"]))
            theirs = llamacpp_greedy(s.url, rec["prompt_ids"], len(rec["greedy"]))
            assert theirs[:cut] == ours[:cut], cut
            compared += 1
    assert compared >= 4


def test_llamacpp_runs_the_q8_0_gguf_the_same(tmp_path: Path) -> None:
    """The converter's Q8_0 layout (its f16 fallback for rows of no whole block included):
    modelc's greedy continuations equal llama.cpp's on the same file (up to a near tie),
    both quantizing the activations to int8 against Q8_0 (modelc's exact f32 activations
    part from llama.cpp there on this soft-capped model's close logits).  The dense model
    only (the mixture's Q8_0 layout is held to the converter's above)."""
    pytest.importorskip("xllamacpp")
    variant = "gemma4"
    from modelc.bench.llamacpp import LlamaCppServer

    path = tmp_path / "q8_0.gguf"
    write_gguf(make_weights(variant), path, gguf.GGMLQuantizationType.Q8_0, variant)
    ir = load_model(path)
    assert ir.tokenizer is not None
    banned = sorted(Tokenizer(ir.tokenizer).eot_ids)  # llama.cpp's ignore_eos bans them
    model = build(ir, make_backend("cpu"))  # int8 activations against Q8_0, as llama.cpp
    assert isinstance(model, LanguageModel)
    with LlamaCppServer(path, threads=1, n_parallel=1, n_ctx=256, log=tmp_path / "lc.log") as s:
        for rec in golden(f"family_{variant}.json")["records"]:
            ours, cut = greedy_to_near_tie(model, rec["prompt_ids"], 12, banned)
            theirs = llamacpp_greedy(s.url, rec["prompt_ids"], 12)
            assert theirs[:cut] == ours[:cut], (rec["prompt_ids"], cut)


def test_lora_patches_what_the_layers_read_and_refuses_q_k_v(tmp_path: Path) -> None:
    """A PEFT adapter on the FFN's down projection patches the weight the decoder reads;
    one on Q (which Gemma 4's own attention holds) is refused in one line, never ignored."""
    import json

    from safetensors.numpy import save_file

    from modelc.errors import UsageError
    from modelc.runtime.lora import apply_adapter, load_adapter

    model = lm(load_model(source("gguf")))
    assert isinstance(model, Decoder)
    rng = np.random.default_rng(1)
    for module, rows, cols in (("mlp.down_proj", model.d, 96), ("self_attn.q_proj", 64, model.d)):
        d = tmp_path / module
        d.mkdir()
        pre = f"base_model.model.model.layers.1.{module}"
        a = (0.05 * rng.standard_normal((4, cols))).astype(np.float32)
        b = (0.05 * rng.standard_normal((rows, 4))).astype(np.float32)
        save_file(
            {pre + ".lora_A.weight": a, pre + ".lora_B.weight": b},
            str(d / "adapter_model.safetensors"),
        )
        target = module.split(".")[1]
        cfg = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": [target]}
        (d / "adapter_config.json").write_text(json.dumps(cfg))
        if target == "q_proj":
            with pytest.raises(UsageError, match="cannot patch"):
                apply_adapter(model, load_adapter(d))
        else:
            assert model.blocks[1].w_down is not None
            before = np.array(model.blocks[1].w_down.data)
            apply_adapter(model, load_adapter(d))
            np.testing.assert_allclose(
                model.blocks[1].w_down.data, before + 2.0 * (b @ a), atol=1e-6
            )


def test_the_text_of_a_conditional_generation_checkpoint(tmp_path: Path) -> None:
    """A Gemma4ForConditionalGeneration directory (``text_config``, weights under
    ``model.language_model.``, towers beside them) reads as the text model."""
    import json
    import shutil

    from safetensors.numpy import load_file, save_file

    src, d = source("hf"), tmp_path / "cg"
    shutil.copytree(src, d)
    text = json.loads((src / "config.json").read_text())
    cfg = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": {**text, "architectures": None},
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 8},
    }
    (d / "config.json").write_text(json.dumps(cfg))
    weights = load_file(str(src / "model.safetensors"))
    moved = {k.replace("model.", "model.language_model.", 1): v for k, v in weights.items()}
    moved["model.vision_tower.encoder.layers.0.mlp.gate_proj.linear.weight"] = np.ones(
        (8, 8), np.float32
    )
    moved["model.embed_vision.embedding_projection.weight"] = np.ones((64, 8), np.float32)
    save_file(moved, str(d / "model.safetensors"))
    ir, plain = load_model(d), load_model(src)
    assert ir.hparams == plain.hparams and sorted(ir.tensors) == sorted(plain.tensors)
    rec = golden(GOLDEN)["records"][3]
    err, toks = check_record(lm(ir), rec)
    assert err < LOGPROB_TOL and toks == rec["greedy"]


def test_an_older_gemma4_template_renders_tool_turns_as_llamacpp(tmp_path: Path) -> None:
    """An older Gemma 4 template (``google-gemma-4-31B-it-interleaved``: no ``role: tool``
    handling) gets llama.cpp's rewrite: the call, its results (``tool_responses``) and the
    answer as one model turn; the prompt ids equal llama.cpp's server's."""
    pytest.importorskip("xllamacpp")
    from modelc.bench.llamacpp import LlamaCppServer

    tpl = (
        Path(__file__).parent / "fixtures" / "templates" / "google-gemma-4-31B-it-interleaved.jinja"
    )
    ir = load_model(source("gguf"))
    assert ir.tokenizer is not None
    fmt = PromptFormat.build(ir.tokenizer, tpl.read_text())
    answer = {"role": "assistant", "content": "Sunny for two days."}
    turn = {
        **TOOL_TURN,
        "messages": [*TOOL_TURN["messages"], answer, {"role": "user", "content": "Thanks!"}],
    }
    turn["messages"][2] = {**turn["messages"][2], "content": '{"sky": "sunny", "high": 21}'}
    log = tmp_path / "lc.log"
    with LlamaCppServer(
        source("gguf"), threads=1, n_parallel=1, n_ctx=256, log=log, chat_template=tpl
    ) as s:
        for body in (turn, TOOL_TURN):
            r = net.post(f"{s.url}/apply-template", json=body, timeout=30)
            text = r.json()["prompt"]
            assert "<|tool_response>" in text
            tok = {"content": text, "add_special": True, "parse_special": True}
            theirs = net.post(f"{s.url}/tokenize", json=tok, timeout=30).json()["tokens"]
            assert fmt.chat(body["messages"], tools=body["tools"]).ids == theirs, text
