"""Qwen3.5 (``qwen35``, ``qwen35moe``) and Qwen3-Next (``qwen3next``): Gated DeltaNet + gated attention (+ experts with a
shared one), against transformers, llama.cpp's converter and llama.cpp's server; the
per-sequence recurrent state through the engine.

The tiny random models are numpy-made by ``tests/gen_qwen35.py`` (HF directory and GGUF
in the test-asset cache); ``tests/golden/family_<family>.json`` (transformers f32) and
``tests/golden/<family>_converter.json`` (what llama.cpp's ``convert_hf_to_gguf.py``
writes for the same HF directory) come from ``scripts/make_tiny_qwen35.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from modelc.artifact import open_artifact
from modelc.errors import ModelcError
from modelc.formats import load_model
from modelc.formats.ir import ModelIR
from modelc.runtime.arch import build
from modelc.runtime.backend import Weight
from modelc.runtime.model import LanguageModel, SeqChunk
from modelc.runtime.prompt import PromptFormat
from modelc.runtime.tokenizer import Tokenizer
from tests import net
from tests.cli_support import Cli
from tests.gen_qwen35 import ensure_qwen35, ensure_qwen35_q8
from tests.gguf_support import manifest
from tests.peers import greedy_to_near_tie, llamacpp_greedy
from tests.recurrent_support import check_engine_equal_alone, check_prefix_hit, check_rollback
from tests.runtime_support import LOGPROB_TOL, check_record, golden, make_backend

SOURCES = ["hf", "gguf"]
FAMILIES = ["qwen35", "qwen35moe", "qwen3next"]
GOLDEN = "family_qwen35.json"
# the converter's provenance: the directory's name, its size label, its quantizer version
PROVENANCE = {"general.name", "general.size_label", "general.quantization_version"}


def source(kind: str, family: str = "qwen35") -> Path:
    hf, gguf = ensure_qwen35(family)
    return hf if kind == "hf" else gguf


def lm(ir: ModelIR, backend: str = "cpu-exact") -> LanguageModel:
    model = build(ir, make_backend(backend))
    assert isinstance(model, LanguageModel)
    return model


@pytest.fixture(scope="module")
def ir() -> ModelIR:
    return load_model(source("gguf"))


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("family", FAMILIES)
def test_matches_transformers(family: str, kind: str) -> None:
    ir = load_model(source(kind, family))
    assert ir.architecture == family
    assert ir.hparams.recurrent_layers == [0, 1, 2] and ir.hparams.rope_dim == 8
    if family != "qwen35":
        assert (ir.hparams.n_expert, ir.hparams.n_expert_used) == (8, 2)
    model = lm(ir)
    for rec in golden(f"family_{family}.json")["records"]:
        err, toks = check_record(model, rec)
        assert err < LOGPROB_TOL, (rec["prompt_ids"], err)
        assert toks == rec["greedy"], rec["prompt_ids"]


@pytest.mark.parametrize("part", ["decay", "gate", "partial_rope", "shared_expert", "grouped"])
def test_each_part_is_what_matches(part: str) -> None:
    """Without the recurrent state's decay, with every attention gate at sigmoid(0), with
    RoPE over the whole head, without the shared expert, or with Qwen3-Next's value heads
    read as tiled, the model no longer matches transformers: each part is exercised."""
    family = {"shared_expert": "qwen35moe", "grouped": "qwen3next"}.get(part, "qwen35")
    ir = load_model(source("gguf", family))
    if part == "partial_rope":
        ir.hparams.rope_dim = 0
    model = lm(ir)
    blocks = model.blocks  # type: ignore[attr-defined]
    if part == "decay":
        for b in blocks[:3]:
            b.mixer.a = np.zeros_like(b.mixer.a)  # exp(0 * ...) = 1: nothing forgotten
    if part == "gate":
        wq = blocks[3].wq
        data = np.array(wq.data).reshape(model.n_head, 2, -1)  # type: ignore[attr-defined]
        data[:, 1] = 0.0  # every gate's rows: sigmoid(0), the output halved
        blocks[3].wq = Weight(wq.dtype, wq.shape, data.reshape(wq.shape))
    if part == "shared_expert":
        for b in blocks:
            b.experts.shared = None
    if part == "grouped":
        for b in blocks[:3]:
            b.mixer.grouped = False
    recs = golden(f"family_{family}.json")["records"]
    assert max(check_record(model, r)[0] for r in recs) > 10 * LOGPROB_TOL


def gguf_file(variant: str) -> Path:
    """A family's GGUF, or ``qwen35_q8_0``: qwen35 as ``--outtype q8_0``."""
    return ensure_qwen35_q8() if variant == "qwen35_q8_0" else source("gguf", variant)


@pytest.mark.parametrize("variant", [*FAMILIES, "qwen35_q8_0"])
def test_the_gguf_is_the_converters(variant: str) -> None:
    """Our GGUF holds what llama.cpp's own convert_hf_to_gguf.py writes for the same HF
    directory: every metadata key and value and every tensor's bytes (its provenance keys
    apart), Q8_0 blocks included."""
    want = golden(f"{variant}_converter.json")
    ours = manifest(gguf_file(variant))
    mine = {k: v for k, v in ours["metadata"].items() if k not in PROVENANCE}
    theirs = {k: v for k, v in want["metadata"].items() if k not in PROVENANCE}
    assert json.loads(json.dumps(mine)) == theirs
    assert ours["tensors"] == want["tensors"]


