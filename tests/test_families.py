"""Every dense family against transformers, from its HF directory and from its GGUF.

The tiny random models are numpy-made by ``tests/gen_families.py`` (HF directory and
GGUF in the layout llama.cpp's ``convert_hf_to_gguf.py`` writes, in the test-asset
cache); their goldens ``tests/golden/family_<family>.json`` come from
``scripts/make_tiny_families.py`` (reference venv; transformers f32: top-10 next-token
log-probabilities and 16-token greedy continuations of token-id prompts, the token ids
of a text and of a chat prompt, the same under RoPE scalings and other config changes).
One harness runs every family; llama.cpp's server (the ``xllamacpp`` wheel) runs the
qwen2, qwen3, gemma2, gemma3 and phi3 GGUFs to prove their layout.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from modelc.artifact import open_artifact
from modelc.engine import EngineOptions, build_engine
from modelc.engine.api import FinishEvent, GenerationRequest
from modelc.formats import load_model
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import build
from modelc.runtime.model import LanguageModel
from modelc.runtime.prompt import PromptFormat
from modelc.runtime.sampling import SamplingParams
from modelc.runtime.tokenizer import Tokenizer
from tests import net
from tests.cli_support import Cli
from tests.gen_families import ensure_family
from tests.peers import greedy_to_near_tie, llamacpp_greedy
from tests.runtime_support import LOGPROB_TOL, check_record, golden, make_backend

FAMILIES = ["qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3"]
ARCH = {f: f for f in FAMILIES} | {"mistral": "llama"}  # llama.cpp names Mistral llama
SOURCES = ["hf", "gguf"]


def source(family: str, kind: str) -> Path:
    hf, gguf = ensure_family(family)
    return hf if kind == "hf" else gguf


def load(family: str, kind: str) -> ModelIR:
    return load_model(source(family, kind))


def lm(ir: ModelIR) -> LanguageModel:
    model = build(ir, make_backend("cpu-exact"))
    assert isinstance(model, LanguageModel)
    return model


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("family", FAMILIES)
def test_matches_transformers(family: str, kind: str) -> None:
    ir = load(family, kind)
    assert ir.architecture == ARCH[family]
    model = lm(ir)
    for rec in golden(f"family_{family}.json")["records"]:
        err, toks = check_record(model, rec)
        assert err < LOGPROB_TOL, (rec["prompt_ids"], err)
        assert toks == rec["greedy"], rec["prompt_ids"]


def test_family_specifics_are_read() -> None:
    q2, q3, mi = load("qwen2", "gguf"), load("qwen3", "hf"), load("mistral", "hf")
    assert q2.hparams.rope_style == q3.hparams.rope_style == "neox"
    assert mi.hparams.rope_style == "interleaved"
    assert "blk.0.attn_q.bias" in q2.tensors and "output.weight" in q2.tensors
    assert not q2.hparams.tie_embeddings
    assert q3.hparams.tie_embeddings and "output.weight" not in q3.tensors
    assert q3.hparams.head_dim == 32 and q3.tensors["blk.0.attn_q_norm.weight"].shape == (32,)
    assert "blk.0.attn_q.bias" not in q3.tensors
    assert mi.hparams.sliding_window == load("mistral", "gguf").hparams.sliding_window == 8
    g2, g3, phi = load("gemma2", "gguf"), load("gemma3", "hf"), load("phi3", "gguf")
    assert g2.hparams.window_layers == [0, 2] and g3.hparams.window_layers == [0, 1, 2, 3, 4]
    assert (g2.hparams.attn_softcap, g2.hparams.final_softcap) == (3.0, 2.0)
    assert g3.hparams.rope_theta_local == 10000.0 and g3.hparams.rope_scaling.factor == 2.0
    assert "blk.0.attn_qkv.weight" in phi.tensors and "rope_factors_long.weight" not in phi.tensors
    assert phi.hparams.rope_scaling.short_factor == golden_config("phi3")["short_factor"]
    for name in ("hf", "gguf"):  # GGUF stores Gemma's norms as 1 + w, HF as w
        norm = load("gemma3", name).tensors["blk.0.attn_q_norm.weight"].data()
        assert 0.2 < float(np.mean(norm)) < 1.8
    for fam in FAMILIES:
        a, b = load(fam, "hf").hparams, load(fam, "gguf").hparams
        assert (a.n_head, a.n_head_kv, a.head_dim, a.n_ff) == (
            b.n_head,
            b.n_head_kv,
            b.head_dim,
            b.n_ff,
        )
        assert a.norm_eps == pytest.approx(b.norm_eps)  # GGUF keeps an f32


def golden_config(family: str) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads((source(family, "hf") / "config.json").read_text())
    return dict(cfg.get("rope_scaling") or {})


@pytest.mark.parametrize(
    ("family", "field"),
    [
        ("gemma2", "attn_softcap"),
        ("gemma2", "final_softcap"),
        ("gemma2", "sliding_window"),
        ("gemma3", "sliding_window"),
        ("gemma3", "rope_theta_local"),
    ],
)
def test_the_family_specifics_are_what_matches(family: str, field: str) -> None:
    """Without its soft-caps, windows or local RoPE base a family no longer matches
    transformers: each is exercised by the goldens."""
    ir = load(family, "gguf")
    setattr(ir.hparams, field, 0 if field == "sliding_window" else 0.0)
    model = lm(ir)
    recs = golden(f"family_{family}.json")["records"]
    assert max(check_record(model, r)[0] for r in recs) > 10 * LOGPROB_TOL


def test_the_sliding_window_is_what_matches() -> None:
    """Without its window Mistral's long prompts no longer match: the mask is exercised."""
    ir = load("mistral", "hf")
    ir.hparams.sliding_window = 0
    model = lm(ir)
    recs = golden("family_mistral.json")["records"]
    assert any(check_record(model, r)[1] != r["greedy"] for r in recs)


