"""K-quants at pack time (issue 36, must-show 2), held to llama.cpp itself.

* blocks: modelc's compiled quantizer (cyx/mc_quantize.h) against ggml's own
  ``ggml_quantize_chunk`` in the ``xllamacpp`` wheel, called through ctypes, bit for bit,
  on random and real rows, with and without an importance matrix;
* types: ``artifact.mixes`` against a GGUF that ``llama-quantize`` wrote (Gemma 3 270M
  Q4_K_M), tensor by tensor;
* imatrix files: llama-imatrix's GGUF layout and the legacy ``.dat``, read to the weights
  llama-quantize derives from them;
* a packed family model: q4_k_m from f32, its next-token log-probs close to the f32 model's.
"""

from __future__ import annotations

import ctypes
import itertools
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelc.artifact import PackOptions, load_artifact, open_artifact, write_artifact
from modelc.artifact.mixes import K_MIXES, MIXES, tensor_types
from modelc.artifact.transform import GGML_IDS, quantize
from modelc.errors import UsageError
from modelc.formats import load_model
from modelc.formats.imatrix import load_imatrix
from modelc.formats.ir import BLOCK_SIZES, DType

Array = np.ndarray[Any, Any]


def _ggml() -> Any:
    xl = pytest.importorskip("xllamacpp")
    lib = ctypes.CDLL(str(next(Path(xl.__file__).parent.glob("xllamacpp*.so"))))
    f = lib.ggml_quantize_chunk
    f.restype = ctypes.c_size_t
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                  ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]  # fmt: skip
    return f


def ggml_blocks(t: DType, x: Array, imatrix: Array | None) -> Array:
    """ggml_quantize_chunk(type, x, ...): what llama-quantize writes for these rows."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bs, ts = BLOCK_SIZES[t]
    out = np.zeros((x.shape[0], x.shape[1] // bs * ts), dtype=np.uint8)
    im = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
    n = _ggml()(GGML_IDS[t], x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1],
                None if im is None else im.ctypes.data)  # fmt: skip
    assert n == out.nbytes
    return out


def random_rows(seed: int) -> list[Array]:
    rng = np.random.default_rng(seed)
    small = rng.standard_normal((4, 512)).astype(np.float32) * np.float32(0.02)
    big = rng.standard_normal((4, 512)).astype(np.float32) * np.float32(100)
    odd = rng.standard_normal((4, 512)).astype(np.float32)
    odd[0, :64] = 0  # all-zero groups and blocks
    odd[1] = np.abs(odd[1])  # no negative weight: the min is 0
    odd[2, ::7] *= 50  # outliers
    odd[3] = 0
    return [small, big, odd]


def real_rows() -> Array:
    """Rows of a trained model: Gemma 3 270M's ffn_down (2048 wide), dequantized."""
    from tests.assets import gemma3_gguf

    ir = load_model(gemma3_gguf())
    t = ir.tensors["blk.3.ffn_down.weight"]
    from modelc.artifact.transform import to_f32

    return np.ascontiguousarray(to_f32(t.data()[:6], t.dtype, (6, t.shape[-1])))


@pytest.mark.parametrize("t", list(GGML_IDS), ids=lambda t: t.value)
@pytest.mark.parametrize("with_imatrix", [False, True], ids=["plain", "imatrix"])
def test_blocks_equal_ggml_on_random_rows(t: DType, with_imatrix: bool) -> None:
    rng = np.random.default_rng(7)
    for x in random_rows(1):
        im = rng.random(x.shape[1]).astype(np.float32) * np.float32(3) if with_imatrix else None
        ours, theirs = quantize(x, t, im), ggml_blocks(t, x, im)
        assert ours.shape == theirs.shape
        assert np.array_equal(ours, theirs), np.count_nonzero(ours != theirs)


@pytest.mark.parametrize("t", [DType.Q8_0, DType.Q4_0, DType.Q4_1], ids=lambda t: t.value)
def test_compiled_quantizer_equals_its_numpy_twin(t: DType) -> None:
    """formats.quants' numpy quantizers (the reference the runtime's tests use) and the
    compiled one write the same blocks."""
    from modelc.formats.quants import quantize as numpy_quantize

    for x in random_rows(2):
        assert np.array_equal(quantize(x, t), numpy_quantize(x, t))


