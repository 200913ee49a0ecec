"""LoRA adapters in the PEFT format: apply to a loaded model's weights, and remove exactly.

An adapter is a directory holding ``adapter_config.json`` and ``adapter_model.safetensors``
as PEFT's ``save_pretrained`` writes them.  Tensor names look like
``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``; for each target
module ``A`` is ``(r, in)`` and ``B`` is ``(out, r)``, and the merged weight is::

    W' = W + scale * B @ A        scale = alpha / r     (rsLoRA: alpha / sqrt(r))

with ``r`` and ``alpha`` per module from ``rank_pattern`` / ``alpha_pattern`` when those
name it.  Module names map to canonical (GGUF-style) weight names through
:func:`modelc.formats.arch.canonical_name`, and the delta is brought into the layout the
runtime holds: LLaMA ``q_proj``/``k_proj`` rows are permuted to the interleaved RoPE layout
exactly like the base weights (:func:`modelc.formats.arch.llama_permute`); GPT-2 ``Conv1D``
modules (PEFT ``fan_in_fan_out``) keep ``A``/``B`` in ``nn.Linear`` layout, so ``B @ A``
is already the ``(out, in)`` delta of the transposed weight the runtime holds.

:func:`apply_adapter` replaces each affected :class:`~modelc.runtime.backend.Weight` of the
model with a float32 one (quantized weights are dequantized first) and returns an
:class:`AppliedLora` that keeps the original ``Weight`` objects; :func:`remove_adapter`
puts those very objects back, so the base weights are restored bit for bit (same arrays,
same dtype).  Adapters stack; remove them in reverse order.

Thread safety: a forward step reads each weight attribute once, so apply/remove must run
between steps (the engine's loop does this), never concurrently with ``forward``.  All new
weights are computed before any is swapped in, so a failing apply leaves the model as it
was.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from modelc.errors import FormatError, UnsupportedError, UsageError
from modelc.formats.arch import canonical_name, llama_permute
from modelc.formats.ir import DType, HParams, ModelIR, Tensor
from modelc.formats.quants import dequantize
from modelc.formats.safetensors import read_safetensors
from modelc.runtime.arch.registry import FAMILIES
from modelc.runtime.backend import F32Array, Weight
from modelc.runtime.model import EmbeddingModel, LanguageModel

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"

_TOP_SLOTS = {"output.weight": "output"}  # lm_head; a tied head stays tied to nothing else
# the runtime block attributes an adapter may patch, and the families' PEFT module names,
# come from each family (modelc.runtime.arch.registry): Family.lora_slots, lora_modules

_LORA_NAME = re.compile(
    r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.(?P<adapter>[^.]+))?\.weight$"
)
_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")


@dataclass(frozen=True, slots=True)
class LoraLayer:
    """One target module's low-rank pair."""

    module: str  # PEFT module name, e.g. model.layers.0.self_attn.q_proj
    target: str  # canonical weight name, e.g. blk.0.attn_q.weight
    a: F32Array  # (r, in)
    b: F32Array  # (out, r)
    scale: float

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """A loaded adapter: the base architecture it was trained on and its layers."""

    path: str
    arch: str
    layers: tuple[LoraLayer, ...]
    base_model: str = ""  # adapter_config.json base_model_name_or_path, informational


@dataclass(slots=True)
class AppliedLora:
    """What :func:`apply_adapter` changed: the original and the installed weights by name."""

    adapter: LoraAdapter
    model_id: int
    originals: dict[str, Weight]
    installed: dict[str, Weight]
    removed: bool = field(default=False)


# --- loading ---------------------------------------------------------------------------


def _paths(path: str | Path) -> tuple[Path, Path]:
    p = Path(path)
    if p.is_dir():
        cfg, weights = p / CONFIG_NAME, p / WEIGHTS_NAME
        if not weights.is_file():
            hint = (
                " (found adapter_model.bin: re-save it with safe_serialization=True)"
                if (p / "adapter_model.bin").exists()
                else ""
            )
            raise FormatError(
                f"LoRA adapter directory has no {WEIGHTS_NAME}{hint}; expected a PEFT "
                "save_pretrained directory",
                path=p,
            )
    elif p.is_file():
        if p.suffix != ".safetensors":
            raise FormatError("a LoRA adapter is a PEFT directory or its .safetensors file", path=p)
        cfg, weights = p.parent / CONFIG_NAME, p
    else:
        raise FormatError("no such LoRA adapter file or directory", path=p)
    if not cfg.is_file():
        raise FormatError(
            f"LoRA adapter has no {CONFIG_NAME} beside its weights (r and lora_alpha are "
            "needed to scale it); keep the file PEFT wrote next to the .safetensors",
            path=weights,
        )
    return cfg, weights


