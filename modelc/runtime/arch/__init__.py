"""One module per architecture, each exporting a class built from ``(ModelIR, Backend)``.

``build(ir, backend)`` picks it by ``ir.architecture``.  Language models (llama, gpt2)
follow :class:`~modelc.runtime.model.LanguageModel`, bert follows
:class:`~modelc.runtime.model.EmbeddingModel`, mlp :class:`~modelc.runtime.model.TensorModel`.
"""

from __future__ import annotations

from modelc.errors import ArchitectureError
from modelc.formats.ir import ModelIR
from modelc.runtime.arch.bert import Bert
from modelc.runtime.arch.gpt2 import GPT2
from modelc.runtime.arch.llama import Llama
from modelc.runtime.arch.mlp import MLP
from modelc.runtime.backend import Backend, get_backend

ARCHITECTURES: dict[str, type[Llama] | type[GPT2] | type[Bert] | type[MLP]] = {
    "llama": Llama,
    "gpt2": GPT2,
    "bert": Bert,
    "mlp": MLP,
}

__all__ = ["ARCHITECTURES", "GPT2", "MLP", "Bert", "Llama", "build"]


def build(ir: ModelIR, backend: Backend | None = None) -> Llama | GPT2 | Bert | MLP:
    """The runtime model for ``ir``, computing through ``backend`` (default: the best built)."""
    cls = ARCHITECTURES.get(ir.architecture)
    if cls is None:
        raise ArchitectureError(
            f"no runtime for architecture {ir.architecture!r} "
            f"(supported: {', '.join(ARCHITECTURES)})",
            path=ir.source.path,
        )
    return cls(ir, backend or get_backend())