@pytest.mark.parametrize(
    "t",
    [DType.Q2_K, DType.Q3_K, DType.Q4_K, DType.Q5_K, DType.Q6_K, DType.Q5_0, DType.Q8_0,
     DType.IQ4_NL, DType.IQ4_XS],
    ids=lambda t: t.value,
)  # fmt: skip
def test_blocks_equal_ggml_on_real_rows(t: DType) -> None:
    x = real_rows()
    im = (x * x).mean(axis=0).astype(np.float32)  # activation-like weights
    for w in (None, im):
        assert np.array_equal(quantize(x, t, w), ggml_blocks(t, x, w))


def test_mix_types_equal_llama_quantize_q4_k_m() -> None:
    """The Gemma 3 270M Q4_K_M GGUF was written by llama-quantize: the same type for each of
    its tensors (Q6_K for ffn_down/attn_v of use_more_bits layers, the fallbacks of its
    640-wide rows to Q5_0/Q8_0, the tied embedding as the output, norms in F32)."""
    from tests.assets import gemma3_gguf

    ir = load_model(gemma3_gguf())
    plan = tensor_types(((t.name, t.shape) for t in ir.tensors.values()), "q4_k_m",
                        ir.architecture, ir.hparams)  # fmt: skip
    got = {name: plan.get(name, t.dtype) for name, t in ir.tensors.items()}
    want = {name: t.dtype for name, t in ir.tensors.items()}
    assert got == want
    assert {DType.Q4_K, DType.Q6_K, DType.Q5_0, DType.Q8_0} <= set(got.values())


def test_mix_rules_by_layer() -> None:
    """Rows of 256: no fallback; Q4_K_M's and Q5_K_M's use_more_bits layers, Q4_K_S's first
    ones, the untied output in Q6_K (llama_tensor_get_type)."""
    from modelc.formats.ir import HParams

    hp = HParams(n_layer=16, n_head=8, n_head_kv=8)
    shapes = [("token_embd.weight", (1000, 256)), ("output.weight", (1000, 256))]
    for i in range(16):
        shapes += [(f"blk.{i}.attn_v.weight", (256, 256)), (f"blk.{i}.ffn_down.weight", (256, 512)),
                   (f"blk.{i}.attn_norm.weight", (256,)), (f"blk.{i}.attn_q.weight", (256, 256))]  # fmt: skip
    more = {0, 1, 4, 7, 10, 13, 14, 15}  # i < 2, i >= 14, (i - 2) % 3 == 2
    m = tensor_types(shapes, "q4_k_m", "llama", hp)
    assert m["output.weight"] is DType.Q6_K and m["token_embd.weight"] is DType.Q4_K
    assert "blk.0.attn_norm.weight" not in m
    for i in range(16):
        want = DType.Q6_K if i in more else DType.Q4_K
        assert m[f"blk.{i}.attn_v.weight"] is want and m[f"blk.{i}.ffn_down.weight"] is want
        assert m[f"blk.{i}.attn_q.weight"] is DType.Q4_K
    s = tensor_types(shapes, "q4_k_s", "llama", hp)
    assert [s[f"blk.{i}.attn_v.weight"] for i in range(6)] == [DType.Q5_K] * 4 + [DType.Q4_K] * 2
    assert [s[f"blk.{i}.ffn_down.weight"] for i in range(3)] == [DType.Q5_K] * 2 + [DType.Q4_K]
    six = tensor_types(shapes, "q6_k", "llama", hp)
    assert set(six.values()) == {DType.Q6_K}


