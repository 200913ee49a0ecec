"""LoRA: PEFT adapters merged into the runtime weights, checked against PEFT's merged model,
and removed again bit for bit.

Fixtures: ``tests/fixtures/lora/`` (``scripts/make_lora_fixtures.py``) on the tiny HF models
of ``tests/fixtures/formats/``; the quantized case uses the real SmolLM2 Q4_1 GGUF.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from modelc.errors import FormatError, ModelcError, UnsupportedError, UsageError
from modelc.formats import load_model
from modelc.formats.arch import llama_permute
from modelc.formats.ir import DType
from modelc.formats.quants import dequantize
from modelc.runtime.arch import GPT2, Decoder, build
from modelc.runtime.backend import Backend, Weight
from modelc.runtime.backends.numpy_ref import NumpyBackend
from modelc.runtime.lora import AppliedLora, apply_adapter, load_adapter, remove_adapter
from modelc.runtime.model import SeqChunk
from tests.assets import minilm_dir, smollm2_gguf

FIX = Path(__file__).parent / "fixtures"
LORA = FIX / "lora"
ADAPTERS = {"llama": "llama-st", "llama-rslora": "llama-st", "gpt2": "gpt2-st"}
LOGIT_TOL = 1e-4  # abs, f32 runtime vs PEFT's merged torch model


def _backend(name: str) -> Backend:
    if name == "numpy":
        return NumpyBackend(cache_dequantized=False)
    try:
        from modelc.runtime.backends.cpu import CpuBackend
    except ImportError as e:
        pytest.skip(f"compiled kernels not built ({e})")
    return CpuBackend(matmul="exact")


def _model(base: str, backend: str = "numpy") -> Decoder | GPT2:
    m = build(load_model(FIX / "formats" / base), _backend(backend))
    assert isinstance(m, (Decoder, GPT2))
    return m


def _logits(model: Decoder | GPT2, tokens: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    ids = [int(t) for t in tokens]
    return model.forward([SeqChunk(model.new_cache(), ids, tuple(range(len(ids))))])


def _weights(model: Decoder | GPT2) -> dict[str, Weight]:
    """Every Weight the model holds, by attribute path."""
    out = {k: v for k, v in vars(model).items() if isinstance(v, Weight)}
    blocks: list[Any] = list(model.blocks)
    for i, b in enumerate(blocks):
        for f in dataclasses.fields(b):
            w = getattr(b, f.name)
            if isinstance(w, Weight):
                out[f"blocks.{i}.{f.name}"] = w
    return out


def _snapshot(model: Decoder | GPT2) -> dict[str, tuple[Weight, np.ndarray[Any, Any]]]:
    return {k: (w, w.data.copy()) for k, w in _weights(model).items()}


def _assert_restored(
    model: Decoder | GPT2, snap: dict[str, tuple[Weight, np.ndarray[Any, Any]]]
) -> None:
    now = _weights(model)
    assert now.keys() == snap.keys()
    for k, (w, copy) in snap.items():
        assert now[k] is w, f"{k} is not the original Weight object"
        assert now[k].data.dtype == copy.dtype and now[k].dtype == w.dtype
        assert np.array_equal(now[k].data, copy), f"{k} changed"


# --- numbers -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["numpy", "cpu-exact"])
@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_applied_logits_match_peft_merged(name: str, backend: str) -> None:
    golden = np.load(LORA / name / "golden.npz")
    model = _model(ADAPTERS[name], backend)
    adapter = load_adapter(LORA / name)
    applied = apply_adapter(model, adapter)
    n = len([k for k in golden.files if k.startswith("tokens_")])
    assert n >= 3
    for i in range(n):
        merged, base = golden[f"merged_{i}"], golden[f"base_{i}"]
        assert np.abs(merged - base).max() > 0.1  # the adapter really changes the model
        np.testing.assert_allclose(
            _logits(model, golden[f"tokens_{i}"]), merged, rtol=0, atol=LOGIT_TOL
        )
    remove_adapter(model, applied)
    for i in range(n):
        np.testing.assert_allclose(
            _logits(model, golden[f"tokens_{i}"]), golden[f"base_{i}"], rtol=0, atol=LOGIT_TOL
        )


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_apply_then_remove_restores_every_weight_bit_for_bit(name: str) -> None:
    model = _model(ADAPTERS[name])
    tokens = np.load(LORA / name / "golden.npz")["tokens_0"]
    before = _logits(model, tokens)
    snap = _snapshot(model)
    adapter = load_adapter(LORA / name)
    applied = apply_adapter(model, adapter)
    targets = {layer.target for layer in adapter.layers}
    assert set(applied.originals) == targets
    changed = {k for k, w in _weights(model).items() if w is not snap[k][0]}
    assert len(changed) == len(targets) > 0
    for k in changed:
        assert _weights(model)[k].dtype is DType.F32
    remove_adapter(model, applied)
    _assert_restored(model, snap)
    assert np.array_equal(_logits(model, tokens), before)


def test_targets_and_scales_from_config() -> None:
    llama = load_adapter(LORA / "llama")
    assert llama.arch == "llama" and len(llama.layers) == 2 * 5
    assert {layer.scale for layer in llama.layers} == {8 / 4}
    names = {layer.target for layer in llama.layers}
    assert {"blk.0.attn_q.weight", "blk.1.attn_k.weight", "blk.1.ffn_gate.weight"} <= names
    rs = {layer.module: layer for layer in load_adapter(LORA / "llama-rslora").layers}
    assert rs["model.layers.0.self_attn.q_proj"].scale == pytest.approx(6 / 2)  # alpha/sqrt(4)
    v1 = rs["model.layers.1.self_attn.v_proj"]  # rank_pattern 2, alpha_pattern 16
    assert v1.rank == 2 and v1.scale == pytest.approx(16 / np.sqrt(2))
    gpt2 = load_adapter(LORA / "gpt2")
    assert gpt2.arch == "gpt2"
    assert {layer.target for layer in gpt2.layers} == {
        f"blk.{i}.{n}.weight" for i in (0, 1) for n in ("attn_qkv", "attn_output", "ffn_down")
    }
    single = load_adapter(LORA / "gpt2" / "adapter_model.safetensors")
    assert [layer.target for layer in single.layers] == [layer.target for layer in gpt2.layers]


def test_stacked_adapters_remove_in_reverse_order() -> None:
    model = _model("llama-st")
    snap = _snapshot(model)
    first = apply_adapter(model, load_adapter(LORA / "llama"))
    mid = _snapshot(model)
    second = apply_adapter(model, load_adapter(LORA / "llama-rslora"))
    with pytest.raises(UsageError, match="reverse order"):
        remove_adapter(model, first)
    remove_adapter(model, second)
    _assert_restored(model, mid)
    remove_adapter(model, first)
    _assert_restored(model, snap)
    with pytest.raises(UsageError, match="already removed"):
        remove_adapter(model, first)


def test_quantized_base_smollm2_dequantized_merge_and_exact_restore(tmp_path: Path) -> None:
    """A synthetic adapter (HF names) on the real Q4_1 SmolLM2: q/k deltas are permuted like the
    GGUF's q/k rows, the merged weight is dequant(W) + scale*B@A in f32, and removal gives back
    the Q4_1 blocks themselves."""
    model = build(load_model(smollm2_gguf()), NumpyBackend(cache_dequantized=False))
    assert isinstance(model, Decoder)
    hp = model.hparams
    rng = np.random.default_rng(0)
    d, r = model.d, 8
    outs = {"q_proj": hp.n_head * model.head_dim, "k_proj": hp.n_head_kv * model.head_dim}
    outs["down_proj"] = d
    tensors = {}
    for layer in (0, 29):
        for mod, out in outs.items():
            path = "mlp" if mod == "down_proj" else "self_attn"
            fan_in = hp.n_ff if mod == "down_proj" else d
            pre = f"base_model.model.model.layers.{layer}.{path}.{mod}"
            tensors[pre + ".lora_A.weight"] = rng.standard_normal((r, fan_in), np.float32) * 0.05
            tensors[pre + ".lora_B.weight"] = rng.standard_normal((out, r), np.float32) * 0.05
    save_file(tensors, str(tmp_path / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": 16, "target_modules": list(outs)}
    (tmp_path / "adapter_config.json").write_text(json.dumps(cfg))

    snap = _snapshot(model)
    applied = apply_adapter(model, load_adapter(tmp_path))
    assert len(applied.installed) == 6
    b0 = model.blocks[0]
    orig_q = snap["blocks.0.wq"][0]
    assert orig_q.dtype is DType.Q4_1 and b0.wq.dtype is DType.F32
    a = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    want = dequantize(orig_q.data, orig_q.dtype, orig_q.shape) + 2.0 * (
        llama_permute(b, hp.n_head) @ a
    )
    np.testing.assert_allclose(b0.wq.data, want, rtol=0, atol=1e-6)
    unpermuted = dequantize(orig_q.data, orig_q.dtype, orig_q.shape) + 2.0 * (b @ a)
    assert np.abs(b0.wq.data - unpermuted).max() > 1e-3
    assert model.blocks[1].wq is snap["blocks.1.wq"][0]
    remove_adapter(model, applied)
    _assert_restored(model, snap)


# --- errors --------------------------------------------------------------------------------


def _copy(tmp_path: Path, name: str = "llama") -> Path:
    d = tmp_path / name
    shutil.copytree(LORA / name, d)
    return d


def _edit_config(d: Path, **changes: Any) -> None:
    cfg = json.loads((d / "adapter_config.json").read_text())
    cfg.update(changes)
    (d / "adapter_config.json").write_text(json.dumps(cfg))


def _edit_tensors(d: Path, edit: Any) -> None:
    t = load_file(str(d / "adapter_model.safetensors"))
    edit(t)
    save_file(t, str(d / "adapter_model.safetensors"))


Q0 = "base_model.model.model.layers.0.self_attn.q_proj"


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="no such LoRA adapter"):
        load_adapter(tmp_path / "nope")
    d = _copy(tmp_path)
    (d / "adapter_model.safetensors").rename(d / "adapter_model.bin")
    with pytest.raises(FormatError, match="safe_serialization=True"):
        load_adapter(d)
    d2 = _copy(tmp_path, "gpt2")
    (d2 / "adapter_config.json").unlink()
    with pytest.raises(FormatError, match=r"no adapter_config\.json beside"):
        load_adapter(d2 / "adapter_model.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\x00\x00")
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    with pytest.raises(FormatError):
        load_adapter(tmp_path / "junk.safetensors")


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"peft_type": "IA3"}, UnsupportedError, "PEFT type IA3"),
        ({"use_dora": True}, UnsupportedError, "DoRA"),
        ({"r": 0}, FormatError, "positive number 'r'"),
        ({"lora_alpha": "eight"}, FormatError, "positive number 'lora_alpha'"),
        ({"r": 8}, FormatError, r"gate_proj has rank 4 but the config says r=8"),
    ],
)
def test_bad_config(
    tmp_path: Path, changes: dict[str, Any], error: type[Exception], match: str
) -> None:
    d = _copy(tmp_path)
    _edit_config(d, **changes)
    with pytest.raises(error, match=match):
        load_adapter(d)


def test_bad_tensors(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    _edit_tensors(d, lambda t: t.pop(Q0 + ".lora_B.weight"))
    with pytest.raises(FormatError, match=r"layers\.0\.self_attn\.q_proj has no lora_B"):
        load_adapter(d)

    d = _copy(tmp_path / "2")
    _edit_tensors(d, lambda t: t.update({Q0 + ".lora_B.weight": np.zeros((32, 3), np.float32)}))
    with pytest.raises(FormatError, match=r"q_proj: lora_A is \[4, 32\] and lora_B \[32, 3\]"):
        load_adapter(d)

    d = _copy(tmp_path / "3")
    _edit_tensors(
        d,
        lambda t: t.update(
            {"base_model.model.lm_head.modules_to_save.weight": np.zeros((2, 2), np.float32)}
        ),
    )
    with pytest.raises(UnsupportedError, match="modules_to_save"):
        load_adapter(d)

    d = _copy(tmp_path / "4")
    _edit_tensors(
        d,
        lambda t: t.update(
            {
                "base_model.model.model.layers.0.foo.lora_A.weight": np.zeros((4, 32), np.float32),
                "base_model.model.model.layers.0.foo.lora_B.weight": np.zeros((32, 4), np.float32),
            }
        ),
    )
    with pytest.raises(FormatError, match=r"layers\.0\.foo'\] are not weights of a llama model"):
        load_adapter(d)


def test_adapter_for_another_model_is_refused_and_leaves_the_model_unchanged(
    tmp_path: Path,
) -> None:
    llama = _model("llama-st")
    gpt2 = _model("gpt2-st")
    with pytest.raises(UsageError, match="made for a gpt2 model; this model is llama"):
        apply_adapter(llama, load_adapter(LORA / "gpt2"))
    with pytest.raises(UsageError, match="made for a llama model; this model is gpt2"):
        apply_adapter(gpt2, load_adapter(LORA / "llama"))

    snap = _snapshot(llama)
    d = _copy(tmp_path)  # wider q_proj than the base model has
    _edit_tensors(d, lambda t: t.update({Q0 + ".lora_B.weight": np.ones((48, 4), np.float32)}))
    with pytest.raises(
        UsageError, match=r"model\.layers\.0\.self_attn\.q_proj: B @ A is \[48, 32\].*is \[32, 32\]"
    ):
        apply_adapter(llama, load_adapter(d))
    _assert_restored(llama, snap)  # nothing swapped in before the failure

    d = _copy(tmp_path / "deep")  # a layer the 2-layer model lacks
    pre = "base_model.model.model.layers.7.self_attn.v_proj"
    _edit_tensors(
        d,
        lambda t: t.update(
            {
                pre + ".lora_A.weight": np.ones((4, 32), np.float32),
                pre + ".lora_B.weight": np.ones((16, 4), np.float32),
            }
        ),
    )
    with pytest.raises(
        UsageError,
        match=r"layers\.7\.self_attn\.v_proj targets layer 7, but the model has 2 layers",
    ):
        apply_adapter(llama, load_adapter(d))
    _assert_restored(llama, snap)

    applied = apply_adapter(llama, load_adapter(LORA / "llama"))
    with pytest.raises(UsageError, match="different model"):
        remove_adapter(_model("llama-st"), applied)
    assert isinstance(applied, AppliedLora)
    remove_adapter(llama, applied)
    _assert_restored(llama, snap)


def test_errors_are_modelc_errors(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    (d / "adapter_config.json").write_text("{not json")
    with pytest.raises(ModelcError, match="cannot read the adapter config"):
        load_adapter(d)


def test_invalid_pattern_in_config(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    _edit_config(d, rank_pattern={"layers.(0": 4})
    with pytest.raises(FormatError, match=r"pattern 'layers\.\(0' is not a valid regex"):
        load_adapter(d)


def test_bert_adapter_loads_but_the_runtime_refuses_it(tmp_path: Path) -> None:
    pre = "base_model.model.encoder.layer.0.attention.self.query"
    save_file(
        {
            pre + ".lora_A.weight": np.ones((2, 384), np.float32),
            pre + ".lora_B.weight": np.ones((384, 2), np.float32),
        },
        str(tmp_path / "adapter_model.safetensors"),
    )
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 2}))
    adapter = load_adapter(tmp_path)
    assert adapter.arch == "bert" and adapter.layers[0].target == "blk.0.attn_q.weight"
    bert = build(load_model(minilm_dir()), NumpyBackend())
    with pytest.raises(
        UnsupportedError,
        match=r"supported for llama, gpt2, qwen2, (\w+, )*qwen3(, \w+)* models, not bert",
    ):
        apply_adapter(bert, adapter)  # type: ignore[arg-type]
