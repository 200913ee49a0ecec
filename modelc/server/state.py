"""What the app knows about a served model, and the state every handler shares.

:func:`load_model_info` reads an artifact's manifest (sizes, context) without touching
the weights; the engine's prompt format is added once the model is loaded.  The models
themselves (loading, routing, unloading) are :mod:`modelc.server.models`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from modelc.artifact import Artifact, open_artifact
from modelc.artifact.format import TensorEntry
from modelc.artifact.inspect import by_dtype
from modelc.artifact.mixes import MIXES
from modelc.errors import TokenizerError
from modelc.runtime.arch.registry import names
from modelc.runtime.prompt import PromptFormat
from modelc.runtime.tokenizer import Tokenizer

if TYPE_CHECKING:
    from modelc.server.models import ModelRegistry

TEXT_ARCHS = names("text")
EMBED_ARCHS = names("embed")
# a mixture layer's routed experts, as GGUF names them (weights, gpt-oss's biases, Gemma 4's
# scales): what --n-cpu-moe keeps on the CPU (the shared experts, ``_shexp``, are not these)
_EXPERTS = re.compile(r"^blk\.(\d+)\.ffn_(?:gate|up|down|gate_up)_exps\.")
_ENDS = re.compile(r"^(?:token_embd|output)\.weight$")


@dataclass(slots=True)
class ModelInfo:
    """The served model's facts; ``prompt`` is the engine's (set once the model is loaded)."""

    model_id: str
    path: Path
    architecture: str
    n_ctx: int
    n_vocab: int
    n_params: int
    file_size: int
    created: int
    quantization: str = ""
    prompt: PromptFormat | None = None
    kv_dims: tuple[int, int, int] = (0, 0, 0)  # layers, KV heads, head size (memory planning)
    license: str = ""  # the file's general.license (Ollama's LICENSE / /api/create license)
    # bytes of each layer's routed experts in memory, by layer index (memory planning:
    # --n-cpu-moe keeps the first layers' on the CPU); () for a model without experts
    expert_bytes: tuple[int, ...] = ()
    # bytes of the embedding table and the output head (a split's GPU part holds both)
    ends_bytes: int = 0

    @property
    def generates(self) -> bool:
        return self.architecture in TEXT_ARCHS

    @property
    def embeds(self) -> bool:
        return self.architecture in EMBED_ARCHS

    @property
    def chat_template(self) -> str | None:
        return self.prompt.template if self.prompt is not None else None

    def capabilities(self) -> list[str]:
        caps = []
        if self.generates:
            caps += ["completion", "chat", "tools"]
        if self.embeds:
            caps.append("embedding")
        if self.architecture == "mlp":
            caps.append("infer")
        return caps

    def fmt(self) -> PromptFormat:
        """The engine's prompt format (tokenizer, template, defaults); 400 without one."""
        if self.prompt is None:
            raise TokenizerError(
                f"model {self.model_id!r} has no tokenizer; this endpoint needs one"
            )
        return self.prompt

    def tok(self) -> Tokenizer:
        return self.fmt().tokenizer


def quant_level(art: Artifact) -> str:
    """The type most of the weights are stored in, as Ollama names it (``Q4_1``, ``F16``), or
    the llama-quantize mix the model was packed with (``Q4_K_M``, as llama-quantize's file
    type)."""
    if art.manifest.pack.quantize in MIXES:
        return art.manifest.pack.quantize.upper()
    counts = by_dtype(art)
    return next(iter(counts)).upper() if counts else "-"


def expert_bytes(tensors: Iterable[TensorEntry], n_layer: int) -> tuple[int, ...]:
    """The bytes in memory (``nbytes``: uncompressed, as a device holds them) of each
    layer's routed experts (``blk.{i}.ffn_{gate,up,down,gate_up}_exps.*``), by layer index
    (at least ``n_layer`` of them); () when there are none."""
    found: dict[int, int] = {}
    for e in tensors:
        if (m := _EXPERTS.match(e.name)) is not None:
            i = int(m.group(1))
            found[i] = found.get(i, 0) + e.nbytes
    if not found:
        return ()
    return tuple(found.get(i, 0) for i in range(max(n_layer, max(found) + 1)))


def ends_bytes(tensors: Iterable[TensorEntry]) -> int:
    """The bytes in memory of the embedding table and the output head (``token_embd.*``,
    ``output.*``: one tensor when the head is tied to the table)."""
    return sum(e.nbytes for e in tensors if _ENDS.match(e.name))


def load_model_info(path: Path, model_id: str) -> ModelInfo:
    """Read the manifest of a ``.modelc`` file (no weights are read)."""
    art = open_artifact(path)
    try:
        m = art.manifest
        n_params = art.n_params
        quantization = quant_level(art)
        license_ = m.metadata.get("general.license")
        experts = expert_bytes(m.tensors, m.hparams.n_layer)
        ends = ends_bytes(m.tensors)
    finally:
        art.close()
    spec, hp = m.tokenizer, m.hparams
    st = path.stat()
    return ModelInfo(
        model_id=model_id,
        path=path,
        architecture=m.architecture,
        n_ctx=m.hparams.n_ctx or 2048,
        n_vocab=m.hparams.n_vocab or (len(spec.tokens) if spec else 0),
        n_params=n_params,
        file_size=st.st_size,
        created=int(st.st_mtime),
        quantization=quantization,
        kv_dims=(
            hp.n_layer,
            hp.n_head_kv or hp.n_head,
            hp.head_dim or hp.n_embd // (hp.n_head or 1),
        ),
        license=license_ if isinstance(license_, str) else "",
        expert_bytes=experts,
        ends_bytes=ends,
    )


@dataclass(slots=True)
class ServerState:
    """Shared by every handler: the served models and the server's settings."""

    models: ModelRegistry
    api_key: str | None = None
    rate_limit: int = 0  # requests per minute per client address; 0 = off
    max_concurrent: int = 0
    lora_dirs: list[Path] = field(default_factory=list)
    lora_loaded: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    ping_interval: float = 10.0
    cors_origins: list[str] = field(default_factory=list)  # allowed origins; "*": any
    allow_image_urls: bool = False  # --allow-image-urls: fetch http(s) image URLs
    reasoning_budget: int = -1  # --reasoning-budget: a request's default (-1: none)
    reasoning_budget_message: str = ""  # --reasoning-budget-message
    draining: bool = False