def test_low_bit_mix_rules() -> None:
    """Q2_K's attn_v in Q4_K under grouped-query attention of 4 or more heads a KV head (Q3_K
    otherwise); Q3_K_M's first two attn_v in Q5_K and its first n/16 ffn_down; IQ4_XS's first
    ffn_down in Q5_K without an imatrix only; attn_output by mix (llama_tensor_get_type)."""
    from modelc.formats.ir import HParams

    shapes = [("token_embd.weight", (1000, 256)), ("output.weight", (1000, 256))]
    for i in range(16):
        shapes += [(f"blk.{i}.attn_v.weight", (256, 256)), (f"blk.{i}.ffn_down.weight", (256, 512)),
                   (f"blk.{i}.attn_output.weight", (256, 256))]  # fmt: skip
    gqa8, mha = HParams(n_layer=16, n_head=32, n_head_kv=4), HParams(n_layer=16, n_head=8)
    assert tensor_types(shapes, "q2_k", "llama", gqa8)["blk.3.attn_v.weight"] is DType.Q4_K
    q2 = tensor_types(shapes, "q2_k", "llama", mha)
    assert q2["blk.3.attn_v.weight"] is q2["blk.3.ffn_down.weight"] is DType.Q3_K
    assert q2["blk.3.attn_output.weight"] is DType.Q3_K and q2["output.weight"] is DType.Q6_K
    m = tensor_types(shapes, "q3_k_m", "llama", mha)
    assert [m[f"blk.{i}.attn_v.weight"] for i in range(3)] == [DType.Q5_K] * 2 + [DType.Q4_K]
    assert [m[f"blk.{i}.ffn_down.weight"] for i in range(2)] == [DType.Q5_K, DType.Q4_K]
    assert m["blk.5.attn_output.weight"] is DType.Q4_K
    lg = tensor_types(shapes, "q3_k_l", "llama", mha)
    assert {lg[f"blk.9.{n}.weight"] for n in ("attn_v", "ffn_down", "attn_output")} == {DType.Q5_K}
    assert tensor_types(shapes, "iq4_xs", "llama", mha)["blk.1.ffn_down.weight"] is DType.Q5_K
    xs = tensor_types(shapes, "iq4_xs", "llama", mha, has_imatrix=True)
    assert xs["blk.1.ffn_down.weight"] is DType.IQ4_XS
    assert tensor_types(shapes, "q4_0", "llama", mha)["output.weight"] is DType.Q6_K
    assert tensor_types(shapes, "q8_0", "llama", mha)["output.weight"] is DType.Q8_0


