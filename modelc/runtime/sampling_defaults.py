"""Sampling defaults (:class:`SamplingDefaults`): a request's value, else the model's
recommendation (GGUF ``general.sampling.*``, HF ``generation_config.json``), else the
server's configuration, else llama-server's defaults."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modelc.errors import UsageError
from modelc.runtime.sampling import FURTHER_SAMPLERS, SamplingParams

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "LLAMA_SERVER_DEFAULTS",
    "SAMPLING_FIELDS",
    "SamplingDefaults",
    "model_sampling",
]

# llama-server's defaults (common/common.h, common_params_sampling)
LLAMA_SERVER_DEFAULTS: dict[str, float | int] = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "repetition_penalty": 1.0,
    "repeat_last_n": 64,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
SAMPLING_FIELDS = tuple(LLAMA_SERVER_DEFAULTS)
DEFAULT_MAX_TOKENS = 4096  # a request without max_tokens stops at end of turn or here
# GGUF general.sampling.* keys -> SamplingParams fields
GGUF_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
    "general.sampling.penalty_last_n": "repeat_last_n",
}
_VALID: dict[str, Any] = {
    "temperature": lambda v: 0 <= v <= 10,
    "top_k": lambda v: v >= 0 and float(v).is_integer(),
    "top_p": lambda v: 0 < v <= 1,
    "min_p": lambda v: 0 <= v <= 1,
    "repetition_penalty": lambda v: 0 < v <= 10,
    "repeat_last_n": lambda v: v >= 0 and float(v).is_integer(),
    "presence_penalty": lambda v: -2 <= v <= 2,
    "frequency_penalty": lambda v: -2 <= v <= 2,
}
_INTEGER = {"top_k", "repeat_last_n"}


def _clean(values: Mapping[str, Any]) -> dict[str, float | int]:
    """The valid sampling settings among ``values`` (others are ignored)."""
    out: dict[str, float | int] = {}
    for k, v in values.items():
        if k not in _VALID or isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if v != v or not _VALID[k](v):  # NaN or out of range
            continue
        out[k] = int(v) if k in _INTEGER else float(v)
    return out


def model_sampling(generation: Mapping[str, Any], metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A model's own sampling recommendation: ``generation`` (HF generation_config values,
    or what a GGUF reader put there) and any GGUF ``general.sampling.*`` metadata."""
    found = {GGUF_SAMPLING_KEYS[k]: v for k, v in metadata.items() if k in GGUF_SAMPLING_KEYS}
    found.update(generation)
    return _clean(found)


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """The sampling settings a request gets for the fields it leaves out.

    ``values`` holds every field of :data:`SAMPLING_FIELDS`; ``origin`` says where each
    came from (``model``, ``config`` or ``llama-server``).  ``max_tokens`` caps a request
    that gives no limit of its own (it still stops at the end of its turn).
    """

    values: Mapping[str, float | int]
    origin: Mapping[str, str]
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()  # stop strings every request gets (a Modelfile's PARAMETER stop)

    @classmethod
    def resolve(
        cls,
        model: Mapping[str, Any] | None = None,
        config: Mapping[str, Any] | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        stop: Sequence[str] = (),
    ) -> SamplingDefaults:
        """Model recommendation over the server's config over llama-server's defaults."""
        values: dict[str, float | int] = dict(LLAMA_SERVER_DEFAULTS)
        origin = dict.fromkeys(values, "llama-server")
        for name, layer in (("config", _clean(config or {})), ("model", _clean(model or {}))):
            values.update(layer)
            origin.update(dict.fromkeys(layer, name))
        if max_tokens < 1:
            raise UsageError(f"the default max_tokens must be at least 1, got {max_tokens}")
        return cls(values, origin, max_tokens, tuple(s for s in stop if s))

    def params(
        self,
        given: Mapping[str, Any] | None = None,
        *,
        max_tokens: int | None = None,
        stop: Sequence[str] = (),
        stop_token_ids: Iterable[int] = (),
        logit_bias: Mapping[int, float] | None = None,
        seed: int | None = None,
        logprobs: int | None = None,
    ) -> SamplingParams:
        """SamplingParams from a request's ``given`` settings (None or absent: the default).

        ``max_tokens`` None means: until the end of the turn, at most ``self.max_tokens``.
        """
        g = given or {}
        vals = {k: (g[k] if g.get(k) is not None else self.values[k]) for k in SAMPLING_FIELDS}
        further = {k: g[k] for k in FURTHER_SAMPLERS if g.get(k) is not None}
        return SamplingParams(
            temperature=float(vals["temperature"]),
            top_k=int(vals["top_k"]),
            top_p=float(vals["top_p"]),
            min_p=float(vals["min_p"]),
            repetition_penalty=float(vals["repetition_penalty"]),
            repeat_last_n=int(vals["repeat_last_n"]),
            presence_penalty=float(vals["presence_penalty"]),
            frequency_penalty=float(vals["frequency_penalty"]),
            logit_bias=dict(logit_bias or {}),
            seed=seed,
            logprobs=logprobs,
            max_tokens=max_tokens,
            stop=[s for s in (*self.stop, *stop) if s],
            stop_token_ids=list(stop_token_ids),
            **further,
        )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.values, "max_tokens": self.max_tokens}
        if self.stop:
            out["stop"] = list(self.stop)
        return out
