"""Architecture inference and the Hugging Face -> canonical (GGUF-style) tensor naming.

Every non-GGUF reader produces a flat ``{source_name: Tensor}`` dict and hands it to
:func:`build_model_ir`, which, asking the family registry
(:mod:`modelc.families.registry`; each family's module says the specifics),

1. infers the architecture from ``config.json`` when there is one, else from the
   tensor names and shapes (:func:`infer_architecture`);
2. renames tensors to GGUF names through ``gguf.TensorNameMap`` (:func:`canonical_name`);
3. drops buffers that are not weights (the family's ``drop``, a tied ``lm_head``);
4. wraps the loaders of tensors whose layout differs from GGUF's, lazily (the family's
   ``transform``: GPT-2 ``Conv1D`` transposes, LLaMA's Q/K RoPE permutation exactly like
   llama.cpp's ``convert_hf_to_gguf.py``).

Canonical MLP names are ``layers.{i}.weight`` / ``layers.{i}.bias`` for the i-th linear
layer in forward order, weights ``(out, in)``; ``hparams.layer_sizes`` is
``[in_0, out_0, out_1, ...]``.  A BERT pooler (``pooler.dense``) keeps as
``pooler.weight`` / ``pooler.bias`` (GGUF has no name for it).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from modelc.errors import ArchitectureError
from modelc.families.contract import llama_permute, renamed
from modelc.families.registry import FAMILIES
from modelc.formats.ir import HParams, ModelIR, SourceInfo, Tensor

__all__ = [
    "SUPPORTED",
    "build_model_ir",
    "canonical_name",
    "canonicalize",
    "check_canonical",
    "detect_architecture",
    "infer_architecture",
    "llama_permute",
    "mlp_names",
    "sibling_config",
]

SUPPORTED = tuple(FAMILIES)

Shapes = Mapping[str, Sequence[int]]
_BLOCK_ID = re.compile(r"\.(\d+)\.")


def _arch_error(names: Iterable[str], why: str) -> ArchitectureError:
    sample = sorted(names)[:8]
    return ArchitectureError(
        f"{why}; tensor names found include {sample}. Supported architectures: "
        f"{', '.join(SUPPORTED)} (Hugging Face GPT2, Llama/Mistral/SmolLM2, Qwen2/2.5, Qwen3, "
        "Gemma2, Gemma3, Phi-3, BertModel, or a chain of linear layers named '*.weight'/'*.bias')"
    )


def _from_config(config: Mapping[str, Any]) -> str | None:
    for cls in config.get("architectures") or []:
        for f in FAMILIES.values():
            if cls in f.hf_classes:
                return f.name
    mt = config.get("model_type")
    if mt is None:
        return None
    for f in FAMILIES.values():
        if mt in f.model_types:
            return f.name
    types = [t for f in FAMILIES.values() for t in f.model_types]
    raise ArchitectureError(
        f"config.json model_type {mt!r} is not supported; supported architectures: "
        f"{', '.join(SUPPORTED)} (model_type {', '.join(types)})"
    )


def detect_architecture(names: Sequence[str]) -> str | None:
    for f in FAMILIES.values():
        if f.signature is not None and any(f.signature.search(n) for n in names):
            return f.name
    return None


def infer_architecture(
    names: Iterable[str], config: Mapping[str, Any] | None = None, shapes: Shapes | None = None
) -> tuple[str, HParams]:
    """Name the architecture of a set of tensors and fill its hyper-parameters.

    ``config`` is a Hugging Face ``config.json`` dict when there is one; without it the
    hyper-parameters come from ``shapes`` (name -> shape) and a head size of 64 is assumed
    where shapes cannot tell (recorded by callers as a guess).
    """
    names = list(names)
    arch = _from_config(config) if config else None
    arch = arch or detect_architecture(names)
    shapes = shapes or {}
    if arch is None:
        if _mlp_layers(names, shapes) is not None:
            arch = "mlp"
        else:
            raise _arch_error(names, "cannot tell the model architecture from its tensor names")
    if arch == "mlp":
        layers = _mlp_layers(names, shapes)
        if layers is None:
            raise _arch_error(names, "tensors are not a chain of linear layers")
        sizes = [int(shapes[layers[0] + ".weight"][1])]
        sizes += [int(shapes[p + ".weight"][0]) for p in layers]
        return "mlp", HParams(n_layer=len(layers), layer_sizes=sizes, activation="relu")
    fam = FAMILIES[arch]
    try:
        if config and fam.from_config is not None:
            return arch, fam.from_config(dict(config))
        if fam.from_shapes is None:
            raise _arch_error(names, f"a {arch} model needs its config.json")
        return arch, fam.from_shapes(names, shapes)
    except (KeyError, IndexError, ZeroDivisionError) as e:
        raise _arch_error(
            names, f"looks like {arch} but a tensor or config field is missing ({e})"
        ) from e


# --- MLP ---------------------------------------------------------------------------------


def _natural_key(s: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _mlp_layers(names: Sequence[str], shapes: Shapes) -> list[str] | None:
    """Prefixes of the linear layers in forward order, or None if the tensors are no MLP chain."""
    if not names or not shapes:
        return None
    prefixes: list[str] = []
    for n in names:
        if n.endswith(".weight"):
            prefixes.append(n[: -len(".weight")])
        elif not n.endswith(".bias"):
            return None
    prefixes.sort(key=_natural_key)
    for n in names:
        if n.endswith(".bias") and n[: -len(".bias")] not in prefixes:
            return None
    if not prefixes:
        return None
    prev_out: int | None = None
    for p in prefixes:
        w = shapes.get(p + ".weight")
        if w is None or len(w) != 2:
            return None
        b = shapes.get(p + ".bias")
        if b is not None and tuple(b) != (w[0],):
            return None
        if prev_out is not None and w[1] != prev_out:
            return None
        prev_out = int(w[0])
    return prefixes


def mlp_names(names: Sequence[str], shapes: Shapes) -> dict[str, str]:
    """Source name -> canonical ``layers.{i}.weight|bias`` for an MLP chain."""
    layers = _mlp_layers(names, shapes)
    if layers is None:
        raise _arch_error(names, "tensors are not a chain of linear layers")
    out: dict[str, str] = {}
    for i, p in enumerate(layers):
        for suffix in (".weight", ".bias"):
            if p + suffix in shapes:
                out[p + suffix] = f"layers.{i}{suffix}"
    return out


# --- transformer names ---------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _name_map(arch: str, n_blocks: int) -> gguf.TensorNameMap:
    gguf_arch = FAMILIES[arch].gguf_arch
    assert gguf_arch is not None
    return gguf.get_tensor_name_map(gguf_arch, n_blocks)


def canonical_name(arch: str, hf_name: str) -> str | None:
    """GGUF name for a Hugging Face tensor name of ``arch``, or None if it is not a weight.

    MLP names depend on the whole chain: use :func:`mlp_names` for those.
    """
    fam = FAMILIES.get(arch)
    if fam is None or fam.gguf_arch is None:
        raise ValueError(f"canonical_name does not map {arch!r} names")
    if fam.drop is not None and fam.drop.search(hf_name):
        return None
    name = fam.rename(hf_name)
    if name in fam.own_names:
        return fam.own_names[name]
    ids = [int(m) for m in _BLOCK_ID.findall(name)]
    n_blocks = ((max(ids) + 1) // 64 + 1) * 64 if ids else 64
    mapped = _name_map(arch, n_blocks).get_name(name, try_suffixes=(".weight", ".bias"))
    return str(mapped) if mapped is not None else None


# one expert's matrix in a Hugging Face mixture of experts (Qwen3-MoE's mlp.experts.E.*_proj,
# Mixtral's block_sparse_moe.experts.E.w1 gate / w3 up / w2 down, LFM2-MoE's feed_forward)
_EXPERT = re.compile(
    r"(?:^|\.)layers\.(\d+)\.(?:mlp|block_sparse_moe|feed_forward)\.experts\.(\d+)\."
    r"(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$"
)
_EXPERT_KIND = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up"}


# transformers 5's fused experts (Qwen3.5-MoE): gate_up_proj (n_expert, 2*ff, d), the gate
# rows first, and down_proj (n_expert, d, ff); Qwen3-VL-MoE's files hold them transposed,
# (n_expert, d, 2*ff) and (n_expert, ff, d), as llama.cpp's converter permutes them
_FUSED = re.compile(r"(?:^|\.)layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")


def _fused_experts(raw: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], set[str]]:
    """Fused expert stacks split as llama.cpp's converter splits them (a pair whose
    gate_up_proj's last axis is down_proj's middle one: rows are outputs; or both
    transposed)."""
    found = {(m.group(1), m.group(2)): n for n in raw if (m := _FUSED.search(n))}
    out: dict[str, Tensor] = {}
    consumed: set[str] = set()
    for (i, kind), name in found.items():
        down = found.get((i, "down_proj"))
        if kind != "gate_up_proj" or down is None:
            continue
        gu, dn = raw[name], raw[down]
        if len(gu.shape) != 3 or len(dn.shape) != 3:
            continue
        flip = gu.shape[1] == dn.shape[2] and gu.shape[2] == 2 * dn.shape[1]  # transposed
        if not flip and (gu.shape[2] != dn.shape[1] or gu.shape[1] % 2):
            continue
        e, two_ff, d = (gu.shape[0], gu.shape[2], gu.shape[1]) if flip else gu.shape
        half = two_ff // 2
        for part, rows in (("gate", slice(0, half)), ("up", slice(half, None))):

            def load(t: Tensor = gu, rows: slice = rows, flip: bool = flip) -> np.ndarray[Any, Any]:
                x = t.data()
                return np.ascontiguousarray(
                    x[:, :, rows].transpose(0, 2, 1) if flip else x[:, rows]
                )

            new = f"blk.{i}.ffn_{part}_exps.weight"
            out[new] = Tensor(new, gu.dtype, (e, half, d), load)
        new = f"blk.{i}.ffn_down_exps.weight"
        if flip:

            def load_down(t: Tensor = dn) -> np.ndarray[Any, Any]:
                return np.ascontiguousarray(t.data().transpose(0, 2, 1))

            out[new] = Tensor(new, dn.dtype, (e, d, half), load_down)
        else:
            out[new] = renamed(dn, new)
        consumed |= {name, down}
    return out, consumed


def stack_experts(raw: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], set[str]]:
    """A Hugging Face mixture's per-expert matrices as llama.cpp stacks them,
    ``blk.{i}.ffn_{gate,up,down}_exps.weight`` (n_expert, rows, cols), loaded lazily (fused
    stacks split); and the source names they consumed."""
    groups: dict[str, dict[int, Tensor]] = {}
    fused, consumed = _fused_experts(raw)
    for name, t in raw.items():
        m = _EXPERT.search(name)
        if m is not None:
            kind = _EXPERT_KIND.get(m.group(3), "down")
            groups.setdefault(f"blk.{m.group(1)}.ffn_{kind}_exps.weight", {})[int(m.group(2))] = t
            consumed.add(name)
    out: dict[str, Tensor] = fused
    for new, by_id in groups.items():
        if sorted(by_id) != list(range(len(by_id))):
            raise ArchitectureError(f"{new}: the experts are not numbered 0..{len(by_id) - 1}")
        ts = [by_id[e] for e in range(len(by_id))]
        if any(t.dtype != ts[0].dtype or t.shape != ts[0].shape for t in ts):
            raise ArchitectureError(f"{new}: the experts differ in type or shape")

        def load(ts: list[Tensor] = ts) -> np.ndarray[Any, Any]:
            return np.stack([t.data() for t in ts])

        out[new] = Tensor(new, ts[0].dtype, (len(ts), *ts[0].shape), load)
    return out, consumed


def canonicalize(
    arch: str, hparams: HParams, raw: Mapping[str, Tensor]
) -> tuple[dict[str, Tensor], list[str]]:
    """Rename and lazily transform source tensors into canonical ones; also return the dropped names."""
    names = list(raw)
    if arch == "mlp":
        mapping = mlp_names(names, {n: t.shape for n, t in raw.items()})
        return {new: renamed(raw[old], new) for old, new in mapping.items()}, []
    fam = FAMILIES[arch]
    out, consumed = stack_experts(raw)
    if fam.regroup is not None:
        own, used = fam.regroup(raw, hparams)
        out.update(own)
        consumed |= used
    dropped: list[str] = []
    for src, t in raw.items():
        if src in consumed:
            continue
        new = canonical_name(arch, src)
        if new is None or new in out:
            dropped.append(src)
            continue
        if new == "output.weight" and hparams.tie_embeddings:
            dropped.append(src)  # tied to token_embd
            continue
        out[new] = fam.transform(src, new, t, hparams) if fam.transform else renamed(t, new)
    missing = [n for n in fam.required_tensors(hparams) if n not in out]
    if missing:
        raise _arch_error(names, f"{arch} model is missing tensors {missing[:6]}")
    _check_shapes(arch, hparams, out)
    return out, dropped


def _check_shapes(arch: str, hp: HParams, t: Mapping[str, Tensor]) -> None:
    """Hyper-parameters must agree with the tensors (a wrong config.json fails here, not mid-forward)."""
    emb = t["token_embd.weight"].shape
    if hp.n_vocab != emb[0]:
        hp.n_vocab = emb[0]  # padded or trimmed vocabularies: the tensor is the truth
    want: dict[str, tuple[int, ...]] = {"token_embd.weight": (emb[0], hp.n_embd)}
    shapes = FAMILIES[arch].shapes
    want.update(shapes(hp) if shapes else {})
    for name, shape in want.items():
        if name in t and tuple(t[name].shape) != shape:
            raise ArchitectureError(
                f"{arch} hyper-parameters (n_embd={hp.n_embd}, n_head={hp.n_head}, "
                f"n_head_kv={hp.n_head_kv}, head_dim={hp.head_dim}, n_ff={hp.n_ff}) expect {name} "
                f"of shape {list(shape)}, but it is {list(t[name].shape)}; check config.json"
            )


def check_canonical(
    arch: str, hparams: HParams, tensors: Mapping[str, Tensor], *, has_graph: bool = False
) -> None:
    """Check tensors that already carry canonical names (a ``modelc export``) against
    ``arch`` and ``hparams``: the required tensors are there, with the shapes expected."""
    if arch == "tokenizer" and not tensors:
        return
    if arch == "mlp":
        if has_graph:
            return  # an ONNX plan names its own initializers
        shapes = {n: t.shape for n, t in tensors.items()}
        if any(old != new for old, new in mlp_names(list(tensors), shapes).items()):
            raise _arch_error(tensors, "mlp tensors are not named layers.{i}.weight/bias")
        return
    fam = FAMILIES.get(arch)
    if fam is None or fam.gguf_arch is None:
        raise ArchitectureError(
            f"architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED)}"
        )
    missing = [n for n in fam.required_tensors(hparams) if n not in tensors]
    if missing:
        raise _arch_error(tensors, f"{arch} model is missing tensors {missing[:6]}")
    _check_shapes(arch, hparams, tensors)


def sibling_config(path: Path) -> dict[str, Any] | None:
    """The ``config.json`` next to a weights file, if it is a readable HF config (has model_type)."""
    cfg_path = path.parent / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return cfg if isinstance(cfg, dict) and isinstance(cfg.get("model_type"), str) else None


def build_model_ir(
    raw: Mapping[str, Tensor],
    config: Mapping[str, Any] | None,
    source: SourceInfo,
    *,
    metadata: Mapping[str, Any] | None = None,
) -> ModelIR:
    """Infer the architecture of ``raw`` source tensors and return the canonical :class:`ModelIR`."""
    shapes = {n: t.shape for n, t in raw.items()}
    arch, hparams = infer_architecture(list(raw), config, shapes)
    if FAMILIES[arch].kind == "text" and "output.weight" not in {
        canonical_name(arch, n) for n in raw
    }:
        hparams.tie_embeddings = True
    tensors, dropped = canonicalize(arch, hparams, raw)
    meta = dict(metadata or {})
    if dropped:
        meta["dropped_tensors"] = dropped
    if not config and arch != "mlp":
        meta["hparams_guessed"] = ["n_head", "n_head_kv", "head_dim", "n_ctx", "norm_eps"]
    if config:
        meta["hf_config"] = dict(config)
    return ModelIR(
        architecture=arch, hparams=hparams, tensors=tensors, source=source, metadata=meta
    )
