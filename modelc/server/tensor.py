"""Serving a tensor model (MLP, ONNX plan) for ``/infer``: arrays in, arrays out.

The engine schedules token generation and embeddings; a tensor model has neither, so
``modelc run`` wraps it in :class:`TensorEngine`, which has the engine's shape (``run``,
``submit``, ``embed``, ``stats``) and adds ``infer``.  One batch runs at a time, in a
worker thread, so the event loop keeps serving.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import trio

from modelc.engine.api import EngineStats, GenerationRequest, RequestHandle
from modelc.errors import UsageError
from modelc.runtime.model import TensorModel
from modelc.runtime.prompt import PromptFormat
from modelc.vision import VisionModel


class TensorEngine:
    def __init__(self, model: TensorModel, model_name: str) -> None:
        self.model = model
        self.model_name = model_name
        self.architecture = model.architecture
        self.prompt: PromptFormat | None = None  # no text in or out
        self.vision: VisionModel | None = None  # no images either
        self._lock = trio.Lock()
        self._stats = EngineStats()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()

    def submit(self, req: GenerationRequest) -> RequestHandle:
        raise UsageError(f"{self.model_name} is a {self.architecture} tensor model; use /infer")

    async def embed(
        self, batch: Sequence[Sequence[int]], *, normalize: bool | None = None
    ) -> np.ndarray[Any, Any]:
        raise UsageError(f"{self.model_name} is a {self.architecture} tensor model; use /infer")

    def stats(self) -> EngineStats:
        return self._stats

    async def infer(
        self, x: np.ndarray[Any, Any], input_name: str | None = None
    ) -> np.ndarray[Any, Any]:
        """x (batch, n_in) -> (batch, n_out): the model's first output."""
        name = input_name or "input"
        async with self._lock:
            self._stats.running = 1
            try:
                out = await trio.to_thread.run_sync(self.model.run, {name: x})
            finally:
                self._stats.running = 0
            self._stats.steps += 1
            self._stats.last_batch_size = int(x.shape[0])
        return next(iter(out.values()))
