"""The family registry, now :mod:`modelc.families.registry` (kept for the runtime's callers)."""

from __future__ import annotations

from modelc.families.registry import FAMILIES, by_gguf_name, family, names

__all__ = ["FAMILIES", "by_gguf_name", "family", "names"]