def _read_config(path: Path) -> dict[str, Any]:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"cannot read the adapter config ({e})", path=path) from e
    if not isinstance(cfg, dict):
        raise FormatError("adapter config is not a JSON object", path=path)
    peft_type = str(cfg.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise UnsupportedError(f"PEFT type {peft_type} is not supported (only LORA)", path=path)
    if cfg.get("use_dora"):
        raise UnsupportedError("DoRA adapters (use_dora) are not supported", path=path)
    for key in ("r", "lora_alpha"):
        v = cfg.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise FormatError(
                f"adapter config needs a positive number {key!r}, got {v!r}", path=path
            )
    return cfg


def _pattern_value(patterns: Mapping[str, Any], module: str, default: float) -> float:
    """PEFT's ``get_pattern_key``: the first pattern matching a suffix of the module name."""
    for key, value in patterns.items():
        try:
            hit = re.match(rf"(.*\.)?({key})$", module)
        except re.error as e:
            raise FormatError(f"adapter config pattern {key!r} is not a valid regex ({e})") from e
        if hit:
            return float(value)
    return default


def _infer_arch(modules: list[str], path: Path) -> str:
    """The architecture whose Hugging Face module names the adapter uses.

    ``canonical_name`` alone cannot tell: gguf's name map accepts every family's aliases.
    """
    counts = {
        name: sum(bool(f.lora_modules.search(m)) for m in modules)
        for name, f in FAMILIES.items()
        if f.lora_modules is not None
    }
    arch = max(counts, key=lambda a: counts[a])  # the first of families sharing names
    if counts[arch] == 0:
        raise FormatError(
            f"LoRA modules {modules[:4]} are not weights of any supported architecture "
            f"({', '.join(_patchable())})",
            path=path,
        )
    bad = [m for m in modules if canonical_name(arch, m + ".weight") is None]
    if bad:
        raise FormatError(
            f"LoRA modules {bad[:4]} are not weights of a {arch} model like the adapter's other "
            "modules",
            path=path,
        )
    return arch


def _patchable() -> list[str]:
    """The families whose runtime weights an adapter can patch."""
    return [name for name, f in FAMILIES.items() if f.lora_slots]


def _matrix(t: Tensor, name: str, path: Path) -> F32Array:
    if len(t.shape) != 2:
        raise FormatError(f"{name}: expected a matrix, got shape {list(t.shape)}", path=path)
    if t.dtype not in (DType.F32, DType.F16, DType.BF16):
        raise FormatError(f"{name}: LoRA tensors must be F32/F16/BF16, got {t.dtype}", path=path)
    return np.ascontiguousarray(dequantize(t.data(), t.dtype, t.shape), dtype=np.float32)


def load_adapter(path: str | Path) -> LoraAdapter:
    """Read a PEFT LoRA adapter: a directory, or its ``.safetensors`` with the config beside it."""
    cfg_path, weights_path = _paths(path)
    cfg = _read_config(cfg_path)
    tensors, _ = read_safetensors(weights_path)
    pairs: dict[str, dict[str, Tensor]] = {}
    for name, t in tensors.items():
        m = _LORA_NAME.match(name)
        if m is None:
            if "lora_embedding_" in name:
                raise UnsupportedError(
                    f"{name}: LoRA on embedding layers is not supported", path=weights_path
                )
            if "lora_magnitude_vector" in name:
                raise UnsupportedError(
                    f"{name}: DoRA adapters are not supported", path=weights_path
                )
            raise UnsupportedError(
                f"{name}: not a lora_A/lora_B weight (modules_to_save and LoRA biases are "
                "not supported)",
                path=weights_path,
            )
        pairs.setdefault(m.group("module"), {})[m.group("ab")] = t
    if not pairs:
        raise FormatError("LoRA adapter holds no lora_A/lora_B tensors", path=weights_path)
    modules = sorted(pairs)
    arch = _infer_arch(modules, weights_path)
    r_cfg, alpha_cfg = float(cfg["r"]), float(cfg["lora_alpha"])
    rank_pattern = cfg.get("rank_pattern") or {}
    alpha_pattern = cfg.get("alpha_pattern") or {}
    layers = []
    for module in modules:
        ab = pairs[module]
        if set(ab) != {"A", "B"}:
            missing = "lora_B" if "A" in ab else "lora_A"
            raise FormatError(f"LoRA module {module} has no {missing} weight", path=weights_path)
        a = _matrix(ab["A"], module + ".lora_A.weight", weights_path)  # (r, in)
        b = _matrix(ab["B"], module + ".lora_B.weight", weights_path)  # (out, r)
        if a.shape[0] != b.shape[1]:
            raise FormatError(
                f"LoRA module {module}: lora_A is {list(a.shape)} and lora_B {list(b.shape)}; "
                "their rank r must agree (A (r, in), B (out, r))",
                path=weights_path,
            )
        r = _pattern_value(rank_pattern, module, r_cfg)
        if a.shape[0] != r:
            raise FormatError(
                f"LoRA module {module} has rank {a.shape[0]} but the config says r={r:g}",
                path=weights_path,
            )
        alpha = _pattern_value(alpha_pattern, module, alpha_cfg)
        scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
        target = canonical_name(arch, module + ".weight")
        assert target is not None  # _infer_arch checked every module
        layers.append(LoraLayer(module, target, a, b, scale))
    return LoraAdapter(
        path=str(weights_path.parent if Path(path).is_dir() else weights_path),
        arch=arch,
        layers=tuple(layers),
        base_model=str(cfg.get("base_model_name_or_path") or ""),
    )


# --- applying ----------------------------------------------------------------------------


def _slot(model: LanguageModel | EmbeddingModel, layer: LoraLayer) -> tuple[Any, str]:
    """The object and attribute that hold ``layer.target`` in ``model``."""
    arch = model.architecture
    if layer.target in _TOP_SLOTS:
        return model, _TOP_SLOTS[layer.target]
    m = _BLOCK_NAME.match(layer.target)
    attr = FAMILIES[arch].lora_slots.get(m.group(2)) if m else None
    blocks: list[Any] = getattr(model, "blocks", [])
    if m is None or attr is None:
        raise UsageError(
            f"LoRA module {layer.module} targets {layer.target}, which the {arch} runtime "
            "cannot patch"
        )
    i = int(m.group(1))
    if i >= len(blocks):
        raise UsageError(
            f"LoRA module {layer.module} targets layer {i}, but the model has "
            f"{len(blocks)} layers; the adapter was made for a different base model"
        )
    return blocks[i], attr


def _dense(w: Weight) -> F32Array:
    """The weight as a fresh float32 (out, in) array."""
    if w.dtype is DType.F32:
        return np.array(w.data, dtype=np.float32).reshape(w.shape)
    return np.ascontiguousarray(dequantize(w.data, w.dtype, w.shape), dtype=np.float32)


def _delta(arch: str, hp: HParams, layer: LoraLayer) -> F32Array:
    """``scale * B @ A`` (out, in) in the runtime's (and the IR's) layout for ``layer.target``."""
    b = layer.b  # (out, r)
    if FAMILIES[arch].lora_permute_qk and hp.rope_style != "neox":
        kind = _BLOCK_NAME.match(layer.target)
        if kind and kind.group(2) == "attn_q":
            b = llama_permute(b, hp.n_head)
        elif kind and kind.group(2) == "attn_k":
            b = llama_permute(b, hp.n_head_kv or hp.n_head)
    out: F32Array = (b @ layer.a) * np.float32(layer.scale)
    return out


def scale_adapter(adapter: LoraAdapter, factor: float) -> LoraAdapter:
    """The same adapter with every layer's scale multiplied by ``factor`` (a user strength)."""
    layers = tuple(dataclasses.replace(la, scale=la.scale * factor) for la in adapter.layers)
    return dataclasses.replace(adapter, layers=layers)


def _check_arch(arch: str, adapter: LoraAdapter) -> None:
    if arch not in _patchable():
        raise UnsupportedError(
            f"LoRA adapters are supported for {', '.join(_patchable())} models, not {arch}"
        )
    same_names = FAMILIES[adapter.arch].lora_modules is FAMILIES[arch].lora_modules
    if adapter.arch != arch and not same_names:
        raise UsageError(
            f"LoRA adapter {adapter.path} was made for a {adapter.arch} model; this model is {arch}"
        )


def _check_shape(layer: LoraLayer, shape: tuple[int, ...]) -> None:
    want = (int(layer.b.shape[0]), int(layer.a.shape[1]))
    if tuple(shape) != want:
        raise UsageError(
            f"LoRA module {layer.module}: B @ A is {list(want)} but the model's "
            f"{layer.target} is {list(shape)}; the adapter was made for a different "
            "base model"
        )


def merge_into_ir(ir: ModelIR, adapter: LoraAdapter) -> None:
    """Merge ``adapter`` into a model's tensors for good (Ollama's ``ADAPTER``): each target
    becomes a float32 tensor ``W + scale * B @ A`` (quantized ones dequantized first), in
    the layout the runtime holds, so that packing it gives what :func:`apply_adapter` does."""
    _check_arch(ir.architecture, adapter)
    merged: dict[str, Tensor] = {}
    for layer in adapter.layers:
        t = ir.tensors.get(layer.target)
        if t is None:
            raise UsageError(
                f"LoRA module {layer.module} targets {layer.target}, which the base model does "
                "not have; the adapter was made for a different base model"
            )
        _check_shape(layer, t.shape)
        if layer.target in merged:
            raise FormatError(f"two LoRA modules target {layer.target}", path=adapter.path)
        dense = _dense(Weight(t.dtype, (t.shape[0], t.shape[1]), t.data()))
        w = dense + _delta(ir.architecture, ir.hparams, layer)
        merged[layer.target] = Tensor(t.name, DType.F32, t.shape, _const(w))  # (out, in)
    ir.tensors.update(merged)


def _const(a: F32Array) -> Callable[[], F32Array]:
    return lambda: a


def apply_adapter(model: LanguageModel | EmbeddingModel, adapter: LoraAdapter) -> AppliedLora:
    """Merge ``adapter`` into ``model``'s weights; keep the originals for :func:`remove_adapter`."""
    arch = model.architecture
    _check_arch(arch, adapter)
    originals: dict[str, Weight] = {}
    installed: dict[str, Weight] = {}
    slots: dict[str, tuple[Any, str]] = {}
    for layer in adapter.layers:
        holder, attr = _slot(model, layer)
        w = getattr(holder, attr)
        if w is None:  # a mixture of experts has no dense FFN matrices
            raise UsageError(
                f"LoRA module {layer.module}: {layer.target} is a mixture of experts in this "
                "model; LoRA on experts is not supported"
            )
        assert isinstance(w, Weight), f"{attr} of {type(holder).__name__} is not a Weight"
        _check_shape(layer, w.shape)
        if layer.target in installed:
            raise FormatError(f"two LoRA modules target {layer.target}", path=adapter.path)
        merged = _dense(w)
        merged += _delta(arch, model.hparams, layer)
        originals[layer.target] = w
        installed[layer.target] = Weight(DType.F32, w.shape, merged)
        slots[layer.target] = (holder, attr)
    for name, (holder, attr) in slots.items():
        setattr(holder, attr, installed[name])
    return AppliedLora(adapter, id(model), originals, installed)


def remove_adapter(model: LanguageModel | EmbeddingModel, applied: AppliedLora) -> None:
    """Put back the exact ``Weight`` objects :func:`apply_adapter` replaced."""
    if applied.model_id != id(model):
        raise UsageError("this LoRA adapter was applied to a different model")
    if applied.removed:
        raise UsageError(f"LoRA adapter {applied.adapter.path} was already removed")
    slots = {layer.target: _slot(model, layer) for layer in applied.adapter.layers}
    for name, (holder, attr) in slots.items():
        if getattr(holder, attr) is not applied.installed[name]:
            raise UsageError(
                f"{name} changed since LoRA adapter {applied.adapter.path} was applied; "
                "remove stacked adapters in the reverse order of applying them"
            )
    for name, (holder, attr) in slots.items():
        setattr(holder, attr, applied.originals[name])
    applied.removed = True