def _write_imatrix_gguf(path: Path, entries: dict[str, tuple[Array, Array]]) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), arch="")
    w.add_string("general.type", "imatrix")
    for name, (sums, counts) in entries.items():
        w.add_tensor(f"{name}.in_sum2", sums.astype(np.float32))
        w.add_tensor(f"{name}.counts", counts.astype(np.float32).reshape(-1, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_imatrix_files_are_read_as_llama_quantize_does(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    sums = rng.random((2, 64)).astype(np.float32) * 40
    _write_imatrix_gguf(tmp_path / "i.gguf", {"blk.0.ffn_up.weight": (sums, np.array([7.0, 0.0]))})
    w = load_imatrix(tmp_path / "i.gguf")["blk.0.ffn_up.weight"]
    assert np.array_equal(w[0], sums[0] / np.float32(7)) and np.all(w[1] == 1)

    legacy = struct.pack("<i", 1) + struct.pack("<i", 5) + b"x.wei" + struct.pack("<ii", 4, 64)
    (tmp_path / "i.dat").write_bytes(legacy + sums[0].tobytes())
    assert np.array_equal(load_imatrix(tmp_path / "i.dat")["x.wei"][0], sums[0] / np.float32(4))


def _tiny(tmp_path: Path) -> Path:
    """A tiny f32 qwen3 (its GGUF; 64-wide rows, so Q4_K falls back to Q5_0 as in llama.cpp)."""
    from tests.gen_families import ensure_family

    return ensure_family("qwen3")[1]


def test_pack_q4_k_m_with_imatrix_writes_ggml_blocks(tmp_path: Path) -> None:
    """A packed tensor's bytes are ggml's blocks of the same f32 rows and imatrix weights."""
    src = _tiny(tmp_path)
    ir = load_model(src)
    name = "blk.0.ffn_down.weight"
    cols = ir.tensors[name].shape[-1]
    sums = np.random.default_rng(5).random((1, cols)).astype(np.float32)
    _write_imatrix_gguf(tmp_path / "im.gguf", {name: (sums, np.array([2.0]))})
    opts = PackOptions(quantize="q4_k_m", imatrix=str(tmp_path / "im.gguf"))
    m = write_artifact(ir, tmp_path / "q.modelc", opts)
    dtypes = {e.name: DType(e.dtype) for e in m.tensors}
    art = open_artifact(tmp_path / "q.modelc")
    try:
        got = np.array(art.load(art.entry(name)), dtype=np.uint8).reshape(-1)
    finally:
        art.close()
    x = np.asarray(ir.tensors[name].data(), dtype=np.float32).reshape(-1, cols)
    want = ggml_blocks(dtypes[name], x, sums[0] / np.float32(2)).reshape(-1)
    assert np.array_equal(got, want)
    with pytest.raises(UsageError, match="llama-quantize's mixes only"):
        PackOptions(quantize="int8", imatrix="x").check()


@pytest.mark.parametrize("mix", K_MIXES)
def test_packed_k_mix_stays_close_to_f32(mix: str, tmp_path: Path) -> None:
    """A tiny family model packed from f32 with each mix: its next-token log-probs stay
    close to the f32 model's, and the types are the mix's."""
    from modelc.runtime.arch import build
    from modelc.runtime.model import LanguageModel, SeqChunk
    from tests.runtime_support import log_softmax, make_backend

    src = _tiny(tmp_path)
    ir = load_model(src)
    m = write_artifact(ir, tmp_path / "q.modelc", PackOptions(quantize=mix))
    plan = tensor_types(((t.name, t.shape) for t in ir.tensors.values()), mix,
                        ir.architecture, ir.hparams)  # fmt: skip
    assert {e.name: e.dtype for e in m.tensors if e.name in plan} == {
        n: t.value for n, t in plan.items()
    }
    prompts = [list(range(3, 3 + n)) for n in (4, 11, 23, 37)]

    def logprobs(model_ir: Any) -> Array:
        model = build(model_ir, make_backend("cpu-exact"))
        assert isinstance(model, LanguageModel)
        rows = []
        for ids in prompts:
            cache = model.new_cache("f32", hot_window=16)
            rows.append(log_softmax(model.forward([SeqChunk(cache, ids)])[0]))
        return np.asarray(rows, dtype=np.float64)

    ref, got = logprobs(ir), logprobs(load_artifact(tmp_path / "q.modelc"))
    kl = float((np.exp(ref) * (ref - got)).sum(axis=-1).mean())
    assert 0 < kl < 0.05, kl


def wide_qwen3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny qwen3's f32 GGUF with 256-wide rows, so that the mixes write K-quant blocks."""
    from tests import gen_families

    wide = {**gen_families.CONFIGS["qwen3"], "hidden_size": 256, "intermediate_size": 512}
    monkeypatch.setitem(gen_families.CONFIGS, "qwen3", wide)
    path = tmp_path / "wide.gguf"
    gen_families.write_gguf("qwen3", gen_families.make_weights("qwen3"), path)
    return path


def test_packed_k_mixes_run_with_k_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Q2_K to Q6_K blocks in a running model (the existing kernels, exact and fast paths):
    the next-token distributions stay near the f32 model's, nearer with each step up in bits
    (random weights, the hardest case for few bits)."""
    ir = load_model(wide_qwen3(tmp_path, monkeypatch))
    ref = _logprobs(ir, "cpu-exact")
    kl: dict[str, float] = {}
    steps = ("q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_m", "q5_k_m", "q6_k")
    for mix in steps:
        m = write_artifact(ir, tmp_path / f"{mix}.modelc", PackOptions(quantize=mix))
        types = {e.name: e.dtype for e in m.tensors}
        if mix == "q4_k_m":
            assert types["blk.2.ffn_down.weight"] == "q6_k"  # use_more_bits(2, 3)
            assert types["blk.1.ffn_down.weight"] == types["blk.0.attn_q.weight"] == "q4_k"
            assert types["token_embd.weight"] == "q6_k"  # tied: as the output
        packed = load_artifact(tmp_path / f"{mix}.modelc")
        kl[mix] = _kl(ref, _logprobs(packed, "cpu-exact"))
        # the fast path adds its 8-bit activations' error to the weights'
        assert abs(_kl(ref, _logprobs(packed, "cpu")) - kl[mix]) < 0.2 * kl[mix] + 0.005, mix
    assert all(kl[a] > kl[b] for a, b in itertools.pairwise(steps)), kl
    assert kl["q6_k"] > 0 and kl["q4_k_m"] < 0.1 and kl["q2_k"] < 1.5, kl


def test_packed_legacy_and_iq4_mixes_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL and IQ4_XS packs run (exact and fast paths) near
    the f32 model; 5 bits nearer than 4, 8 nearest."""
    ir = load_model(wide_qwen3(tmp_path, monkeypatch))
    ref = _logprobs(ir, "cpu-exact")
    kl: dict[str, float] = {}
    for mix in ("q4_0", "q4_1", "iq4_nl", "iq4_xs", "q5_0", "q5_1", "q8_0"):
        m = write_artifact(ir, tmp_path / f"{mix}.modelc", PackOptions(quantize=mix))
        assert MIXES[mix].value in {e.dtype for e in m.tensors}
        packed = load_artifact(tmp_path / f"{mix}.modelc")
        kl[mix] = _kl(ref, _logprobs(packed, "cpu-exact"))
        # the fast path adds its 8-bit activations' error to the weights'
        assert abs(_kl(ref, _logprobs(packed, "cpu")) - kl[mix]) < 0.2 * kl[mix] + 0.005, mix
    four = max(kl[m] for m in ("q4_0", "q4_1", "iq4_nl", "iq4_xs"))
    assert kl["q8_0"] < min(kl["q5_0"], kl["q5_1"]) and max(kl["q5_0"], kl["q5_1"]) < four < 0.3


def _logprobs(model_ir: Any, backend: str) -> Array:
    """The tiny model's next-token log-probs after four prompts."""
    from modelc.runtime.arch import build
    from modelc.runtime.model import LanguageModel, SeqChunk
    from tests.runtime_support import log_softmax, make_backend

    model = build(model_ir, make_backend(backend))
    assert isinstance(model, LanguageModel)
    rows = []
    for ids in [list(range(3, 3 + n)) for n in (4, 11, 23, 37)]:
        cache = model.new_cache("f32", hot_window=16)
        rows.append(log_softmax(model.forward([SeqChunk(cache, ids)])[0]))
    return np.asarray(rows, dtype=np.float64)


def _kl(ref: Array, got: Array) -> float:
    return float((np.exp(ref) * (ref - got)).sum(axis=-1).mean())


def test_llamacpp_runs_the_packed_blocks_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp's server on a GGUF of the same blocks (the types llama-quantize's Q4_K_M
    gives, written by our quantizer) and modelc on its q4_k_m pack of the f32 GGUF: the same
    greedy continuations while the top two logits are 0.1 apart (llama.cpp multiplies
    K-quant weights by 8-bit activations, modelc's exact backend by f32 ones)."""
    pytest.importorskip("xllamacpp")
    import gguf

    from modelc.bench.llamacpp import LlamaCppServer
    from modelc.runtime.arch import build
    from modelc.runtime.model import LanguageModel
    from modelc.runtime.tokenizer import Tokenizer
    from tests import gen_families
    from tests.peers import greedy_to_near_tie, llamacpp_greedy
    from tests.runtime_support import make_backend

    src = wide_qwen3(tmp_path, monkeypatch)
    ir = load_model(src)
    write_artifact(ir, tmp_path / "q.modelc", PackOptions(quantize="q4_k_m"))
    art = open_artifact(tmp_path / "q.modelc")
    packed = {e.name: (DType(e.dtype), np.array(art.load(e))) for e in art.manifest.tensors}
    art.close()

    def add(w: gguf.GGUFWriter, name: str, data: Array, quant: Any) -> None:
        t, stored = packed[name]
        if t is DType.F32:
            w.add_tensor(name, data)
        else:  # our bytes, under llama.cpp's type of that name
            w.add_tensor(name, stored, raw_dtype=gguf.GGMLQuantizationType[t.name])

    monkeypatch.setattr(gen_families, "_add", add)
    ours_gguf = tmp_path / "ours-q4_k_m.gguf"
    gen_families.write_gguf("qwen3", gen_families.make_weights("qwen3"), ours_gguf)
    assert {t.name: t.dtype for t in load_model(ours_gguf).tensors.values()} == {
        n: t for n, (t, _) in packed.items()
    }
    model = build(load_artifact(tmp_path / "q.modelc"), make_backend("cpu-exact"))
    assert isinstance(model, LanguageModel)
    assert ir.tokenizer is not None
    eog = Tokenizer(ir.tokenizer).eot_ids  # llama.cpp's ignore_eos bans them
    rng = np.random.default_rng(11)
    prompts = [[int(i) for i in rng.integers(3, 300, n)] for n in (5, 9, 17, 30)]
    with LlamaCppServer(
        ours_gguf, threads=1, n_parallel=1, n_ctx=256, log=tmp_path / "lc.log"
    ) as s:
        compared = 0
        for ids in prompts:
            ours, cut = greedy_to_near_tie(model, ids, 12, eog, margin=0.1)
            theirs = llamacpp_greedy(s.url, ids, 12)
            assert theirs[:cut] == ours[:cut], (ids, cut)
            compared += cut
    assert compared >= 20, compared


def test_expert_tensors_take_each_experts_importance_weights(tmp_path: Path) -> None:
    """A 3-D expert tensor: each expert's rows are quantized with its own row of the imatrix
    (llama-quantize's imatrix_for_row), bit for bit as ggml."""
    from tests.gen_families import ensure_family

    ir = load_model(ensure_family("qwen3moe")[1])
    name = next(n for n, t in ir.tensors.items() if n.endswith("ffn_down_exps.weight"))
    n_exp, cols = ir.tensors[name].shape[0], ir.tensors[name].shape[-1]
    sums = np.random.default_rng(9).random((n_exp, cols)).astype(np.float32)
    _write_imatrix_gguf(tmp_path / "im.gguf", {name: (sums, np.full(n_exp, 3.0))})
    opts = PackOptions(quantize="q4_k_m", imatrix=str(tmp_path / "im.gguf"))
    m = write_artifact(ir, tmp_path / "q.modelc", opts)
    t = DType(next(e.dtype for e in m.tensors if e.name == name))
    art = open_artifact(tmp_path / "q.modelc")
    try:
        got = np.array(art.load(art.entry(name)), dtype=np.uint8).reshape(n_exp, -1)
    finally:
        art.close()
    x = np.asarray(ir.tensors[name].data(), dtype=np.float32).reshape(n_exp, -1, cols)
    for e in range(n_exp):
        want = ggml_blocks(t, x[e], sums[e] / np.float32(3))
        assert np.array_equal(got[e], want.reshape(-1)), e


def test_cli_pack_with_a_k_mix_and_an_imatrix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``modelc pack --quantize q4_k_m --imatrix FILE``: the mix's types, recorded in the
    manifest; --imatrix without a llama-quantize mix is refused."""
    import json

    from tests.cli_support import Cli

    cli = Cli(tmp_path / "home", tmp_path / "cache", tmp_path)
    src = wide_qwen3(tmp_path, monkeypatch)
    sums = np.random.default_rng(1).random((1, 256)).astype(np.float32)
    _write_imatrix_gguf(tmp_path / "im.gguf", {"blk.0.attn_q.weight": (sums, np.array([4.0]))})
    cli("pack", str(src), "-o", "w.modelc", "--quantize", "q4_k_m", "--imatrix", "im.gguf")
    info = json.loads(cli("inspect", "w.modelc", "--json").stdout)
    # attn_output's 128-wide rows fall back from Q4_K to Q5_0
    assert set(info["quantization"]["by_dtype"]) == {"q4_k", "q6_k", "q5_0", "f32"}
    assert info["pack"]["quantize"] == "q4_k_m"
    err = cli(
        "pack", str(src), "-o", "x.modelc", "--quantize", "int8", "--imatrix", "im.gguf", ok=False
    )
    assert err.returncode != 0 and "llama-quantize's mixes only" in err.stderr


@pytest.mark.parametrize("source", ["f16", "bf16"])
def test_f16_and_bf16_sources_are_widened_exactly(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From an f16 GGUF or a bf16 tensor: the blocks are ggml's of the widened f32 values, as
    llama-quantize converts them (ggml_fp16_to_fp32_row, ggml_bf16_to_fp32_row)."""
    import gguf

    from modelc.artifact.transform import to_f32
    from modelc.formats.ir import Tensor
    from tests import gen_families

    wide = {**gen_families.CONFIGS["qwen3"], "hidden_size": 256, "intermediate_size": 512}
    monkeypatch.setitem(gen_families.CONFIGS, "qwen3", wide)
    path = tmp_path / "f16.gguf"
    gen_families.write_gguf(
        "qwen3", gen_families.make_weights("qwen3"), path, gguf.GGMLQuantizationType.F16
    )
    ir = load_model(path)
    name = "blk.1.ffn_down.weight"
    t = ir.tensors[name]
    assert t.dtype is DType.F16
    if source == "bf16":  # the same values' top halves, as a bf16 tensor
        bits = (np.asarray(t.data(), np.float32).view(np.uint32) >> 16).astype(np.uint16)
        ir.tensors[name] = Tensor(name, DType.BF16, t.shape, lambda: bits)
    t = ir.tensors[name]
    m = write_artifact(ir, tmp_path / "q.modelc", PackOptions(quantize="q4_k_m"))
    target = DType(next(e.dtype for e in m.tensors if e.name == name))
    art = open_artifact(tmp_path / "q.modelc")
    try:
        got = np.array(art.load(art.entry(name)), dtype=np.uint8)
    finally:
        art.close()
    x = to_f32(np.asarray(t.data()), t.dtype, t.shape)
    assert np.array_equal(got, ggml_blocks(target, x, None))