@pytest.mark.parametrize("family", FAMILIES)
def test_pack_and_inspect(family: str, tmp_path: Path) -> None:
    """``modelc pack`` makes the same tensors of the HF directory and of the GGUF, and
    ``modelc inspect`` shows the family and what sets it apart."""
    cli = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    for k in SOURCES:
        cli("pack", str(source(family, k)), "-o", str(tmp_path / f"{k}.modelc"))
    arts = [open_artifact(tmp_path / f"{k}.modelc") for k in SOURCES]
    try:
        irs = [a.to_ir() for a in arts]
        assert irs[0].architecture == irs[1].architecture == ARCH[family]
        assert sorted(irs[0].tensors) == sorted(irs[1].tensors)
        for name, t in irs[0].tensors.items():
            u = irs[1].tensors[name]
            assert (t.dtype, t.shape) == (u.dtype, u.shape), name
            np.testing.assert_array_equal(t.data(), u.data(), err_msg=name)
    finally:
        for a in arts:
            a.close()
    want = {
        "qwen2": ["head_dim 16", "RoPE neox", "QKV bias"],
        "qwen3": ["head_dim 32", "RoPE neox", "Q/K norm", "tied embeddings"],
        "mistral": ["RoPE interleaved", "sliding window 8 (3 of 3 layers)"],
        "gemma2": [
            "head_dim 16",
            "RoPE neox (theta 10000)",
            "sliding window 4 (2 of 3 layers)",
            "Q·K scale 0.25",  # query_pre_attn_scalar 16
            "soft-cap attention 3, logits 2",
            "tied embeddings",
        ],
        "gemma3": [
            "head_dim 32",
            "RoPE neox (theta 1e+06, linear x2; windowed layers theta 10000)",
            "Q/K norm",
            "sliding window 4 (5 of 6 layers)",
            "tied embeddings",
        ],
        "phi3": ["head_dim 16", "RoPE neox (theta 10000, longrope", "fused QKV"],
    }[family]
    for k in SOURCES:
        out = cli("inspect", str(tmp_path / f"{k}.modelc")).stdout
        assert f"architecture   {ARCH[family]}" in out
        for w in want:
            assert w in out, (w, out)


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_tokenizer_matches_transformers(family: str, kind: str) -> None:
    g = golden(f"family_{family}.json")
    ir = load(family, kind)
    assert ir.tokenizer is not None
    assert Tokenizer(ir.tokenizer).encode(g["text"], add_special=True) == g["text_ids"]
    fmt = PromptFormat.build(ir.tokenizer, ir.chat_template)
    chat = fmt.chat([{"role": "user", "content": "What works?"}])
    assert chat.ids == g["chat_ids"]  # transformers' apply_chat_template


