"""Llama 4's chunked attention and its Hugging Face directory (issue 34), beside the tests
every small family gets in ``tests/test_smallfam.py``.

Chunks are held with a chunk of 8 (``scripts/make_tiny_llama4.py`` records transformers
with ``attention_chunk_size`` 8: the prompts and continuations span up to 7 chunks); the
release's 8192, which llama.cpp fixes, against llama.cpp's server over a prompt longer
than a chunk.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from modelc.errors import UnsupportedError
from modelc.formats import load_model
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import Decoder, build
from modelc.runtime.kv_cache import KVCache
from modelc.runtime.model import SeqChunk
from modelc.runtime.tokenizer import Tokenizer
from tests.gen_llama4 import ensure_model
from tests.peers import greedy_to_near_tie, llamacpp_greedy
from tests.runtime_support import LOGPROB_TOL, check_record, golden, make_backend

CHUNK = 8  # the goldens' attention_chunk_size


def decoder(ir: ModelIR, backend: str = "cpu-exact") -> Decoder:
    model = build(ir, make_backend(backend))
    assert isinstance(model, Decoder)
    return model


def chunked(kind: str, tmp_path: Path) -> ModelIR:
    """The tiny model with chunks of 8: the HF directory's config.json says so; the GGUF
    has no key for it (llama.cpp fixes 8192), so its hyper-parameter is set."""
    hf, gguf = ensure_model()
    if kind == "gguf":
        ir = load_model(gguf)
        ir.hparams.attn_chunk = CHUNK
        return ir
    d = tmp_path / "hf"
    shutil.copytree(hf, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "attention_chunk_size": CHUNK}))
    return load_model(d)


@pytest.mark.parametrize("kind", ["hf", "gguf"])
def test_chunked_attention_matches_transformers(kind: str, tmp_path: Path) -> None:
    case = golden("family_llama4.json")["scalings"][1]
    assert case["config"] == {"attention_chunk_size": CHUNK}
    ir = chunked(kind, tmp_path)
    model = decoder(ir)
    assert model.spec.chunks == (CHUNK, CHUNK, CHUNK, 0)  # the NoPE layer sees everything
    unchunked = decoder(load_model(ensure_model()[1]))
    moved = 0.0
    for rec in case["records"]:
        err, toks = check_record(model, rec)
        assert err < LOGPROB_TOL, (rec["prompt_ids"], err)
        assert toks == rec["greedy"], rec["prompt_ids"]
        moved = max(moved, check_record(unchunked, rec)[0])
    assert moved > 100 * LOGPROB_TOL


def test_a_bounded_cache_fed_in_pieces_equals_one_prefill(tmp_path: Path) -> None:
    """The chunked layers' cache keeps a window of one chunk (here 2 + 4 rows of slack):
    fed 5 tokens a step it drops rows and moves the rest, yet every step's logits are
    those of the whole sequence in one prefill with every row kept."""
    model = decoder(chunked("gguf", tmp_path))
    assert model.kv_windows == (CHUNK, CHUNK, CHUNK, 0)
    toks = np.random.default_rng(3).integers(3, model.n_vocab, 60).tolist()
    whole = model.new_cache("f32", full=True)
    want = model.forward([SeqChunk(whole, toks, tuple(range(len(toks))))])  # (60, vocab)
    cache = KVCache(model.kv_shape, 64, windows=model.kv_windows, window_slack=4, window_keep=2)
    for s in range(0, len(toks), 5):
        got = model.forward([SeqChunk(cache, toks[s : s + 5], tuple(range(5)))])
        np.testing.assert_allclose(got, want[s : s + 5], atol=2e-4)
    assert cache.rows(0) < 20 and cache.held_from(0) > 40  # rows were dropped
    assert cache.rows(3) == 64  # the NoPE layer keeps every position


def test_the_text_model_of_a_conditional_generation_checkpoint_loads(tmp_path: Path) -> None:
    """A Llama4ForConditionalGeneration as transformers 5 saves it (``text_config``, the
    text weights under ``language_model.``, a vision tower beside them) loads the same
    tensors and hyper-parameters as the Llama4ForCausalLM directory."""
    from safetensors.numpy import load_file, save_file

    hf = ensure_model()[0]
    d = tmp_path / "cond"
    shutil.copytree(hf, d)
    text = json.loads((hf / "config.json").read_text())
    cfg = {
        "architectures": ["Llama4ForConditionalGeneration"],
        "model_type": "llama4",
        "text_config": {**text, "architectures": ["Llama4ForCausalLM"]},
        "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 8},
    }
    (d / "config.json").write_text(json.dumps(cfg))
    ws = {f"language_model.{k}": v for k, v in load_file(hf / "model.safetensors").items()}
    ws["vision_model.model.layers.0.mlp.fc1.weight"] = np.ones((8, 8), np.float32)
    ws["multi_modal_projector.linear_1.weight"] = np.ones((64, 8), np.float32)
    save_file(ws, str(d / "model.safetensors"), metadata={"format": "pt"})
    got, want = load_model(d), load_model(hf)
    assert got.architecture == "llama4" and got.hparams == want.hparams
    assert sorted(got.tensors) == sorted(want.tensors)
    for name, t in got.tensors.items():
        np.testing.assert_array_equal(t.data(), want.tensors[name].data(), err_msg=name)


@pytest.mark.slow
def test_llamacpp_chunks_the_same(tmp_path: Path) -> None:
    """llama.cpp's server (its chunk fixed at 8192) on the GGUF, over a prompt of 8,250
    tokens: the last 58 attend within the second chunk on the RoPE layers.  The same greedy
    tokens (up to a near tie), and not those of attention over the whole prompt."""
    pytest.importorskip("xllamacpp")
    from modelc.bench.llamacpp import LlamaCppServer

    gguf = ensure_model()[1]
    ir = load_model(gguf)
    assert ir.hparams.attn_chunk == 8192 and ir.tokenizer is not None
    ir.hparams.n_ctx = 8320
    model = decoder(ir, "cpu")
    eot = Tokenizer(ir.tokenizer).eot_ids
    ids = np.random.default_rng(11).integers(3, 384, 8250).tolist()
    ours, cut = greedy_to_near_tie(model, ids, 8, banned=sorted(eot))
    assert cut >= 4, cut
    with LlamaCppServer(gguf, threads=2, n_parallel=1, n_ctx=8320, log=tmp_path / "lc.log") as s:
        theirs = llamacpp_greedy(s.url, ids, 8)
    assert theirs[:cut] == ours[:cut]
    ir.hparams.attn_chunk = 0
    whole, _ = greedy_to_near_tie(decoder(ir, "cpu"), ids, 8, banned=sorted(eot))
    assert whole != ours


@pytest.mark.parametrize(
    ("patch", "says"),
    [
        ({"interleave_moe_layer_step": 2}, "dense layers among the mixtures"),
        (
            {"layer_types": ["chunked_attention"] * 3 + ["sliding_attention"]},
            "chunked_attention layers are not its RoPE layers",
        ),
    ],
)
def test_what_it_does_not_run_is_refused_in_one_line(
    patch: dict[str, object], says: str, tmp_path: Path
) -> None:
    d = tmp_path / "hf"
    shutil.copytree(ensure_model()[0], d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **patch}))
    with pytest.raises(UnsupportedError, match=says) as e:
        load_model(d)
    assert "\n" not in str(e.value)


def test_full_attention_on_every_layer_has_no_chunks(tmp_path: Path) -> None:
    """``layer_types`` all ``full_attention`` (as transformers reads it, whatever the chunk
    size says): the answers of the unchunked model (the goldens' records: their prompts stay
    within the 8192 chunk)."""
    d = tmp_path / "hf"
    shutil.copytree(ensure_model()[0], d)
    cfg = json.loads((d / "config.json").read_text())
    patch = {"attention_chunk_size": CHUNK, "layer_types": ["full_attention"] * 4}
    (d / "config.json").write_text(json.dumps({**cfg, **patch}))
    model = decoder(load_model(d))
    assert model.spec.chunks == (0, 0, 0, 0)
    for rec in golden("family_llama4.json")["records"][:3]:
        err, toks = check_record(model, rec)
        assert err < LOGPROB_TOL and toks == rec["greedy"], rec["prompt_ids"]
