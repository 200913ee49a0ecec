"""The tiny Granite 4.0-H with mixtures (``tests/gen_granite4.py``'s ``granite4moe``),
under the module name ``scripts/tiny_goldens.py`` imports.  ``python -m tests.gen_granite4moe``.
"""

from __future__ import annotations

from pathlib import Path

from tests.gen_granite4 import ensure_model as _ensure


def ensure_model() -> tuple[Path, Path]:
    return _ensure("granite4moe")


if __name__ == "__main__":
    print(*ensure_model())