async def _engine_greedy(ir: ModelIR, rec: dict[str, Any]) -> list[int]:
    eng = build_engine(
        ir, EngineOptions(kv_cache="f32", speculative=False), backend=make_backend("cpu-exact")
    )
    p = SamplingParams(temperature=0, max_tokens=len(rec["greedy"]))
    toks: list[int] = []
    async with trio.open_nursery() as n:
        await n.start(eng.run)
        req = GenerationRequest("r", rec["prompt_ids"], p, ignore_eos=True)
        async for ev in eng.submit(req):
            if not isinstance(ev, FinishEvent):
                toks.append(ev.token_id)
        n.cancel_scope.cancel()
    return toks


@pytest.mark.parametrize("family", FAMILIES)
async def test_engine_serves_the_greedy_continuation(family: str) -> None:
    ir = load(family, "gguf")
    assert ir.tokenizer is not None
    eog = Tokenizer(ir.tokenizer).eot_ids  # ignore_eos bans them; transformers did not
    recs = golden(f"family_{family}.json")["records"]
    recs = [r for r in recs if len(r["prompt_ids"]) > 8 and not set(r["greedy"]) & eog]
    assert recs  # prompts past Mistral's 8-token window
    for rec in recs:
        assert await _engine_greedy(ir, rec) == rec["greedy"]


async def test_engine_recomputes_a_phi3_sequence_crossing_longrope(tmp_path: Path) -> None:
    """LongRoPE through the engine: a sequence growing past the original context (16) is
    recomputed with the long factors, as transformers' generate does; without that the
    continuations of the crossing prompts differ."""
    case = golden("family_phi3.json")["scalings"][0]
    d = tmp_path / "phi3"
    shutil.copytree(source("phi3", "hf"), d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **case["config"]}))
    ir = load_model(d)
    switch = ir.hparams.rope_scaling.original_max_position
    recs = [r for r in case["records"] if len(r["prompt_ids"]) <= switch]
    crossing = [r for r in recs if len(r["prompt_ids"]) + len(r["greedy"]) - 1 > switch]
    assert len(crossing) >= 2
    for rec in recs:
        assert await _engine_greedy(ir, rec) == rec["greedy"], rec["prompt_ids"]
    model = lm(ir)
    model.forward = model._forward  # type: ignore[attr-defined,method-assign]  # no restarts
    assert any(check_record(model, r)[1] != r["greedy"] for r in crossing)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "gemma2", "gemma3", "phi3"])
def test_llamacpp_runs_the_gguf_the_same(family: str, tmp_path: Path) -> None:
    """llama.cpp's server on our GGUF: the same prompt ids and greedy continuations (up to
    a near tie, which llama.cpp's f16 KV cache may break the other way).

    Records whose greedy run passes an end-of-generation id are left out: llama.cpp's
    ``ignore_eos`` bans those ids, transformers does not.
    """
    pytest.importorskip("xllamacpp")

    from modelc.bench.llamacpp import LlamaCppServer

    g = golden(f"family_{family}.json")
    ir = load(family, "gguf")
    assert ir.tokenizer is not None
    tok = Tokenizer(ir.tokenizer)
    eog = tok.eot_ids
    model = lm(ir)
    gguf = source(family, "gguf")
    with LlamaCppServer(gguf, threads=1, n_parallel=1, n_ctx=256, log=tmp_path / "lc.log") as s:
        theirs = net.post(f"{s.url}/tokenize", json={"content": g["text"]}, timeout=30)
        assert theirs.json()["tokens"] == tok.encode(g["text"], add_special=True)
        compared = 0
        for rec in g["records"]:
            if set(rec["greedy"]) & set(eog):
                continue
            ours, cut = greedy_to_near_tie(model, rec["prompt_ids"], len(rec["greedy"]))
            theirs = llamacpp_greedy(s.url, rec["prompt_ids"], len(rec["greedy"]))
            assert theirs[:cut] == ours[:cut], cut
            compared += 1
    assert compared >= 4


SCALED = [
    (fam, i) for fam in FAMILIES for i in range(len(golden(f"family_{fam}.json")["scalings"]))
]


