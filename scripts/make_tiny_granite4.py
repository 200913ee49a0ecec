"""Goldens of the tiny Granite 4.0-H (``tests/gen_granite4.py``); see
``scripts/tiny_goldens.py``.

/root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_granite4
"""

from scripts.tiny_goldens import goldens

if __name__ == "__main__":
    goldens("granite4")
