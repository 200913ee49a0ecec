"""Goldens of the tiny SmolLM3 (``tests/gen_smollm3.py``); see ``scripts/tiny_goldens.py``.

/root/.cache/modelc-ref-venv/bin/python -m scripts.make_tiny_smollm3
"""

from scripts.tiny_goldens import goldens

if __name__ == "__main__":
    goldens("smollm3")