@pytest.mark.parametrize(("family", "i"), SCALED)
def test_rope_scaling_matches_transformers(family: str, i: int, tmp_path: Path) -> None:
    """The family's weights under YaRN (qwen2), linear and llama3 (mistral) RoPE scaling."""
    case = golden(f"family_{family}.json")["scalings"][i]
    d = tmp_path / family
    shutil.copytree(source(family, "hf"), d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **case["config"]}))
    ir = load_model(d)
    if "rope_parameters" in case["config"]:
        assert ir.hparams.rope_scaling.type == case["config"]["rope_parameters"]["rope_type"]
    model, plain = lm(ir), lm(load(family, "hf"))
    moved = 0.0
    for rec in case["records"]:
        err, toks = check_record(model, rec)
        assert err < LOGPROB_TOL, (rec["prompt_ids"], err)
        assert toks == rec["greedy"], rec["prompt_ids"]
        moved = max(moved, check_record(plain, rec)[0])
    assert moved > 10 * LOGPROB_TOL  # the scaling changes the answer: it is tested


def test_every_family_keeps_the_contract() -> None:
    """What the readers, the runtime, LoRA and the server ask of each registered family."""
    from modelc.formats.gguf import SUPPORTED_ARCHS
    from modelc.runtime.arch.registry import FAMILIES as REGISTRY
    from modelc.server.state import EMBED_ARCHS, TEXT_ARCHS

    for name, f in REGISTRY.items():
        assert f.name == name and callable(f.model)
        if f.kind == "tensor":
            continue
        assert f.gguf_arch is not None and f.gguf_names and f.from_config and f.from_gguf
        assert f.hf_classes and f.model_types and f.required
        assert set(f.gguf_names) <= set(SUPPORTED_ARCHS)
        assert name in (TEXT_ARCHS if f.kind == "text" else EMBED_ARCHS)
        assert set(f.lora_slots) <= {"attn_qkv", "attn_q", "attn_k", "attn_v", "attn_output"} | {
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        }
    assert {"qwen2", "qwen3"} <= set(TEXT_ARCHS)


def test_the_readers_do_not_import_the_runtime(tmp_path: Path) -> None:
    """Reading a model of every family (GGUF and HF directory) imports no module of
    ``modelc.runtime``: the families' metadata lives in ``modelc.families``."""
    import subprocess
    import sys

    paths = [str(p) for fam in FAMILIES for p in ensure_family(fam)]
    code = (
        "import sys\n"
        "from modelc.formats import load_model\n"
        "for p in sys.argv[1:]:\n"
        "    load_model(p)\n"
        "print(sorted(m for m in sys.modules if m.startswith('modelc.runtime')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *paths], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize(
    ("family", "kind"),
    [("qwen2", "gguf"), ("qwen3", "hf"), ("mistral", "gguf"), ("gemma3", "gguf")],
)
def test_lora_merges_in_the_family_layout(family: str, kind: str, tmp_path: Path) -> None:
    """A PEFT adapter (HF module names, shared by llama, qwen and gemma) patches Q: as B@A
    on the NeoX families (their Q rows are HF's), permuted to interleaved pairs on Mistral."""
    from safetensors.numpy import save_file

    from modelc.formats.arch import llama_permute
    from modelc.runtime.arch import Decoder
    from modelc.runtime.lora import apply_adapter, load_adapter, remove_adapter

    model = build(load(family, kind), make_backend("numpy"))
    assert isinstance(model, Decoder)
    rng = np.random.default_rng(1)
    r, rows = 4, model.n_head * model.head_dim
    pre = "base_model.model.model.layers.1.self_attn.q_proj"
    a = (0.05 * rng.standard_normal((r, model.d))).astype(np.float32)
    b = (0.05 * rng.standard_normal((rows, r))).astype(np.float32)
    save_file(
        {pre + ".lora_A.weight": a, pre + ".lora_B.weight": b},
        str(tmp_path / "adapter_model.safetensors"),
    )
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": 8, "target_modules": ["q_proj"]}
    (tmp_path / "adapter_config.json").write_text(json.dumps(cfg))
    before = np.array(model.blocks[1].wq.data)
    applied = apply_adapter(model, load_adapter(tmp_path))
    delta = b if family != "mistral" else llama_permute(b, model.n_head)
    np.testing.assert_allclose(model.blocks[1].wq.data, before + 2.0 * (delta @ a), atol=1e-6)
    remove_adapter(model, applied)
    np.testing.assert_array_equal(model.blocks[1].wq.data, before)
