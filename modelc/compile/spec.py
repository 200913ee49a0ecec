"""What a compiled forward pass fixes: a model's constants, read from its runtime model.

:func:`model_spec` builds the runtime model of an artifact (the same class ``modelc
run`` builds) and returns the numbers the generated Cython inlines: dimensions, head
counts, layers, per-layer weight types (the kernels' type codes) and which matrix
products share one kernel call.  An architecture or feature the generator has no
template for is refused here, with what to do instead.  A decoder using a part of the
description the compiled loop does not run (outside :data:`COMPILE_RUNS`, or a weight type
without a compiled kernel) gets the ``runtime`` template: the program's forward is the
runtime's :class:`~modelc.runtime.arch.decoder.Decoder` itself (:func:`forward_note` says
so in one line), so every family the runtime runs compiles.
"""

from __future__ import annotations

from typing import Any

from modelc.errors import UnsupportedError
from modelc.formats.ir import DType, ModelIR
from modelc.runtime.arch import FAMILIES
from modelc.runtime.arch.bert import Bert
from modelc.runtime.arch.decoder import Decoder
from modelc.runtime.arch.decoder_spec import GQA_FEATURES, DecoderSpec, lacks
from modelc.runtime.arch.gpt2 import GPT2
from modelc.runtime.arch.mlp import MLP
from modelc.runtime.backend import Weight
from modelc.runtime.backends.cpu import TYPE_CODES, CpuBackend

Spec = dict[str, Any]


def _refuse(what: str) -> UnsupportedError:
    return UnsupportedError(f"modelc compile: {what}; serve this model with `modelc run` instead")


def _kernel(be: CpuBackend, w: Weight) -> int | None:
    """The kernels' type code of ``w``, None where no compiled kernel takes its type."""
    if w.dtype not in TYPE_CODES or be.kernel_for(w.dtype) != "c":
        return None
    return int(TYPE_CODES[w.dtype])


def _code(be: CpuBackend, w: Weight, name: str) -> int:
    code = _kernel(be, w)
    if code is None:
        raise _refuse(f"{name} is {w.dtype.value}, which has no compiled kernel")
    return code


def _plain(sp: DecoderSpec) -> dict[str, Any]:
    """A DecoderSpec as the JSON values spec.json holds (tuples as lists)."""
    return {
        f: list(v) if isinstance(v, tuple) else v
        for f, v in ((f, getattr(sp, f)) for f in sp.__dataclass_fields__)
    }


def _fused(ws: tuple[Weight, ...]) -> bool:
    """Whether CpuBackend.matmul_many runs ``ws`` as one matmul_multi call."""
    return len(ws) <= 16 and all(
        w.dtype is ws[0].dtype and w.shape[1] == ws[0].shape[1] for w in ws
    )


# what the generated decoder loop runs of the description (a feature added to it is refused
# until the loop runs it); a mixture's expert FFN is the runtime's moe_ffn, called between two
# stretches of the compiled loop
COMPILE_RUNS = GQA_FEATURES | {"qkv_bias+qk_norm", "moe"}


def _runtime_forward(m: Decoder, why: str) -> Spec:
    """The spec of a program whose forward is the runtime's decoder itself (the
    ``runtime`` template): what the compiled loop does not run is ``why``."""
    return {"template": "runtime", "why": why, "decoder": _plain(m.spec), "n_layer": m.spec.n_layer}


def _decoder(m: Decoder, be: CpuBackend) -> Spec:
    sp = m.spec
    if why := lacks(sp, COMPILE_RUNS):
        return _runtime_forward(m, why)
    if len(set(sp.qkv_bias)) > 1 or len(set(sp.qk_norm)) > 1:
        return _runtime_forward(m, "layers that differ in Q/K/V biases or Q/K norms")
    types, fuse_qkv, fuse_gu, ffs = [], [], [], []
    for b in m.blocks:
        ws = (b.wq, b.wk, b.wv, b.wo, b.w_gate, b.w_up, b.w_down)
        codes = [-1 if w is None else _kernel(be, w) for w in ws]
        if None in codes:
            bad = sorted({w.dtype.value for w in ws if w is not None and _kernel(be, w) is None})
            return _runtime_forward(m, f"{', '.join(bad)} weights (no compiled kernel)")
        types.append(codes)
        fuse_qkv.append(_fused(ws[:3]))
        if b.w_gate is None or b.w_up is None:  # experts: moe_ffn
            ffs.append(0)
            fuse_gu.append(False)
        else:
            ffs.append(b.w_gate.shape[0])
            fuse_gu.append(_fused((b.w_gate, b.w_up)))
    return {
        "decoder": _plain(sp),
        **{f: getattr(sp, f) for f in sp.__dataclass_fields__},
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


def forward_note(spec: Spec) -> str:
    """One line saying which forward the program runs (and why, for the runtime's)."""
    if spec["template"] == "runtime":
        return (
            f"forward: modelc's decoder, op for op as `modelc run` runs it (the compiled "
            f"loop does not run {spec['why']} yet)"
        )
    return f"forward: the {spec['template']} loop, compiled for this model's constants"
