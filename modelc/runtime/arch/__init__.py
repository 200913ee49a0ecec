"""One module per architecture family, each exporting a :class:`~.family.Family` (``FAMILY``).

The registry (:mod:`.registry`) lists them; ``build(ir, backend)`` picks the runtime by
``ir.architecture``.  Language models (every decoder-only family through :class:`~.decoder.Decoder`, and gpt2) follow
:class:`~modelc.runtime.model.LanguageModel`, bert follows
:class:`~modelc.runtime.model.EmbeddingModel`, mlp :class:`~modelc.runtime.model.TensorModel`.
"""

from __future__ import annotations

from typing import Any

from modelc.errors import ArchitectureError
from modelc.families.registry import FAMILIES
from modelc.formats.ir import ModelIR
from modelc.runtime.arch.bert import Bert
from modelc.runtime.arch.decoder import Decoder
from modelc.runtime.arch.gpt2 import GPT2
from modelc.runtime.arch.mlp import MLP
from modelc.runtime.backend import Backend
from modelc.runtime.backends.factory import get_backend

ARCHITECTURES: dict[str, Any] = {name: f.model for name, f in FAMILIES.items()}

__all__ = ["ARCHITECTURES", "FAMILIES", "GPT2", "MLP", "Bert", "Decoder", "build"]


def build(ir: ModelIR, backend: Backend | None = None) -> Decoder | GPT2 | Bert | MLP:
    """The runtime model for ``ir``, computing through ``backend`` (default: the best built)."""
    fam = FAMILIES.get(ir.architecture)
    if fam is None:
        raise ArchitectureError(
            f"no runtime for architecture {ir.architecture!r} (supported: {', '.join(FAMILIES)})",
            path=ir.source.path,
        )
    model: Decoder | GPT2 | Bert | MLP = fam.model(ir, backend or get_backend())
    return model