def test_tokenizer_and_the_real_chat_template(tmp_path: Path) -> None:
    """The text and chat ids transformers gave, and llama.cpp's own Qwen3.5 chat template
    (the sdist's ``models/templates/Qwen3.5-4B.jinja``) rendering through modelc's template
    path with a tool call in the history."""
    g = golden(GOLDEN)
    for kind in SOURCES:
        ir = load_model(source(kind))
        assert ir.tokenizer is not None
        assert Tokenizer(ir.tokenizer).encode(g["text"], add_special=True) == g["text_ids"]
        fmt = PromptFormat.build(ir.tokenizer, ir.chat_template)
        assert fmt.chat([{"role": "user", "content": "What works?"}]).ids == g["chat_ids"]
    ir = load_model(source("gguf"))
    assert ir.tokenizer is not None
    template = (Path(__file__).parent / "fixtures" / "qwen35_chat.jinja").read_text()
    fmt = PromptFormat.build(ir.tokenizer, template)
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    text = fmt.chat(msgs).text
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n" in text


@pytest.mark.parametrize("family", ["qwen35"])  # the others' HF paths: above
def test_pack_and_inspect(family: str, tmp_path: Path) -> None:
    """``modelc pack`` makes the same tensors of the HF directory and of the GGUF;
    ``modelc inspect`` shows the family."""
    cli = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    for k in SOURCES:
        cli("pack", str(source(k, family)), "-o", str(tmp_path / f"{k}.modelc"))
    arts = [open_artifact(tmp_path / f"{k}.modelc") for k in SOURCES]
    try:
        irs = [a.to_ir() for a in arts]
        assert irs[0].architecture == irs[1].architecture == family
        assert irs[0].hparams.recurrent_layers == irs[1].hparams.recurrent_layers == [0, 1, 2]
        assert sorted(irs[0].tensors) == sorted(irs[1].tensors)
        for name, t in irs[0].tensors.items():
            u = irs[1].tensors[name]
            assert (t.dtype, t.shape) == (u.dtype, u.shape), name
            np.testing.assert_array_equal(t.data(), u.data(), err_msg=name)
    finally:
        for a in arts:
            a.close()
    out = cli("inspect", str(tmp_path / "gguf.modelc")).stdout
    assert f"architecture   {family}" in out
    for want in ("partial RoPE (8 of each head's 32 dimensions)", "Gated DeltaNet 3 of 4 layers"):
        assert want in out, out
    assert "fused QKV" not in out


def test_cuda_refuses_it_and_compile_runs_the_decoder(ir: ModelIR) -> None:
    from modelc.compile.spec import forward_note, model_spec
    from modelc.runtime.backends.cuda_family import cuda_host

    with pytest.raises(ModelcError) as e:
        cuda_host(ir)
    msg = str(e.value)
    assert "\n" not in msg and "Gated DeltaNet" in msg and "gated attention outputs" in msg
    assert "--device cuda does not run" in msg
    note = forward_note(model_spec(ir, "tiny"))
    assert "\n" not in note and "the compiled loop does not run" in note
    assert "Gated DeltaNet" in note


@pytest.mark.parametrize("family", FAMILIES)
def test_llamacpp_runs_the_gguf_the_same(family: str, tmp_path: Path) -> None:
    """llama.cpp's server on our GGUF: the same prompt ids and greedy continuations (up to
    a near tie).  Not on the Q8_0 file: this random model's logits move by ~0.05 under
    Q8_0 (modelc's cpu and cpu-exact backends already disagree that much), more than its
    top-2 margins, so llama.cpp's int8 activations flip its greedy tokens."""
    pytest.importorskip("xllamacpp")

    from modelc.bench.llamacpp import LlamaCppServer

    g = golden(f"family_{family}.json")
    ir = load_model(gguf_file(family))
    assert ir.tokenizer is not None
    tok = Tokenizer(ir.tokenizer)
    model = lm(ir)
    with LlamaCppServer(
        gguf_file(family), threads=1, n_parallel=1, n_ctx=256, log=tmp_path / "lc.log"
    ) as s:
        theirs = net.post(f"{s.url}/tokenize", json={"content": g["text"]}, timeout=30)
        assert theirs.json()["tokens"] == tok.encode(g["text"], add_special=True)
        compared = 0
        for rec in g["records"]:
            if set(rec["greedy"]) & set(tok.eot_ids):
                continue
            ours, cut = greedy_to_near_tie(model, rec["prompt_ids"], len(rec["greedy"]))
            got = llamacpp_greedy(s.url, rec["prompt_ids"], len(rec["greedy"]))
            assert got[:cut] == ours[:cut], cut
            compared += 1
    assert compared >= 3


# --- the recurrent state per sequence -----------------------------------------------------


def test_a_state_rolls_back_only_to_its_last_steps_checkpoints(ir: ModelIR) -> None:
    check_rollback(lm(ir))


@pytest.mark.parametrize("family", FAMILIES)
async def test_batched_cancelled_cached_and_speculative_equal_alone(family: str) -> None:
    await check_engine_equal_alone(load_model(source("gguf", family)))


def test_recurrent_layers_keep_no_context_of_keys(ir: ModelIR) -> None:
    """Only the attention layer's KV rows grow with the context; the recurrent layers'
    (never read) stay bounded, and the state is the same size at every length."""
    model = lm(ir)
    model.n_ctx = 2048  # room past the bound (the tiny config says 256)
    cache = model.new_cache()
    assert cache.state is not None
    size = cache.state.nbytes
    for i in range(6):  # 600 tokens, 100 a step
        model.forward([SeqChunk(cache, [(7 * i + j) % 384 for j in range(100)])])
    assert cache.rows(3) >= 600 and max(cache.rows(li) for li in range(3)) < 400
    assert cache.state.nbytes == size


def test_a_prefix_cache_hit_starts_from_the_kept_state(ir: ModelIR) -> None:
    check_prefix_hit(lm(ir))
