"""The one list of model families: adding a family adds its module here and nothing else.

Every reader (:mod:`modelc.formats.arch`, :mod:`modelc.formats.gguf`), the runtime
(:func:`modelc.runtime.arch.build`), LoRA and the server ask this registry; see
:class:`~modelc.families.contract.Family` for what a family provides.  It imports no
runtime: each family names its forward class, imported when a model is built.
"""

from __future__ import annotations

from modelc.errors import ArchitectureError
from modelc.families import (
    bert,
    deepseek2,
    gemma2,
    gemma3,
    gemma4,
    glm4moe,
    gpt2,
    gptoss,
    granitehybrid,
    lfm2,
    lfm2moe,
    llama,
    llama4,
    mistral3,
    mlp,
    nomic_bert,
    olmo2,
    phi3,
    qwen2,
    qwen2vl,
    qwen3,
    qwen3moe,
    qwen3next,
    qwen3vl,
    qwen3vlmoe,
    qwen35,
    qwen35moe,
    smollm3,
)
from modelc.families.contract import Family

# the first match wins where families share HF names (a LoRA adapter's modules)
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        llama.FAMILY,
        gpt2.FAMILY,
        bert.FAMILY,
        mlp.FAMILY,
        qwen2.FAMILY,
        qwen2vl.FAMILY,
        qwen3.FAMILY,
        qwen3moe.FAMILY,
        qwen3vl.FAMILY,
        qwen3vlmoe.FAMILY,
        deepseek2.FAMILY,
        glm4moe.FAMILY,
        qwen35.FAMILY,
        qwen35moe.FAMILY,
        qwen3next.FAMILY,
        gemma2.FAMILY,
        gemma3.FAMILY,
        gemma4.FAMILY,
        phi3.FAMILY,
        nomic_bert.FAMILY,
        smollm3.FAMILY,
        olmo2.FAMILY,
        mistral3.FAMILY,
        llama4.FAMILY,
        gptoss.FAMILY,
        lfm2.FAMILY,
        lfm2moe.FAMILY,
        granitehybrid.FAMILY,
    )
}


def family(name: str) -> Family:
    """The family called ``name`` (ArchitectureError if modelc has none)."""
    f = FAMILIES.get(name)
    if f is None:
        raise ArchitectureError(
            f"architecture {name!r} is not supported; supported: {', '.join(FAMILIES)}"
        )
    return f


def by_gguf_name(name: str) -> Family | None:
    """The family a GGUF ``general.architecture`` value names, if any."""
    return next((f for f in FAMILIES.values() if name in f.gguf_names), None)


def names(kind: str | None = None) -> tuple[str, ...]:
    """Family names, optionally only those of one kind (``text``, ``embed``, ``tensor``)."""
    return tuple(n for n, f in FAMILIES.items() if kind is None or f.kind == kind)
