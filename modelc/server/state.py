"""What the app knows about the served model, and the engine once it is running.

:class:`ServerState` is created before the model is loaded (``/health`` answers 503
while :attr:`ServerState.engine` is None); :func:`load_model_info` reads the
artifact's manifest (tokenizer, chat template, sizes) without touching the weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from modelc.artifact import open_artifact
from modelc.engine.api import Engine
from modelc.errors import ModelNotFoundError, TokenizerError
from modelc.runtime.prompt import PromptFormat
from modelc.runtime.tokenizer import Tokenizer
from modelc.server.errors import LoadingError, ParamError

TEXT_ARCHS = ("llama", "gpt2")
EMBED_ARCHS = ("bert",)


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


def load_model_info(path: Path, model_id: str) -> ModelInfo:
    """Read the manifest of a ``.modelc`` file (no weights are read)."""
    art = open_artifact(path)
    try:
        m = art.manifest
        n_params = art.n_params
    finally:
        art.close()
    spec = m.tokenizer
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
        quantization=str(m.pack.quantize or m.source.format),
    )


@dataclass(slots=True)
class ServerState:
    """Shared by every handler; ``engine`` is None while the model loads."""

    model_arg: str
    info: ModelInfo | None = None
    engine: Engine | None = None
    api_key: str | None = None
    rate_limit: int = 0  # requests per minute per client address; 0 = off
    max_concurrent: int = 0
    lora_dirs: list[Path] = field(default_factory=list)
    lora_loaded: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    ping_interval: float = 10.0
    draining: bool = False

    def ready(self) -> tuple[ModelInfo, Engine]:
        if self.info is None or self.engine is None:
            raise LoadingError("the model is still loading; retry in a moment (see /health)")
        return self.info, self.engine

    def model(self) -> ModelInfo:
        if self.info is None:
            raise LoadingError("the model is still loading; retry in a moment (see /health)")
        return self.info

    def serve(
        self, requested: str | None, need: Literal["text", "embed"]
    ) -> tuple[ModelInfo, Engine]:
        """The loaded model and engine for a generation or embedding endpoint.

        503 while loading, 404 if ``requested`` names another model, 400 if the model
        cannot do what the endpoint ``need``s (generate text, or embed).
        """
        info, engine = self.ready()
        self.check_model(requested)
        if need == "text" and not info.generates:
            raise ParamError(
                f"model {info.model_id!r} is a {info.architecture} model and does not generate "
                "text; serve a llama or gpt2 model (e.g. smollm2-135m) for this endpoint",
                param="model",
            )
        if need == "embed" and not info.embeds:
            raise ParamError(
                f"model {info.model_id!r} is a {info.architecture} model; embeddings need an "
                "embedding model (serve e.g. minilm-l6)",
                param="model",
            )
        return info, engine

    def check_model(self, requested: str | None) -> ModelInfo:
        """The loaded model, if ``requested`` names it (or is empty)."""
        info = self.model()
        if requested and requested not in self.aliases(info):
            raise ModelNotFoundError(
                f"the model {requested!r} is not served here; this server serves "
                f"{info.model_id!r} (see /v1/models)"
            )
        return info

    def aliases(self, info: ModelInfo) -> set[str]:
        a = {info.model_id, self.model_arg, info.path.name, info.path.stem, str(info.path)}
        if ":" in info.model_id:
            a.add(info.model_id.split(":", 1)[0])
        else:
            a.add(f"{info.model_id}:latest")
        return a
