"""modelc: a model compiler and local inference server."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
