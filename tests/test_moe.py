"""Mixture-of-experts models (Qwen3-MoE; Mixtral reads the same way as ``llama``) held to
llama.cpp's server on the same GGUF.

The tiny random Qwen3-MoE of ``tests/gen_families`` (3 layers, 4 experts of which each token
takes 2, expert FFN 64, a router with unit-variance rows so the top-2 choice is decisive)
is written as llama.cpp's converter writes one: router ``ffn_gate_inp``, experts stacked in
``ffn_{gate,up,down}_exps``, the ``qwen3moe.expert_*`` keys.  No transformers golden (the
reference venv is not on this machine); llama.cpp's ``build_moe_ffn`` is the reference.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import trio
from gguf import GGMLQuantizationType

from modelc.engine import EngineOptions, build_engine
from modelc.engine.api import GenerationRequest, TokenEvent
from modelc.errors import ModelcError
from modelc.formats import load_model
from modelc.runtime.arch import build
from modelc.runtime.arch.decoder import Decoder
from modelc.runtime.arch.moe import moe_ffn
from modelc.runtime.model import LanguageModel, SeqChunk
from modelc.runtime.sampling import SamplingParams
from modelc.runtime.tokenizer import Tokenizer
from tests import gen_families as gf
from tests import net
from tests.assets import cache_lock
from tests.cli_support import Cli
from tests.gen_families import ensure_family
from tests.peers import greedy_to_near_tie, llamacpp_greedy
from tests.runtime_support import make_backend


def moe_gguf(quant: str = "f32", family: str = "qwen3moe") -> Path:
    """A tiny MoE GGUF in f32, or with its matrices in ``quant`` (experts too)."""
    path = ensure_family(family)[1]
    if quant == "f32":
        return path
    out = path.with_name(f"{family}-{quant}.gguf")
    with cache_lock(out.name):
        if not out.exists():
            q = GGMLQuantizationType[quant.upper()]
            gf.write_gguf(family, gf.make_weights(family), out, q)
    return out


def model(quant: str = "f32", mode: str = "cpu-exact", family: str = "qwen3moe") -> LanguageModel:
    lm = build(load_model(moe_gguf(quant, family)), make_backend(mode))
    assert isinstance(lm, LanguageModel)
    return lm


def test_the_experts_are_read() -> None:
    ir = load_model(moe_gguf())
    assert (ir.architecture, ir.hparams.n_expert, ir.hparams.n_expert_used) == ("qwen3moe", 4, 2)
    lm = model()
    assert isinstance(lm, Decoder)
    for b in lm.blocks:
        assert b.w_gate is None and b.experts is not None
        assert b.experts.router.shape == (4, 64) and b.experts.n_used == 2
        assert [w.shape for w in b.experts.down] == [(64, 64)] * 4
        assert b.q_norm is not None  # Qwen3's per-head Q/K norms


@pytest.mark.parametrize("family", ["qwen3moe", "mixtral"])
def test_llamacpp_runs_the_gguf_the_same(tmp_path: Path, family: str) -> None:
    """llama.cpp's server on the same file: the same prompt tokens and 16 greedy tokens
    after each of 8 prompts (up to a near tie, which llama.cpp's f16 KV cache may flip).
    Mixtral is a ``llama`` GGUF with stacked experts (interleaved RoPE, no Q/K norms)."""
    pytest.importorskip("xllamacpp")

    from modelc.bench.llamacpp import LlamaCppServer

    ir = load_model(moe_gguf(family=family))
    assert ir.tokenizer is not None
    tok = Tokenizer(ir.tokenizer)
    lm = model(family=family)
    rng = np.random.default_rng(5)
    text = "The quick brown fox jumps over the lazy dog"
    compared = 0
    with LlamaCppServer(
        moe_gguf(family=family), threads=1, n_parallel=1, n_ctx=256, log=tmp_path / "l.log"
    ) as s:
        theirs = net.post(f"{s.url}/tokenize", json={"content": text}, timeout=30)
        assert theirs.json()["tokens"] == tok.encode(text, add_special=True)
        for k in range(8):
            ids = tok.encode(text)[: 3 + k] + rng.integers(0, 256, 4 + 3 * k).tolist()
            ours, cut = greedy_to_near_tie(lm, ids, 16, sorted(tok.eot_ids))
            theirs_ids = llamacpp_greedy(s.url, ids, 16)
            assert theirs_ids[:cut] == ours[:cut], (k, cut, ours, theirs_ids)
            compared += cut
    assert compared >= 64, compared  # most tokens were picked by a clear margin


def test_quantized_experts_are_read_in_place() -> None:
    """The Q8_0 file (every expert quantized, read as row views of the stacked blocks)
    gives the f32 file's logits up to Q8_0's rounding, in exact mode and through the
    default C kernels (int8 activations); experts taken in the wrong order would not."""
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 256, 24).tolist()

    def logits(lm: LanguageModel) -> np.ndarray:
        return lm.forward([SeqChunk(lm.new_cache("f32"), ids, tuple(range(len(ids))))])

    ref = logits(model())
    q_exact, q_fast = model("q8_0"), model("q8_0", "cpu")
    for lm in (q_exact, q_fast):
        err = float(np.abs(logits(lm) - ref).max())
        assert err < 0.15, err
    assert isinstance(q_exact, Decoder)
    for b in q_exact.blocks:  # a layout slip: experts swapped
        assert b.experts is not None
        b.experts.gate.reverse()
    assert float(np.abs(logits(q_exact) - ref).max()) > 0.5


def test_each_token_takes_its_top_experts() -> None:
    """A row's FFN output equals the weighted sum over its two most probable experts, each
    computed alone; in a batch (experts one by one over their rows) it is bit for bit what
    the one-row path (a decode step: all chosen experts' gate and up in one call) gives."""
    lm = model()
    assert isinstance(lm, Decoder)
    e = lm.blocks[0].experts
    assert e is not None
    rng = np.random.default_rng(1)
    h = rng.standard_normal((6, 64)).astype(np.float32)
    got = moe_ffn(lm.be, e, h, np.empty_like(h))
    for r in range(6):
        logits = lm.be.matmul(e.router, h[r : r + 1])[0].astype(np.float64)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        top = np.argsort(-p)[:2]
        want = np.zeros(64)
        for ex in top:
            g = lm.be.matmul(e.gate[ex], h[r : r + 1])[0].astype(np.float64)
            u = lm.be.matmul(e.up[ex], h[r : r + 1])[0].astype(np.float64)
            a = (g / (1 + np.exp(-g)) * u).astype(np.float32)[None]
            want += p[ex] / p[top].sum() * lm.be.matmul(e.down[ex], a)[0]
        np.testing.assert_allclose(got[r], want, rtol=2e-5, atol=2e-6)
        alone = moe_ffn(lm.be, e, h[r : r + 1].copy(), np.empty((1, 64), np.float32))
        np.testing.assert_array_equal(got[r], alone[0])  # the one-row path sums alike


def test_engine_serves_the_greedy_continuation() -> None:
    """The engine (batching two requests, its f16 KV cache) gives each prompt the model's
    own greedy tokens for as long as they are picked by a clear margin."""
    eng = build_engine(moe_gguf(), EngineOptions(speculative=False, kv_cache="f32"))
    assert eng.tok is not None
    prompts = [eng.tok.encode("The quick brown fox"), eng.tok.encode("over the lazy dog")]
    lm = model()
    banned = sorted(eng.prompt.eog_ids)  # type: ignore[union-attr]
    want = [greedy_to_near_tie(lm, p, 12, banned) for p in prompts]
    got: dict[int, list[int]] = {}

    async def main() -> None:
        async with trio.open_nursery() as n:
            await n.start(eng.run)

            async def one(i: int) -> None:
                p = SamplingParams(temperature=0.0, max_tokens=12)
                req = GenerationRequest(f"r{i}", prompts[i], p, ignore_eos=True)
                got[i] = [ev.token_id async for ev in eng.submit(req) if isinstance(ev, TokenEvent)]

            async with trio.open_nursery() as m:
                for i in range(2):
                    m.start_soon(one, i)
            n.cancel_scope.cancel()

    trio.run(main)
    for i, (toks, cut) in enumerate(want):
        assert got[i][:cut] == toks[:cut] and cut >= 4, (i, cut)


@pytest.mark.parametrize("family", ["qwen3moe", "mixtral"])
def test_an_hf_directory_reads_as_its_gguf(family: str) -> None:
    """The HF directory's per-expert tensors, stacked as llama.cpp's converter stacks them
    (and Mixtral's Q/K rows permuted), give the GGUF's logits."""
    hf, gg = ensure_family(family)
    ids = np.random.default_rng(3).integers(0, 256, 20).tolist()
    out = []
    for path in (hf, gg):
        ir = load_model(path)
        assert (ir.hparams.n_expert, ir.hparams.n_expert_used) == (4, 2)
        lm = build(ir, make_backend("cpu-exact"))
        assert isinstance(lm, LanguageModel)
        out.append(lm.forward([SeqChunk(lm.new_cache("f32"), ids, tuple(range(len(ids))))]))
    np.testing.assert_allclose(out[0], out[1], rtol=0, atol=1e-5)


def test_an_unsupported_moe_config_is_refused_in_one_line(tmp_path: Path) -> None:
    """A Qwen3-MoE config without renormalised top-k weights (the released models have
    them) is refused, not run with the wrong weights."""
    src = ensure_family("qwen3moe")[0]
    d = tmp_path / "hf"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "norm_topk_prob": False}))
    with pytest.raises(ModelcError, match="norm_topk_prob"):
        load_model(d)
    cli = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    cli.fails("pack", str(d), match="Qwen3-MoE config is not supported")


