"""Architecture inference and the Hugging Face -> canonical (GGUF-style) tensor naming.

Every non-GGUF reader produces a flat ``{source_name: Tensor}`` dict and hands it to
:func:`build_model_ir`, which

1. infers the architecture (``gpt2``, ``llama``, ``bert``, ``mlp``) from ``config.json``
   when there is one, else from the tensor names and shapes (:func:`infer_architecture`);
2. renames tensors to GGUF names through ``gguf.TensorNameMap`` (:func:`canonical_name`);
3. drops buffers that are not weights (``position_ids``, GPT-2 causal-mask ``attn.bias``,
   rotary ``inv_freq``, a tied ``lm_head``);
4. wraps the loaders of tensors whose layout differs from GGUF's, lazily:
   GPT-2 ``Conv1D`` weights ``(in, out)`` -> ``(out, in)``, and LLaMA ``q_proj``/``k_proj``
   rows permuted to the interleaved-pairs RoPE layout exactly like llama.cpp's
   ``convert_hf_to_gguf.py`` (``LlamaModel.permute``).

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

from modelc.errors import ArchitectureError, UnsupportedError
from modelc.formats.ir import HParams, ModelIR, RopeScaling, SourceInfo, Tensor

SUPPORTED = ("gpt2", "llama", "bert", "mlp")

# config.json model_type -> modelc architecture
_MODEL_TYPES = {"gpt2": "gpt2", "llama": "llama", "mistral": "llama", "bert": "bert"}
_HF_CLASSES = {
    "GPT2LMHeadModel": "gpt2",
    "GPT2Model": "gpt2",
    "LlamaForCausalLM": "llama",
    "LlamaModel": "llama",
    "MistralForCausalLM": "llama",
    "BertModel": "bert",
    "BertForMaskedLM": "bert",
}
_GGUF_ARCH = {
    "gpt2": gguf.MODEL_ARCH.GPT2,
    "llama": gguf.MODEL_ARCH.LLAMA,
    "bert": gguf.MODEL_ARCH.BERT,
}

# name patterns that identify an architecture when there is no config.json
_SIGNATURES = {
    "gpt2": re.compile(r"(^|\.)h\.\d+\.attn\.c_attn\.weight$"),
    "llama": re.compile(r"(^|\.)layers\.\d+\.self_attn\.q_proj\.weight$"),
    "bert": re.compile(r"(^|\.)encoder\.layer\.\d+\.attention\.self\.query\.weight$"),
}
# buffers and heads that are not part of the inference weights
_DROP = {
    "gpt2": re.compile(r"\.attn\.(bias|masked_bias)$"),
    "llama": re.compile(r"rotary_emb\.inv_freq$"),
    "bert": re.compile(r"(^|\.)position_ids$|^cls\."),
}
_CONV1D = re.compile(r"\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")
_BLOCK_ID = re.compile(r"\.(\d+)\.")
_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}

Shapes = Mapping[str, Sequence[int]]


def _arch_error(names: Iterable[str], why: str) -> ArchitectureError:
    sample = sorted(names)[:8]
    return ArchitectureError(
        f"{why}; tensor names found include {sample}. Supported architectures: "
        f"{', '.join(SUPPORTED)} (Hugging Face GPT2, Llama/Mistral/SmolLM2, BertModel, "
        "or a chain of linear layers named '*.weight'/'*.bias')"
    )


def _from_config(config: Mapping[str, Any]) -> str | None:
    for cls in config.get("architectures") or []:
        if cls in _HF_CLASSES:
            return _HF_CLASSES[cls]
    mt = config.get("model_type")
    if mt is None:
        return None
    if mt not in _MODEL_TYPES:
        raise ArchitectureError(
            f"config.json model_type {mt!r} is not supported; supported architectures: "
            f"{', '.join(SUPPORTED)} (model_type gpt2, llama, mistral, bert)"
        )
    return _MODEL_TYPES[mt]


def detect_architecture(names: Sequence[str]) -> str | None:
    for arch, pat in _SIGNATURES.items():
        if any(pat.search(n) for n in names):
            return arch
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
    cfg = dict(config or {})
    fill = {"gpt2": _gpt2_hparams, "llama": _llama_hparams, "bert": _bert_hparams}[arch]
    try:
        return arch, fill(names, cfg, shapes)
    except (KeyError, IndexError, ZeroDivisionError) as e:
        raise _arch_error(
            names, f"looks like {arch} but a tensor or config field is missing ({e})"
        ) from e


def _n_blocks(names: Sequence[str], pattern: str) -> int:
    pat = re.compile(pattern)
    ids = {int(m.group(1)) for n in names if (m := pat.search(n))}
    return max(ids) + 1 if ids else 0


def _find(shapes: Shapes, suffix: str) -> Sequence[int]:
    for name, shape in shapes.items():
        if name.endswith(suffix):
            return shape
    raise KeyError(suffix)


def _guess_heads(n_embd: int) -> int:
    return max(1, n_embd // 64) if n_embd % 64 == 0 else 1


def _gpt2_hparams(names: Sequence[str], cfg: dict[str, Any], shapes: Shapes) -> HParams:
    if cfg:
        n_embd = int(cfg["n_embd"])
        n_head = int(cfg["n_head"])
        act = str(cfg.get("activation_function", "gelu_new"))
        return HParams(
            n_vocab=int(cfg["vocab_size"]),
            n_ctx=int(cfg.get("n_positions", cfg.get("n_ctx", 1024))),
            n_embd=n_embd,
            n_layer=int(cfg["n_layer"]),
            n_head=n_head,
            n_head_kv=n_head,
            n_ff=int(cfg.get("n_inner") or 4 * n_embd),
            head_dim=n_embd // n_head,
            norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)),
            activation=_activation(act),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        )
    n_vocab, n_embd = _find(shapes, "wte.weight")
    n_head = _guess_heads(int(n_embd))
    return HParams(
        n_vocab=int(n_vocab),
        n_ctx=int(_find(shapes, "wpe.weight")[0]),
        n_embd=int(n_embd),
        n_layer=_n_blocks(names, r"(?:^|\.)h\.(\d+)\."),
        n_head=n_head,
        n_head_kv=n_head,
        n_ff=int(_find(shapes, ".mlp.c_fc.weight")[1]),
        head_dim=int(n_embd) // n_head,
        activation="gelu_tanh",
        tie_embeddings=not any(n.endswith("lm_head.weight") for n in names),
    )


def _activation(name: str) -> str:
    if name not in _ACTIVATIONS:
        raise UnsupportedError(
            f"activation function {name!r} is not supported ({sorted(_ACTIVATIONS)})"
        )
    return _ACTIVATIONS[name]


def _rope_scaling(cfg: Mapping[str, Any]) -> tuple[float, RopeScaling]:
    params = cfg.get("rope_parameters") or {}
    theta = float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)
    rs = cfg.get("rope_scaling") or params
    kind = str(rs.get("rope_type") or rs.get("type") or "default")
    if kind in ("default", "none"):
        return theta, RopeScaling()
    if kind not in ("linear", "llama3", "yarn"):
        raise UnsupportedError(
            f"rope scaling type {kind!r} is not supported (linear, llama3, yarn)"
        )
    return theta, RopeScaling(
        type=kind,
        factor=float(rs.get("factor", 1.0)),
        original_max_position=int(rs.get("original_max_position_embeddings") or 0),
        low_freq_factor=float(rs.get("low_freq_factor", 1.0)),
        high_freq_factor=float(rs.get("high_freq_factor", 4.0)),
    )


def _llama_hparams(names: Sequence[str], cfg: dict[str, Any], shapes: Shapes) -> HParams:
    if cfg:
        n_embd = int(cfg["hidden_size"])
        n_head = int(cfg["num_attention_heads"])
        theta, scaling = _rope_scaling(cfg)
        return HParams(
            n_vocab=int(cfg["vocab_size"]),
            n_ctx=int(cfg.get("max_position_embeddings", 2048)),
            n_embd=n_embd,
            n_layer=int(cfg["num_hidden_layers"]),
            n_head=n_head,
            n_head_kv=int(cfg.get("num_key_value_heads") or n_head),
            n_ff=int(cfg["intermediate_size"]),
            head_dim=int(cfg.get("head_dim") or n_embd // n_head),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_style="interleaved",
            rope_scaling=scaling,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            activation=_activation(str(cfg.get("hidden_act", "silu"))),
        )
    n_vocab, n_embd = _find(shapes, "embed_tokens.weight")
    head_dim = 64 if int(n_embd) % 64 == 0 else int(n_embd)
    q_rows = int(_find(shapes, ".self_attn.q_proj.weight")[0])
    k_rows = int(_find(shapes, ".self_attn.k_proj.weight")[0])
    return HParams(
        n_vocab=int(n_vocab),
        n_ctx=2048,
        n_embd=int(n_embd),
        n_layer=_n_blocks(names, r"(?:^|\.)layers\.(\d+)\."),
        n_head=q_rows // head_dim,
        n_head_kv=k_rows // head_dim,
        n_ff=int(_find(shapes, ".mlp.gate_proj.weight")[0]),
        head_dim=head_dim,
        rope_style="interleaved",
        tie_embeddings=not any(n.endswith("lm_head.weight") for n in names),
        activation="silu",
    )


def _bert_hparams(names: Sequence[str], cfg: dict[str, Any], shapes: Shapes) -> HParams:
    if cfg:
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise UnsupportedError(
                f"BERT position_embedding_type {cfg['position_embedding_type']!r} is not supported (absolute)"
            )
        n_embd = int(cfg["hidden_size"])
        n_head = int(cfg["num_attention_heads"])
        return HParams(
            n_vocab=int(cfg["vocab_size"]),
            n_ctx=int(cfg.get("max_position_embeddings", 512)),
            n_embd=n_embd,
            n_layer=int(cfg["num_hidden_layers"]),
            n_head=n_head,
            n_head_kv=n_head,
            n_ff=int(cfg["intermediate_size"]),
            head_dim=n_embd // n_head,
            norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
            activation=_activation(str(cfg.get("hidden_act", "gelu"))),
            n_token_types=int(cfg.get("type_vocab_size", 2)),
            pooling="cls",
        )
    n_vocab, n_embd = _find(shapes, "embeddings.word_embeddings.weight")
    n_head = _guess_heads(int(n_embd))
    return HParams(
        n_vocab=int(n_vocab),
        n_ctx=int(_find(shapes, "embeddings.position_embeddings.weight")[0]),
        n_embd=int(n_embd),
        n_layer=_n_blocks(names, r"(?:^|\.)layer\.(\d+)\."),
        n_head=n_head,
        n_head_kv=n_head,
        n_ff=int(_find(shapes, ".intermediate.dense.weight")[0]),
        head_dim=int(n_embd) // n_head,
        norm_eps=1e-12,
        activation="gelu",
        n_token_types=int(_find(shapes, "embeddings.token_type_embeddings.weight")[0]),
        pooling="cls",
    )


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
    return gguf.get_tensor_name_map(_GGUF_ARCH[arch], n_blocks)


def canonical_name(arch: str, hf_name: str) -> str | None:
    """GGUF name for a Hugging Face tensor name of ``arch``, or None if it is not a weight.

    MLP names depend on the whole chain: use :func:`mlp_names` for those.
    """
    if arch not in _GGUF_ARCH:
        raise ValueError(f"canonical_name does not map {arch!r} names")
    if _DROP[arch].search(hf_name):
        return None
    name = hf_name
    if arch == "bert":
        name = name.removeprefix("bert.")
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
        name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
        if name.startswith("pooler.dense."):
            return "pooler." + name.rsplit(".", 1)[1]
    ids = [int(m) for m in _BLOCK_ID.findall(name)]
    n_blocks = ((max(ids) + 1) // 64 + 1) * 64 if ids else 64
    mapped = _name_map(arch, n_blocks).get_name(name, try_suffixes=(".weight", ".bias"))
    return str(mapped) if mapped is not None else None


# --- lazy transforms ---------------------------------------------------------------------


def llama_permute(w: np.ndarray[Any, Any], n_head: int) -> np.ndarray[Any, Any]:
    """HF (rotate-half) q/k rows -> GGUF interleaved pairs; ``LlamaModel.permute`` of convert_hf_to_gguf."""
    return np.ascontiguousarray(
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _transposed(t: Tensor, name: str) -> Tensor:
    def load() -> np.ndarray[Any, Any]:
        return np.ascontiguousarray(t.data().T)

    return Tensor(name, t.dtype, (t.shape[1], t.shape[0]), load)


def _permuted(t: Tensor, name: str, n_head: int) -> Tensor:
    def load() -> np.ndarray[Any, Any]:
        return llama_permute(t.data(), n_head)

    return Tensor(name, t.dtype, t.shape, load)


def _renamed(t: Tensor, name: str) -> Tensor:
    return Tensor(name, t.dtype, t.shape, t.loader)


def canonicalize(
    arch: str, hparams: HParams, raw: Mapping[str, Tensor]
) -> tuple[dict[str, Tensor], list[str]]:
    """Rename and lazily transform source tensors into canonical ones; also return the dropped names."""
    names = list(raw)
    if arch == "mlp":
        mapping = mlp_names(names, {n: t.shape for n, t in raw.items()})
        return {new: _renamed(raw[old], new) for old, new in mapping.items()}, []
    out: dict[str, Tensor] = {}
    dropped: list[str] = []
    for src, t in raw.items():
        new = canonical_name(arch, src)
        if new is None or new in out:
            dropped.append(src)
            continue
        if new == "output.weight" and hparams.tie_embeddings:
            dropped.append(src)  # tied to token_embd
            continue
        if arch == "gpt2" and _CONV1D.search(src) and len(t.shape) == 2:
            out[new] = _transposed(t, new)
        elif arch == "llama" and re.search(r"\.attn_q\.(weight|bias)$", new):
            out[new] = _permuted(t, new, hparams.n_head)
        elif arch == "llama" and re.search(r"\.attn_k\.(weight|bias)$", new):
            out[new] = _permuted(t, new, hparams.n_head_kv)
        else:
            out[new] = _renamed(t, new)
    missing = [n for n in _required(arch, hparams) if n not in out]
    if missing:
        raise _arch_error(names, f"{arch} model is missing tensors {missing[:6]}")
    _check_shapes(arch, hparams, out)
    return out, dropped


def _check_shapes(arch: str, hp: HParams, t: Mapping[str, Tensor]) -> None:
    """Hyper-parameters must agree with the tensors (a wrong config.json fails here, not mid-forward)."""
    emb = t["token_embd.weight"].shape
    if hp.n_vocab != emb[0]:
        hp.n_vocab = emb[0]  # padded or trimmed vocabularies: the tensor is the truth
    want = {"token_embd.weight": (emb[0], hp.n_embd)}
    if arch == "llama":
        want["blk.0.attn_q.weight"] = (hp.n_head * hp.head_dim, hp.n_embd)
        want["blk.0.attn_k.weight"] = (hp.n_head_kv * hp.head_dim, hp.n_embd)
        want["blk.0.ffn_gate.weight"] = (hp.n_ff, hp.n_embd)
    elif arch == "gpt2":
        want["blk.0.attn_qkv.weight"] = (3 * hp.n_embd, hp.n_embd)
        want["blk.0.ffn_up.weight"] = (hp.n_ff, hp.n_embd)
    else:
        want["blk.0.attn_q.weight"] = (hp.n_embd, hp.n_embd)
        want["blk.0.ffn_up.weight"] = (hp.n_ff, hp.n_embd)
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
    if arch not in _GGUF_ARCH:
        raise ArchitectureError(
            f"architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED)}"
        )
    missing = [n for n in _required(arch, hparams) if n not in tensors]
    if missing:
        raise _arch_error(tensors, f"{arch} model is missing tensors {missing[:6]}")
    _check_shapes(arch, hparams, tensors)


def _required(arch: str, hp: HParams) -> list[str]:
    req = ["token_embd.weight"]
    per_block = {
        "gpt2": ["attn_qkv.weight", "attn_output.weight", "ffn_up.weight", "ffn_down.weight"],
        "llama": [
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "attn_output.weight",
            "ffn_gate.weight",
        ],
        "bert": [
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "attn_output.weight",
            "ffn_up.weight",
        ],
    }[arch]
    req += [f"blk.{i}.{n}" for i in range(hp.n_layer) for n in per_block]
    if arch == "llama" and not hp.tie_embeddings:
        req.append("output.weight")
    return req


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
    if arch in ("gpt2", "llama") and "output.weight" not in {canonical_name(arch, n) for n in raw}:
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
