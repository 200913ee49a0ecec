"""What a compiled forward pass fixes: a model's constants, read from its runtime model.

:func:`model_spec` builds the runtime model of an artifact (the same class ``modelc
run`` builds) and returns the numbers the generated Cython inlines: dimensions, head
counts, layers, per-layer weight types (the kernels' type codes) and which matrix
products share one kernel call.  An architecture or feature the generator has no
template for is refused here, with what to do instead.
"""

from __future__ import annotations

from typing import Any

from modelc.errors import UnsupportedError
from modelc.formats.ir import DType, ModelIR
from modelc.runtime.arch import FAMILIES
from modelc.runtime.arch.bert import Bert
from modelc.runtime.arch.decoder import Decoder, refuse_unsupported
from modelc.runtime.arch.decoder_spec import GQA_FEATURES
from modelc.runtime.arch.gpt2 import GPT2
from modelc.runtime.arch.mlp import MLP
from modelc.runtime.backend import Weight
from modelc.runtime.backends.cpu import TYPE_CODES, CpuBackend

Spec = dict[str, Any]


def _refuse(what: str) -> UnsupportedError:
    return UnsupportedError(f"modelc compile: {what}; serve this model with `modelc run` instead")


def _code(be: CpuBackend, w: Weight, name: str) -> int:
    if w.dtype not in TYPE_CODES or be.kernel_for(w.dtype) != "c":
        raise _refuse(f"{name} is {w.dtype.value}, which has no compiled kernel")
    return int(TYPE_CODES[w.dtype])


def _fused(ws: tuple[Weight, ...]) -> bool:
    """Whether CpuBackend.matmul_many runs ``ws`` as one matmul_multi call."""
    return len(ws) <= 16 and all(
        w.dtype is ws[0].dtype and w.shape[1] == ws[0].shape[1] for w in ws
    )


# what the generated decoder loop runs of the description (a feature added to it is refused
# until the loop runs it); a mixture's expert FFN is the runtime's moe_ffn, called between two
# stretches of the compiled loop
COMPILE_RUNS = GQA_FEATURES | {"qkv_bias+qk_norm", "moe"}


def _decoder(m: Decoder, be: CpuBackend) -> Spec:
    sp = m.spec
    refuse_unsupported(sp, "modelc compile", COMPILE_RUNS, "serve this model with `modelc run`")
    if len(set(sp.qkv_bias)) > 1 or len(set(sp.qk_norm)) > 1:
        raise _refuse("layers that differ in Q/K/V biases or Q/K norms are not compiled")
    types, fuse_qkv, fuse_gu, ffs = [], [], [], []
    for i, b in enumerate(m.blocks):
        if b.w_gate is None or b.w_up is None or b.w_down is None:  # experts: moe_ffn
            attn = (b.wq, b.wk, b.wv, b.wo)
            ffs.append(0)
            types.append([_code(be, w, f"blk.{i} weights") for w in attn] + [-1, -1, -1])
            fuse_qkv.append(_fused(attn[:3]))
            fuse_gu.append(False)
            continue
        ws = (b.wq, b.wk, b.wv, b.wo, b.w_gate, b.w_up, b.w_down)
        ffs.append(b.w_gate.shape[0])
        types.append([_code(be, w, f"blk.{i} weights") for w in ws])
        fuse_qkv.append(_fused(ws[:3]))
        fuse_gu.append(_fused(ws[4:6]))
    plain = {f: getattr(sp, f) for f in sp.__dataclass_fields__}
    return {
        "decoder": {k: list(v) if isinstance(v, tuple) else v for k, v in plain.items()},
        **plain,
        "windows": list(sp.windows),
        "local_rope": list(sp.local_rope),
        "ff": ffs,
        "types": types,
        "fuse_qkv": fuse_qkv,
        "fuse_gu": fuse_gu,
        "bias": sp.qkv_bias[0],
        "qk_norm": sp.qk_norm[0],
    }


def _gpt2(m: GPT2, be: CpuBackend) -> Spec:
    types = []
    for i, b in enumerate(m.blocks):
        types.append([_code(be, w, f"blk.{i} weights") for w in (b.w_qkv, b.wo, b.w_up, b.w_down)])
    return {
        "n_layer": len(m.blocks),
        "d": m.d,
        "n_head": m.n_head,
        "head_dim": m.head_dim,
        "n_vocab": m.n_vocab,
        "n_pos": len(m.pos_embd),
        "eps": float(m.eps),
        "scale": float(m.scale),
        "ff": [b.w_up.shape[0] for b in m.blocks],
        "types": types,
    }


def _bert(m: Bert, be: CpuBackend) -> Spec:
    types, fuse_qkv = [], []
    for i, b in enumerate(m.blocks):
        ws = (b.wq, b.wk, b.wv, b.wo, b.w_up, b.w_down)
        types.append([_code(be, w, f"blk.{i} weights") for w in ws])
        fuse_qkv.append(_fused(ws[:3]))
    return {
        "n_layer": len(m.blocks),
        "d": m.d,
        "n_head": m.n_head,
        "head_dim": m.head_dim,
        "n_vocab": m.n_vocab,
        "eps": float(m.eps),
        "ff": [b.w_up.shape[0] for b in m.blocks],
        "types": types,
        "fuse_qkv": fuse_qkv,
    }


def _mlp(m: MLP, be: CpuBackend) -> Spec:
    if m.graph is not None:
        raise _refuse("ONNX execution plans are not compiled (only linear chains)")
    act = m.hparams.activation or "relu"
    return {
        "n_layer": len(m.layers),
        "sizes": [m.n_in] + [w.shape[0] for w, _ in m.layers],
        "types": [_code(be, w, f"layers.{i}.weight") for i, (w, _) in enumerate(m.layers)],
        "bias": [b is not None for _, b in m.layers],
        "activation": act,
    }


# the runtime class each template specialises (exactly: a subclass overrides the forward)
_SPECS: dict[str, tuple[type, Any]] = {
    "decoder": (Decoder, _decoder),
    "gpt2": (GPT2, _gpt2),
    "bert": (Bert, _bert),
    "mlp": (MLP, _mlp),
}


def template_for(ir: ModelIR) -> str:
    """The template name (``decoder``, ``gpt2``, ``bert``, ``mlp``) for ``ir``'s family."""
    fam = FAMILIES.get(ir.architecture)
    for name, (cls, _) in _SPECS.items():
        if fam is not None and fam.model is cls:
            return name
    raise _refuse(
        f"the {ir.architecture} architecture has no compiled forward yet "
        f"(compiled: {', '.join(sorted(_SPECS))} and the families that run on their forward)"
    )


def model_spec(ir: ModelIR, model_id: str) -> Spec:
    """The constants of ``ir``'s compiled forward (see the module docstring)."""
    name = template_for(ir)
    cls, make = _SPECS[name]
    be = CpuBackend(threads=1)
    model = FAMILIES[ir.architecture].model(ir, be)
    assert type(model) is cls
    spec: Spec = {"model_id": model_id, "architecture": ir.architecture, "template": name}
    spec |= make(model, be)
    spec["weight_dtypes"] = sorted(
        {DType(t.dtype).value for t in ir.tensors.values() if len(t.shape) == 2}
    )
    return spec
