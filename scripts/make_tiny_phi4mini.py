"""Goldens of the tiny Phi-4-mini (``tests/gen_phi4mini.py``); see ``scripts/tiny_goldens.py``.

/root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_phi4mini
"""

from scripts.tiny_goldens import goldens

if __name__ == "__main__":
    goldens("phi4mini")
