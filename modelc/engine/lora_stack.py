"""The LoRA adapters merged into a model's weights (the scheduler swaps them between steps)."""

from __future__ import annotations

from modelc.errors import UsageError
from modelc.runtime.lora import AppliedLora, LoraAdapter, apply_adapter, remove_adapter
from modelc.runtime.model import EmbeddingModel, LanguageModel


class LoraStack:
    """The LoRA adapters merged into a model's weights, oldest first."""

    def __init__(self, model: LanguageModel | EmbeddingModel) -> None:
        self.model = model
        self.applied: list[AppliedLora] = []

    def apply(self, adapter: LoraAdapter) -> None:
        self.applied.append(apply_adapter(self.model, adapter))

    def remove(self, path: str | None = None) -> None:
        """Remove one adapter (by path) or all of them; base weights come back exactly."""
        keep = [a for a in self.applied if path is not None and a.adapter.path != path]
        if path is not None and len(keep) == len(self.applied):
            raise UsageError(f"no adapter {path} is loaded")
        # stacked adapters come off in reverse order: take off everything above the
        # target too, then put the kept ones back on
        for applied in reversed(self.applied):
            remove_adapter(self.model, applied)
        self.applied = []
        for applied in keep:
            self.apply(applied.adapter)

    @property
    def salt(self) -> bytes:
        """What the prefix cache keys on: KV computed under other weights is not shared."""
        return b"lora:" + ",".join(f"{a.adapter.path}@{id(a)}" for a in self.applied).encode()