def test_pack_run_and_compile(tmp_path: Path) -> None:
    """The GGUF packs and generates through the CLI; ``modelc compile`` writes its project,
    the spec marking every layer a mixture (its logits are held bit for bit to the runtime's
    in ``tests/test_compile.py``)."""
    cli = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    cli("pack", str(moe_gguf()), "--name", "tiny-moe")
    assert "4 experts, 2 a token" in cli("inspect", "tiny-moe").stdout
    out = cli(
        "generate", "tiny-moe", "The quick brown fox", "--max-tokens", "8", "--temperature", "0"
    )
    assert out.stdout.strip()
    cli("compile", "tiny-moe", "-o", str(tmp_path / "out"), "--name", "moe")
    spec = json.loads((tmp_path / "out" / "moe_app" / "spec.json").read_text())
    assert (
        spec["template"] == "decoder"
        and spec["decoder"]["moe"] == [True] * spec["decoder"]["n_layer"]
    )


def test_cuda_takes_a_mixture_from_its_description() -> None:
    """A mixture's description is one the GPU runs (its parity is ``tests/test_cuda.py``'s
    qwen3moe and mixtral, on a GPU): the host model is accepted without GPU work; with no
    GPU here ``--device auto`` keeps it on the CPU."""
    from modelc.runtime.backends.cuda_family import CUDA_RUNS, cuda_host

    host = cuda_host(load_model(moe_gguf(family="mixtral")))  # a llama GGUF with experts
    assert "moe" in host.spec.features() <= CUDA_RUNS
    eng = build_engine(moe_gguf(), EngineOptions(device="auto", speculative=False))
    assert isinstance(eng.lm, Decoder)
